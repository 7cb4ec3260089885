"""llmcore.checkpoint against an independent peer: a randomly initialised transformers GPT-2 (nothing
downloaded) saved with save_pretrained, loaded by llmcore.load_gpt2, gives the same logits and the
same greedy generations; save_gpt2 writes what transformers reads back; every broken checkpoint
gets a message that names the file and the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmcore import generate, load_gpt2, reference, save_gpt2
from llmcore.model import GPT, GPTConfig

transformers = pytest.importorskip("transformers", reason="transformers is the test-only GPT-2 peer")

PEERS = {
    # every size distinct: v = 61, positions = 40, d = 24, h = 3 (d_head = 8), L = 2
    "plain": dict(vocab_size=61, n_positions=40, n_embd=24, n_head=3, n_layer=2),
    # f != 4 d (n_inner), more heads, another eps, three layers
    "n_inner": dict(vocab_size=53, n_positions=32, n_embd=20, n_head=5, n_layer=3, n_inner=36,
                    layer_norm_epsilon=1e-6),
}


def hf_gpt2(fields: dict, seed: int = 0):
    """A transformers GPT2LMHeadModel with random O(1) weights (biases and norm parameters too,
    which its own init leaves at 0 and 1), in eval mode, using its eager (non-SDPA) attention."""
    config = transformers.GPT2Config(**fields, bos_token_id=None, eos_token_id=None,
                                     attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.3
            p.copy_(1.0 + noise if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
                    else noise)
    return model


@pytest.fixture(scope="module")
def saved_peers(tmp_path_factory) -> dict:
    """Each peer, built and saved once per module: name -> (transformers model, its directory)."""
    peers = {}
    for name, fields in PEERS.items():
        model = hf_gpt2(fields)
        path = tmp_path_factory.mktemp(f"hf_{name}")
        model.save_pretrained(path)
        peers[name] = model, path
    return peers


@pytest.fixture(params=sorted(PEERS))
def peer(request, saved_peers):
    """(transformers model, the directory it was saved to), for each peer in turn."""
    return saved_peers[request.param]


def prompts(vocab_size: int, b: int = 3, n: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab_size, (b, n), generator=torch.Generator().manual_seed(seed))


def test_saved_checkpoint_is_in_the_hugging_face_layout(peer):
    _, path = peer
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert "transformer.h.0.attn.c_attn.weight" in load_file(path / "model.safetensors")


def test_loaded_model_gives_the_peers_logits(peer):
    hf, path = peer
    model = load_gpt2(path)
    config = hf.config
    assert model.config == GPTConfig(vocab_size=config.vocab_size, max_seq_len=config.n_positions,
                                     d_model=config.n_embd, n_heads=config.n_head,
                                     n_layers=config.n_layer, d_ff=config.n_inner,
                                     ln_eps=config.layer_norm_epsilon)
    assert not model.training
    tokens = prompts(config.vocab_size, b=3, n=config.n_positions)     # the full context
    with torch.no_grad():
        want = hf(tokens).logits
    got = model(tokens)
    assert got.shape == want.shape == (3, config.n_positions, config.vocab_size)
    assert want.std() > 1.0                               # logits spread out: a real comparison
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_loaded_model_equals_the_numpy_reference(peer):
    hf, path = peer
    model = load_gpt2(path, dtype=torch.float64)
    assert model.dtype == torch.float64
    tokens = prompts(hf.config.vocab_size)
    want = reference.gpt_forward(model.state_dict(), tokens.numpy(), n_heads=hf.config.n_head,
                                 eps=hf.config.layer_norm_epsilon)
    torch.testing.assert_close(model(tokens), torch.from_numpy(want), rtol=1e-9, atol=1e-9)


def test_greedy_generation_matches_the_peer(peer):
    hf, path = peer
    model = load_gpt2(path)
    ids = prompts(hf.config.vocab_size, b=3, n=5)
    new = 16
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                       do_sample=False, pad_token_id=0)
    assert want.shape == (3, 5 + new)
    for use_cache in (False, True):
        got = generate(model, ids, new, use_cache=use_cache)
        assert torch.equal(got, want), f"use_cache={use_cache}"


def test_save_gpt2_is_read_back_by_transformers_and_by_load_gpt2(tmp_path):
    config = GPTConfig(vocab_size=47, max_seq_len=30, d_model=18, n_heads=3, n_layers=2, d_ff=28,
                       ln_eps=1e-6)
    model = GPT(config, seed=5)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    save_gpt2(model, tmp_path / "ckpt")
    tokens = prompts(config.vocab_size, b=2, n=11)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ckpt").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=1e-5, atol=1e-5)
    again = load_gpt2(tmp_path / "ckpt")
    assert again.config == config
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name


def test_the_original_hub_layout_also_loads(peer, tmp_path):
    """GPT-2's own files name tensors without 'transformer.', carry the precomputed causal-mask
    buffers (h.N.attn.bias), and may repeat the tied lm_head.weight."""
    hf, path = peer
    tensors = {name.removeprefix("transformer."): t
               for name, t in load_file(path / "model.safetensors").items()}
    n = hf.config.n_positions
    for layer in range(hf.config.n_layer):
        tensors[f"h.{layer}.attn.bias"] = torch.ones(1, 1, n, n).tril()
        tensors[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    tensors["lm_head.weight"] = tensors["wte.weight"].clone()
    shutil.copy(path / "config.json", tmp_path / "config.json")
    save_file(tensors, tmp_path / "model.safetensors")
    tokens = prompts(hf.config.vocab_size)
    torch.testing.assert_close(load_gpt2(tmp_path)(tokens), load_gpt2(path)(tokens), rtol=0, atol=0)


def test_load_gpt2_puts_the_weights_on_the_device_asked_for(peer, device):
    hf, path = peer
    model = load_gpt2(path, device=device)
    assert model.device.type == device.type
    assert {p.device.type for p in model.parameters()} == {device.type}
    tokens = prompts(hf.config.vocab_size)
    torch.testing.assert_close(model(tokens.to(device)).cpu(), load_gpt2(path)(tokens),
                               rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- broken checkpoints

@pytest.fixture
def ckpt(saved_peers, tmp_path) -> Path:
    """A fresh, writable copy of the plain peer's checkpoint (d = 24, L = 2, f = 96, 40 positions)."""
    _, path = saved_peers["plain"]
    target = tmp_path / "ckpt"
    shutil.copytree(path, target)
    return target


def edit_config(path: Path, **changes) -> None:
    fields = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    (path / "config.json").write_text(json.dumps(fields))


def edit_tensors(path: Path, drop: tuple[str, ...] = (), **replace) -> None:
    tensors = load_file(path / "model.safetensors")
    for name in drop:
        del tensors[name]
    tensors.update(replace)
    save_file(tensors, path / "model.safetensors")


def test_a_missing_tensor_is_named(ckpt):
    edit_tensors(ckpt, drop=("transformer.h.1.mlp.c_fc.bias",))
    with pytest.raises(ValueError, match=r"model\.safetensors: missing 1 tensor\(s\) the config "
                                         r"needs: h\.1\.mlp\.c_fc\.bias"):
        load_gpt2(ckpt)


@pytest.mark.parametrize("changes, message", [
    (dict(n_layer=None), r"config\.json: missing GPT-2 field\(s\) n_layer"),
    (dict(activation_function="relu"), "activation_function = 'relu' is not supported"),
    (dict(scale_attn_weights=False), "scale_attn_weights = False is not supported"),
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx = True is not supported"),
    (dict(reorder_and_upcast_attn=True), "reorder_and_upcast_attn = True is not supported"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings = False is not supported"),
    (dict(n_head=7), r"config\.json: n_heads = 7 must be positive and divide d_model"),
])
def test_config_json_that_llmcore_cannot_honour_is_refused(ckpt, changes, message):
    edit_config(ckpt, **changes)
    with pytest.raises(ValueError, match=message):
        load_gpt2(ckpt)


@pytest.mark.parametrize("changes, message", [
    (dict(n_layer=3), r"missing \d+ tensor\(s\) the config needs: h\.2\."),
    (dict(n_layer=1), r"tensors this GPT-2 config does not use: h\.1\..*does config\.json's n_layer match"),
    (dict(n_embd=30), r"has shape \(\d+, 24\), but config\.json implies \(\d+, 30\)"),
    (dict(vocab_size=60), r"wte\.weight has shape \(\d+, 24\), but config\.json implies \(60, 24\)"),
    (dict(n_positions=41), r"wpe\.weight has shape \(40, 24\), but config\.json implies \(41, 24\)"),
    (dict(n_inner=100), r"mlp\.c_fc\.weight has shape \(24, 96\), but config\.json implies \(24, 100\)"),
])
def test_config_json_that_disagrees_with_the_tensors_is_refused(ckpt, changes, message):
    edit_config(ckpt, **changes)
    with pytest.raises(ValueError, match=message):
        load_gpt2(ckpt)


def test_an_untied_lm_head_is_refused(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    edit_tensors(ckpt, **{"lm_head.weight": tensors["transformer.wte.weight"] + 1.0})
    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
        load_gpt2(ckpt)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_damaged_safetensors_file_is_refused(ckpt, damage):
    file = ckpt / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00\x13not safetensors" * 50,
                      "empty": b""}[damage])
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file, it "
                                         r"may be truncated or corrupted"):
        load_gpt2(ckpt)


@pytest.mark.parametrize("content, message", [
    ("{not json", r"config\.json: not valid JSON"),
    ("[1, 2]", r"config\.json: expected a JSON object, got list"),
])
def test_an_unreadable_config_json_is_refused(ckpt, content, message):
    (ckpt / "config.json").write_text(content)
    with pytest.raises(ValueError, match=message):
        load_gpt2(ckpt)


def test_missing_files_are_named(ckpt, tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory .*nowhere does not exist"):
        load_gpt2(tmp_path / "nowhere")
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors in .*ckpt$"):
        load_gpt2(ckpt)
    (ckpt / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"sharded checkpoints are not supported"):
        load_gpt2(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no config\.json in .*ckpt \(expected a GPT-2 "
                                                r"checkpoint directory with config\.json and "
                                                r"model\.safetensors\)"):
        load_gpt2(ckpt)


def test_grouped_query_models_cannot_be_saved_as_gpt2(tmp_path):
    model = GPT(GPTConfig(d_model=24, n_heads=4, n_kv_heads=2), device="meta")
    with pytest.raises(ValueError, match="GPT-2's format has no grouped-query attention"):
        save_gpt2(model, tmp_path)
    assert not (tmp_path / "config.json").exists()
