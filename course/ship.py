"""Shipping the course's model: train it, then write a model folder with everything a reader checks.

``python -m course.ship`` (``course-train``; ``make train``) reads the corpus
(:mod:`llmcore.corpus`), measures the unigram and bigram baselines, trains with
:func:`llmcore.train.train`, and writes into an output folder (default ``runs/<name>``)::

    config.json, model.safetensors   the checkpoint, GPT-2 layout (llmcore.load_gpt2 reads it)
    metrics.json                     every number measured: losses, baselines, timings, load
    loss_curve.png                   training and validation loss against the step
    validation_slice.txt             a fixed piece of validation text, scored in metrics.json
    MODEL_CARD.md, DATA_CARD.md      what the model is, what it was trained on, how well it does

``--ship`` writes into the package's own folder instead (``llmcore/pretrained/<name>/``), which
is how the shipped model was made.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

import llmcore.pretrained
from llmcore.checkpoint import WEIGHTS_FILE, load_gpt2, save_gpt2, sha256_file
from llmcore.corpus import (EXCLUDED_DIRS, EXCLUDED_PREFIXES, OTHER_LICENSE_MARKERS, Corpus,
                            load_corpus, ngram_bits_per_byte)
from llmcore.device import describe_machine, load_average, usable_cores
from llmcore.generate import generate
from llmcore.model import GPT
from llmcore.pretrained import DEFAULT_MODEL, METRICS_FILE
from llmcore.tokenizer import decode, encode_tensor
from llmcore.train import (TrainConfig, TrainHistory, evaluate_bits_per_byte, evaluation_windows,
                           train)

SLICE_FILE = "validation_slice.txt"
CURVE_FILE = "loss_curve.png"
MODEL_CARD_FILE = "MODEL_CARD.md"
DATA_CARD_FILE = "DATA_CARD.md"

MAX_WEIGHTS_BYTES = 7_900_000
"""The shipped checkpoint must stay under 8 MB; ``--weights-dtype auto`` halves it if needed."""

PROMPTS = ("def ", "import ", "class Parser:\n    def ", "    for i in range(",
           "if __name__ == ")
"""Prompts for the generations printed at the end of training and quoted in the model card."""



def save_checkpoint(model: GPT, folder: Path, dtype: torch.dtype) -> Path:
    """Write the checkpoint with its weights stored as ``dtype`` (float16 halves the file)."""
    stored = GPT(model.config, device="meta")
    stored.load_state_dict({k: v.detach().to(dtype) for k, v in model.state_dict().items()},
                           assign=True)
    return save_gpt2(stored, folder)


def generations(model: GPT, prompts=PROMPTS, *, max_new_tokens: int = 120,
                temperature: float = 0.8, top_k: int | None = None, seed: int = 0) -> list[dict]:
    """Greedy and sampled continuations of each prompt (decoded text), with the KV cache."""
    out = []
    for prompt in prompts:
        ids = encode_tensor(prompt, device=model.device)                      # (1, n)
        new = min(max_new_tokens, model.config.max_seq_len - ids.shape[1])
        greedy = generate(model, ids, new)
        sampled = generate(model, ids, new, temperature=temperature, top_k=top_k, seed=seed)
        out.append({"prompt": prompt, "greedy": decode(greedy[0, ids.shape[1]:]),
                    "sampled": decode(sampled[0, ids.shape[1]:]), "temperature": temperature,
                    "top_k": top_k, "seed": seed, "max_new_tokens": new})
    return out


def plot_loss_curve(history: TrainHistory, baselines: dict[str, float], path: Path,
                    title: str) -> None:
    """Training loss (each step and smoothed), validation loss and the baselines, in bits/byte."""
    from matplotlib.figure import Figure          # no pyplot: no global backend or state

    steps = range(1, len(history.train_bits) + 1)
    smooth, value = [], None
    for bits in history.train_bits:
        value = bits if value is None else 0.95 * value + 0.05 * bits
        smooth.append(value)
    fig = Figure(figsize=(7, 4.2), dpi=100)
    ax = fig.subplots()
    ax.plot(steps, history.train_bits, color="tab:blue", alpha=0.25, lw=0.8,
            label="training batch")
    ax.plot(steps, smooth, color="tab:blue", lw=1.6, label="training (smoothed)")
    ax.plot(history.eval_steps, history.eval_bits, "o-", color="tab:orange", ms=4,
            label="validation (windows of held-out files)")
    for (name, bits), style in zip(baselines.items(), (":", "--")):
        ax.axhline(bits, color="gray", ls=style, lw=1.2, label=f"{name} baseline {bits:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (bits per byte)")
    ax.set_ylim(0, max(6.0, min(9.0, max(history.train_bits[:5], default=6.0))))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)


def psf_license_text(root: Path) -> str | None:
    """The PSF License Agreement as the standard library's own LICENSE.txt states it, or None."""
    file = Path(root) / "LICENSE.txt"
    if not file.is_file():
        return None
    text = file.read_text(encoding="utf-8", errors="replace")
    start = text.find("PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2")
    end = text.find("BEOPEN.COM LICENSE AGREEMENT", start)
    return text[start:end].strip() if start >= 0 and end > start else None


def _numbers(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values) or "not available"


def _fence(text: str) -> str:
    return "```text\n" + text.replace("```", "`\u200b``") + "\n```"


def model_card(metrics: dict) -> str:
    """MODEL_CARD.md, written from the numbers in metrics.json."""
    m, t, c = metrics["model"], metrics["training"], metrics["corpus"]
    v, b, s = metrics["validation"], metrics["baselines"], metrics["fixed_slice"]
    lines = [
        f"# Model card: `{metrics['name']}`",
        "",
        "A small GPT that reads and writes Python source one byte at a time, trained with",
        "llmcore's own code (`python -m course.ship`) on the Python standard library. It is the",
        "model the course loads to show attention patterns, generation and the KV cache on",
        "weights that have learnt something. It is a teaching model: it writes plausible-looking",
        "Python, not working programs.",
        "",
        "```python",
        "from llmcore.pretrained import load_pretrained, load_tokenizer",
        "model = load_pretrained()          # llmcore.GPT, float32, eval mode, CPU",
        "```",
        "",
        "## Model",
        "",
        "| | |", "|---|---|",
        "| architecture | GPT-2 style decoder (llmcore.model.GPT): learned positions, pre-norm "
        "blocks, GELU FFN, tied embedding |",
        f"| layers L, d_model d, heads h, d_head | {m['n_layers']}, {m['d_model']}, "
        f"{m['n_heads']}, {m['d_model'] // m['n_heads']} |",
        f"| FFN width f | {4 * m['d_model']} |",
        f"| context (max_seq_len) | {m['max_seq_len']} bytes |",
        "| vocabulary v | 256 (one token per byte, `llmcore.tokenizer`) |",
        f"| parameters | {m['parameters']:,} |",
        f"| stored as | {metrics['weights_dtype']} in `model.safetensors` "
        f"({metrics['weights_bytes'] / 1e6:.2f} MB, Hugging Face GPT-2 layout); loaded as float32 |",
        "",
        "## Training",
        "",
        f"Data: the Python {c['python']} standard library, {c['train_files']} files "
        f"({c['train_bytes']:,} bytes) for training; {c['validation_files']} other files "
        f"({c['validation_bytes']:,} bytes) held out for validation. See DATA_CARD.md.",
        "",
        "| setting | value |", "|---|---|",
        f"| steps | {t['steps']} |",
        f"| batch | {t['batch_size']} windows of {m['max_seq_len']} + 1 bytes "
        f"({t['batch_size'] * m['max_seq_len']:,} predicted bytes per step) |",
        f"| bytes seen | {t['tokens_seen']:,} (about {t['tokens_seen'] / c['train_bytes']:.2f} "
        f"passes over the training text) |",
        f"| optimiser | AdamW, betas ({t['beta1']}, {t['beta2']}), weight decay "
        f"{t['weight_decay']} on matrices |",
        f"| learning rate | linear warm-up over {t['warmup_steps']} steps to {t['lr']}, cosine "
        f"decay to {t['lr'] * t['min_lr_ratio']:.2g} |",
        f"| gradient clipping | global norm {t['grad_clip']} |",
        f"| seed | {t['seed']} (weights and batches) |",
        "| precision | float32 |",
        f"| threads | {t['threads']}"
        + (f" (OMP_WAIT_POLICY={t['omp_wait_policy']})" if t.get("omp_wait_policy") else "")
        + " |",
        f"| machine | {t['machine']} |",
        f"| training time | {t['wall_seconds'] / 60:.1f} min wall clock, "
        f"{t['cpu_seconds'] / 60:.1f} min of CPU time |",
        f"| load average (1, 5, 15 min) | {_numbers(t['loadavg_start'])} at the start, "
        f"{_numbers(t['loadavg_end'])} at the end |",
        f"| whole command | {t['total_wall_seconds'] / 60:.1f} min wall clock (reading the "
        f"corpus, training, evaluating, writing) |",
        "",
    ]
    load = t["loadavg_start"]
    if load and max(load[0], t["loadavg_end"][0] if t["loadavg_end"] else 0) > t["threads"]:
        lines += ["The load average was above the number of threads: other work shared the",
                  "machine during this run, so its wall-clock time overstates what an idle",
                  "machine needs.", ""]
    if t.get("note"):
        lines += [t["note"], ""]
    defaults = TrainConfig().settings()
    if all(t[key] == value for key, value in defaults.items()):
        how = "`python -m course.ship` (its defaults are these settings)"
    else:
        how = f"`{t['command']}`"
    lines += [
        f"Reproduce it with {how}. With one thread (`--threads 1`) a run repeats bit for",
        "bit; with more, sums split across threads differ in their last bits from run to run,",
        "these differences grow over thousands of steps, and a second run ends with other",
        "weights whose validation loss is within a few percent of the one below.", ""]
    reruns = metrics.get("reproductions", [])  # later runs of the same settings, if recorded
    for number, rerun in enumerate(reruns, start=2):
        change = rerun["bits_per_byte"] / metrics["validation"]["bits_per_byte"] - 1
        lines += [
            f"Measured: run {number}, `{rerun['command']}` on {rerun['date']} "
            f"({rerun['threads']} threads"
            + (f", OMP_WAIT_POLICY={rerun['omp_wait_policy']}" if rerun["omp_wait_policy"]
               else ", OpenMP's default spinning threads")
            + f"; load average {_numbers(rerun['loadavg_start'])} at the start, "
            f"{_numbers(rerun['loadavg_end'])} at the end), trained in "
            f"{rerun['wall_seconds'] / 60:.1f} min and took {rerun['total_wall_seconds'] / 60:.1f}"
            f" min in all; its validation loss was {rerun['bits_per_byte']:.3f} bits/byte "
            f"({change:+.1%} against the shipped weights).", ""]
    lines += [
        "## Quality",
        "",
        "Cross-entropy of the next byte on the held-out files, in bits per byte (lower is",
        "better; 8 bits would be knowing nothing). The baselines are counted on the same",
        "training text and scored on the same validation text (add-one smoothing).",
        "",
        "| model | validation loss (bits/byte) |", "|---|---|",
        f"| unigram (byte frequencies) | {b['unigram_bits_per_byte']:.3f} |",
        f"| bigram (previous byte) | {b['bigram_bits_per_byte']:.3f} |",
        f"| **this model** | **{v['bits_per_byte']:.3f}** |",
        "",
        f"Scored on {v['bytes_scored']:,} validation bytes ({v['windows']} windows of "
        f"{m['max_seq_len']}; a byte early in a window sees less context), with the weights as "
        f"stored ({metrics['weights_dtype']}) loaded back as float32. The fixed slice "
        f"`{s['file']}` ({s['n_windows']} windows, {s['bytes']} bytes) scores "
        f"{s['bits_per_byte']:.4f} bits/byte; the tests recompute that number.",
        "",
        "![loss curve](loss_curve.png)",
        "",
        f"The validation points of the curve score {t['eval_windows']} windows spread evenly",
        "through the validation split (to keep training fast); the table scores all of it.",
        "",
        "## Generations",
        "",
        "Produced at the end of the training run from the stored weights, with",
        "`llmcore.generate` (KV cache on). Greedy picks the most likely byte each step; sampled",
        "draws from the softmax at the temperature given, with a fixed seed.",
        "",
    ]
    for g in metrics["generations"]:
        lines += [f"Prompt `{g['prompt']!r}`, greedy:", "", _fence(g["prompt"] + g["greedy"]), "",
                  f"sampled (temperature {g['temperature']}, seed {g['seed']}):", "",
                  _fence(g["prompt"] + g["sampled"]), ""]
    lines += [
        "## Limits",
        "",
        "- It has seen only Python source from one library; on other text it is a poor model.",
        "- It can reproduce fragments of the standard library verbatim (docstrings, license",
        "  headers, common idioms): treat its output as derived from PSF-licensed code.",
        "- Bytes, not characters: it can emit invalid UTF-8, which decodes to U+FFFD.",
        "",
        f"Made on {metrics['created']} with torch {t['torch']}, Python {t['python']}.",
        "",
    ]
    return "\n".join(lines)


def data_card(corpus: Corpus, summary: dict, name: str) -> str:
    """DATA_CARD.md: what the corpus is, how it was selected and split, and its license.
    summary: ``corpus.summary()``, already computed (it hashes every file)."""
    c = summary
    license_text = psf_license_text(corpus.root)
    capped = sum("cap" in reason for _, reason in corpus.skipped)
    lines = [
        f"# Data card: the training text of `{name}`",
        "",
        "## What it is",
        "",
        f"The `.py` source files of the Python {c['python']} standard library, as installed with",
        "the interpreter (no download). `llmcore.corpus.load_corpus()` found them through",
        "`sysconfig.get_paths()['stdlib']`, which on the machine that trained this model was",
        f"`{c['root']}`.",
        "",
        "| | files | bytes | SHA-256 of the concatenated bytes |", "|---|---|---|---|",
        f"| training | {c['train_files']} | {c['train_bytes']:,} | `{c['train_sha256'][:16]}...` |",
        f"| validation | {c['validation_files']} | {c['validation_bytes']:,} | "
        f"`{c['validation_sha256'][:16]}...` |",
        "",
        "## Selection (deterministic)",
        "",
        "- Every `*.py` file below the root, in sorted path order (not the order the file system",
        "  lists them).",
        f"- Left out: anything inside a directory named {', '.join(sorted(EXCLUDED_DIRS))} (test",
        "  suites, third-party packages, compiled files, generated codec tables and help text);",
        f"  names starting with {', '.join(EXCLUDED_PREFIXES)} (they describe how one particular",
        "  interpreter was built); files that are not valid UTF-8.",
        "- Left out: the files whose header carries a license notice of its own rather than only",
        f"  the PSF License (phrases such as {', '.join(repr(x) for x in OTHER_LICENSE_MARKERS)});",
        "  see the list below. This keeps the whole corpus under one license.",
        f"- A cap of {c['max_bytes']:,} bytes, applied in a fixed pseudo-random file order",
        f"  (here it left out {capped} file{'s' if capped != 1 else ''}).",
        "- Bytes are used exactly as stored; each file ends with a newline, and the files of a",
        "  split are concatenated in path order.",
        "",
        "## Split: by file",
        "",
        "A file is held out for validation when the SHA-256 of its relative path, read as a",
        f"fraction in [0, 1), is below {c['validation_fraction']}. The split depends on the path",
        "alone: the same file lands on the same side on every machine, and no byte of a",
        "validation file is trained on. Validation files:",
        "",
        ", ".join(f"`{p}`" for p in corpus.validation.files),
        "",
        f"Left out of both splits ({len(corpus.skipped)} files):",
        "",
    ]
    lines += [f"- `{path}`: {reason}" for path, reason in corpus.skipped] or ["- none"]
    lines += [
        "",
        "## License",
        "",
        "The standard library is distributed under the Python Software Foundation License",
        "Version 2 (PSF License), the first license stated in the interpreter's own",
        "`LICENSE.txt`. Its clause 2 grants a \"nonexclusive, royalty-free, world-wide license",
        "to reproduce, analyze, test, perform and/or display publicly, prepare derivative works,",
        "distribute, and otherwise use Python alone or in any derivative version\", on the",
        "condition that the PSF License Agreement and PSF's copyright notice are retained.",
        "Clause 3 asks a derivative work made available to others to include a brief summary of",
        "the changes made. So training a model on this text and shipping the model is allowed;",
        "treating the model as a derivative work, this card meets the two conditions:",
        "",
        "- Summary of changes: the files listed above were read unmodified, concatenated and",
        "  used to fit the weights of a neural network; no file of Python was changed or is",
        "  redistributed in full (`validation_slice.txt` is an excerpt of the validation files).",
        "- The PSF License Agreement and copyright notice, as the training machine's",
        "  `LICENSE.txt` states them, follow.",
        "",
        "Files in the standard library that carry another (permissive) notice were left out, as",
        "listed above. The PSF License covers the code; it grants no right to the PSF's",
        "trademarks (clause 7).",
        "",
    ]
    if license_text:
        lines += [_fence(license_text), ""]
    else:
        lines += [f"(`LICENSE.txt` was not found under {c['root']}; the agreement is published "
                  "at https://docs.python.org/3/license.html.)", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The command line.

def shipped_folder(name: str) -> Path:
    """Where ``--ship`` writes: the package's ``llmcore/pretrained/<name>/``."""
    return Path(llmcore.pretrained.__file__).resolve().parent / name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = TrainConfig().settings()
    parser = argparse.ArgumentParser(
        prog="python -m course.ship",
        description="Train the course's byte-level GPT on the Python standard library.")
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                            help="(default: %(default)s)")
    parser.add_argument("--name", default=DEFAULT_MODEL, help="model name (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: runs/<name>)")
    parser.add_argument("--ship", action="store_true",
                        help="write into the package's llmcore/pretrained/<name>/ instead")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: the cores this process may use)")
    parser.add_argument("--device", default="cpu", help="where to train (default: %(default)s)")
    parser.add_argument("--weights-dtype", choices=("auto", "float32", "float16", "bfloat16"),
                        default="auto", help="how the weights are stored; auto: float32 if "
                        "that fits in 8 MB, else float16 (default: %(default)s)")
    parser.add_argument("--validation-fraction", type=float, default=None,
                        help="share of files held out (default: llmcore.corpus's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--note", default="",
                        help="a paragraph for the model card's training section (e.g. how the "
                             "machine was shared)")
    args = parser.parse_args(argv)
    if args.ship and args.out is not None:
        parser.error("--ship and --out are exclusive: --ship writes into llmcore/pretrained/")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the whole pipeline of the module docstring; returns the metrics it wrote."""
    started = time.perf_counter()
    args = parse_args(argv)
    config = TrainConfig.from_settings(**{name: getattr(args, name)
                                          for name in TrainConfig().settings()})
    threads = args.threads or usable_cores()
    torch.set_num_threads(threads)
    out = shipped_folder(args.name) if args.ship else (args.out or Path("runs") / args.name)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {describe_machine(args.device)}; load average {load_average()}")

    kwargs = {} if args.validation_fraction is None else \
        {"validation_fraction": args.validation_fraction}
    corpus = load_corpus(**kwargs)
    summary = corpus.summary()
    print(f"corpus: {summary['root']}: {summary['train_files']} training files "
          f"({summary['train_bytes']:,} bytes), {summary['validation_files']} validation files "
          f"({summary['validation_bytes']:,} bytes), {summary['skipped_files']} left out")
    baselines = {name: ngram_bits_per_byte(corpus.train.data, corpus.validation.data, order)
                 for name, order in (("unigram", 1), ("bigram", 2))}
    print("baselines on the validation split: " +
          ", ".join(f"{k} {v:.3f}" for k, v in baselines.items()) + " bits/byte")

    train_tokens, validation_tokens = corpus.train.tokens(), corpus.validation.tokens()
    model, history = train(config, train_tokens, validation_tokens, device=args.device,
                           progress=not args.no_progress)
    print(f"trained {config.steps} steps in {history.wall_seconds / 60:.1f} min "
          f"({history.cpu_seconds / 60:.1f} min CPU); load average {history.loadavg_start} -> "
          f"{history.loadavg_end}")

    if args.weights_dtype == "auto":
        args.weights_dtype = "float32" if 4 * model.num_parameters() <= MAX_WEIGHTS_BYTES \
            else "float16"
    weights_dtype = getattr(torch, args.weights_dtype)
    save_checkpoint(model, out, weights_dtype)
    stored = load_gpt2(out, dtype=torch.float32)           # score what users will load
    seq_len = config.model.max_seq_len
    windows = evaluation_windows(validation_tokens, seq_len)
    val_bits = evaluate_bits_per_byte(stored, windows)
    slice_windows = 8
    middle = (windows.shape[0] // 2) * seq_len                # a fixed slice mid-split
    slice_bytes = corpus.validation.data[middle:middle + slice_windows * seq_len + 1]
    (out / SLICE_FILE).write_bytes(slice_bytes)
    slice_tokens = torch.frombuffer(bytearray(slice_bytes), dtype=torch.uint8)
    slice_bits = evaluate_bits_per_byte(stored, evaluation_windows(slice_tokens, seq_len))
    samples = generations(stored, seed=config.seed)
    print(f"validation: {val_bits:.3f} bits/byte (unigram {baselines['unigram']:.3f}, "
          f"bigram {baselines['bigram']:.3f})")
    for g in samples:
        print(f"\n--- prompt {g['prompt']!r}, greedy:\n{g['prompt']}{g['greedy']}")
        print(f"--- sampled (temperature {g['temperature']}, seed {g['seed']}):\n"
              f"{g['prompt']}{g['sampled']}")

    tokens_seen = config.steps * config.batch_size * seq_len
    metrics = {
        "name": args.name,
        "created": datetime.date.today().isoformat(),
        "model": {**stored.config.to_dict(), "parameters": stored.num_parameters()},
        "weights_dtype": args.weights_dtype,
        "weights_bytes": (out / WEIGHTS_FILE).stat().st_size,
        "weights_sha256": sha256_file(out / WEIGHTS_FILE),
        "tokenizer": "bytes",
        "training": {
            **config.settings(), "threads": threads, "device": str(args.device),
            "tokens_seen": tokens_seen, "machine": describe_machine(args.device),
            "wall_seconds": round(history.wall_seconds, 1),
            "cpu_seconds": round(history.cpu_seconds, 1),
            "loadavg_start": list(history.loadavg_start), "loadavg_end": list(history.loadavg_end),
            "torch": torch.__version__.split("+")[0], "python": platform.python_version(),
            "note": args.note, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "command": " ".join(["python -m course.ship",
                                 *(sys.argv[1:] if argv is None else argv)]),
        },
        "corpus": summary,
        "baselines": {"unigram_bits_per_byte": baselines["unigram"],
                      "bigram_bits_per_byte": baselines["bigram"]},
        "validation": {"bits_per_byte": val_bits, "windows": int(windows.shape[0]),
                       "bytes_scored": int(windows.shape[0] * seq_len)},
        "fixed_slice": {"file": SLICE_FILE, "bytes": len(slice_bytes),
                        "n_windows": slice_windows, "seq_len": seq_len,
                        "validation_offset": middle, "bits_per_byte": slice_bits},
        "history": {"eval_steps": history.eval_steps, "eval_bits": history.eval_bits,
                    "train_bits_every_10": history.train_bits[::10]},
        "generations": samples,
    }
    plot_loss_curve(history, baselines, out / CURVE_FILE,
                    f"{args.name}: {stored.num_parameters() / 1e6:.2f}M parameters, "
                    f"{config.steps} steps")
    metrics["training"]["total_wall_seconds"] = round(time.perf_counter() - started, 1)
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    (out / MODEL_CARD_FILE).write_text(model_card(metrics), encoding="utf-8")
    (out / DATA_CARD_FILE).write_text(data_card(corpus, summary, args.name), encoding="utf-8")
    print(f"\nwrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return metrics


def cli() -> None:
    """The ``course-train`` entry point: :func:`main` on the command line's arguments."""
    main()


if __name__ == "__main__":
    cli()
