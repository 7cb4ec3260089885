"""Reading and writing GPT-2 checkpoints in the Hugging Face layout, offline.

A checkpoint is a directory with ``config.json`` (GPT-2's field names: n_embd, n_head, n_layer,
n_positions, vocab_size, layer_norm_epsilon) and ``model.safetensors``. GPT-2 stores its
projections as (d_in, d_out) matrices applied as ``x @ w``, the same convention as this course,
so loading is renaming, never transposing. Nothing here touches the network. Chapter 5.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .model import GPT, GPTConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

# llmcore's parameter names -> GPT-2's. Per block:
BLOCK_NAMES = {
    "ln_1.scale": "ln_1.weight",
    "ln_1.shift": "ln_1.bias",
    "attention.w_qkv": "attn.c_attn.weight",
    "attention.b_qkv": "attn.c_attn.bias",
    "attention.w_o": "attn.c_proj.weight",
    "attention.b_o": "attn.c_proj.bias",
    "ln_2.scale": "ln_2.weight",
    "ln_2.shift": "ln_2.bias",
    "ffn.w_up": "mlp.c_fc.weight",
    "ffn.b_up": "mlp.c_fc.bias",
    "ffn.w_down": "mlp.c_proj.weight",
    "ffn.b_down": "mlp.c_proj.bias",
}
TOP_NAMES = {
    "token_embedding": "wte.weight",
    "position_embedding": "wpe.weight",
    "ln_f.scale": "ln_f.weight",
    "ln_f.shift": "ln_f.bias",
}
# Buffers some GPT-2 files carry (the causal mask, precomputed): not weights, safe to skip.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
# GPT-2 variants this code does not implement; a file that sets them differently is refused.
REQUIRED_SETTINGS = {
    "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    "reorder_and_upcast_attn": (False,),
    "tie_word_embeddings": (True,),
}


def gpt2_names(config: GPTConfig) -> dict[str, str]:
    """Every llmcore parameter name -> its GPT-2 name (without the ``transformer.`` prefix)."""
    names = dict(TOP_NAMES)
    for layer in range(config.n_layers):
        for ours, theirs in BLOCK_NAMES.items():
            names[f"blocks.{layer}.{ours}"] = f"h.{layer}.{theirs}"
    return names


def config_from_gpt2(fields: dict, source: str = CONFIG_FILE) -> GPTConfig:
    """GPT-2's config.json fields -> :class:`GPTConfig`, refusing variants not implemented."""
    missing = [k for k in ("n_embd", "n_head", "n_layer", "n_positions", "vocab_size")
               if k not in fields]
    if missing:
        raise ValueError(f"{source}: missing GPT-2 field(s) {', '.join(missing)}")
    for key, allowed in REQUIRED_SETTINGS.items():
        if key in fields and fields[key] not in allowed:
            raise ValueError(f"{source}: {key} = {fields[key]!r} is not supported "
                             f"(llmcore implements {allowed[0]!r})")
    try:
        return GPTConfig(vocab_size=fields["vocab_size"], max_seq_len=fields["n_positions"],
                         d_model=fields["n_embd"], n_heads=fields["n_head"],
                         n_layers=fields["n_layer"], d_ff=fields.get("n_inner"),
                         ln_eps=fields.get("layer_norm_epsilon", 1e-5))
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def config_to_gpt2(config: GPTConfig) -> dict:
    """:class:`GPTConfig` -> the fields of a GPT-2 config.json that transformers can read."""
    if config.kv_heads != config.n_heads:
        raise ValueError("GPT-2's format has no grouped-query attention: n_kv_heads must equal "
                         f"n_heads, got {config.kv_heads} and {config.n_heads}")
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.max_seq_len,
        "n_embd": config.d_model, "n_head": config.n_heads, "n_layer": config.n_layers,
        "n_inner": config.d_ff, "layer_norm_epsilon": config.ln_eps,
        "activation_function": "gelu_new", "tie_word_embeddings": True,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "bos_token_id": None, "eos_token_id": None,
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
    }


def read_config(path: str | Path) -> GPTConfig:
    """The :class:`GPTConfig` of a checkpoint directory."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path} (expected a GPT-2 checkpoint "
                                f"directory with {CONFIG_FILE} and {WEIGHTS_FILE})")
    return config_from_gpt2(read_json_object(file), str(file))


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as hex: how a shipped checkpoint's weights are recorded."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_json_object(file: Path) -> dict:
    """A JSON file that must hold one object; a clear ValueError naming the file otherwise."""
    try:
        fields = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(fields).__name__}")
    return fields


def read_tensors(path: str | Path, device=None) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors`` with any ``transformer.`` prefix removed."""
    file = Path(path) / WEIGHTS_FILE
    if not file.is_file():
        extra = " (sharded checkpoints are not supported)" \
            if (Path(path) / f"{WEIGHTS_FILE}.index.json").exists() else ""
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in {path}{extra}")
    try:
        tensors = load_file(str(file), device=str(device) if device is not None else "cpu")
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise ValueError(f"{file}: not a readable safetensors file, it may be truncated or "
                         f"corrupted ({err})") from None
    return {name.removeprefix("transformer."): t for name, t in tensors.items()}


def load_gpt2(path: str | Path, *, device=None, dtype: torch.dtype | None = None) -> GPT:
    """Load a GPT-2 checkpoint from a local directory into an llmcore :class:`GPT`.

    path: a directory with config.json and model.safetensors (Hugging Face's layout, e.g. what
    ``save_pretrained`` writes). device, dtype: where the weights go (default: CPU, as stored).
    Returns the model in eval mode; ``model(tokens)`` maps (b, n) ids to (b, n, v) logits.
    Chapter 5.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    config = read_config(path)
    tensors = read_tensors(path, device)
    names = gpt2_names(config)
    missing = sorted(theirs for theirs in names.values() if theirs not in tensors)
    if missing:
        raise ValueError(f"{path / WEIGHTS_FILE}: missing {len(missing)} tensor(s) the config "
                         f"needs: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    known = set(names.values()) | {"lm_head.weight"}
    unknown = sorted(k for k in tensors if k not in known and not k.endswith(IGNORED_SUFFIXES))
    if unknown:
        raise ValueError(f"{path / WEIGHTS_FILE}: tensors this GPT-2 config does not use: "
                         f"{', '.join(unknown[:6])} (does config.json's n_layer match?)")
    head = tensors.get("lm_head.weight")
    if head is not None and not torch.equal(head, tensors["wte.weight"]):
        raise ValueError(f"{path / WEIGHTS_FILE}: lm_head.weight differs from wte.weight; llmcore "
                         "ties the unembedding to the embedding")
    model = GPT(config, device="meta")
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    state = {}
    for ours, theirs in names.items():
        tensor = tensors[theirs]
        if tuple(tensor.shape) != expected[ours]:
            raise ValueError(f"{path / WEIGHTS_FILE}: {theirs} has shape {tuple(tensor.shape)}, "
                             f"but config.json implies {expected[ours]}")
        state[ours] = tensor if dtype is None else tensor.to(dtype)
    model.load_state_dict(state, assign=True)
    return model.eval()


def save_gpt2(model: GPT, path: str | Path) -> Path:
    """Write ``model`` as a GPT-2 checkpoint (config.json + model.safetensors) that both
    :func:`load_gpt2` and ``transformers.GPT2LMHeadModel.from_pretrained`` read."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fields = config_to_gpt2(model.config)
    state = {name: p.detach().contiguous() for name, p in model.named_parameters()}
    tensors = {f"transformer.{theirs}": state[ours].cpu()
               for ours, theirs in gpt2_names(model.config).items()}
    (path / CONFIG_FILE).write_text(json.dumps(fields, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    return path
