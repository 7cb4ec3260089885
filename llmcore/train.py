"""Training the course's small byte-level GPT: the settings, the batches, the loss, the loop.

:func:`train` trains an :class:`llmcore.model.GPT` from a seed with AdamW (linear warm-up, then a
cosine decay of the learning rate; gradient clipping) and evaluates on held-out text as it goes.
Training is counted in steps, not seconds, so a run gives the same model however busy the machine
is. The loss is the mean cross-entropy of the next byte; divided by ln 2 it is in bits per byte,
the unit the baselines use. Writing a model folder (checkpoint, metrics, cards, the loss-curve
figure) is the course's tooling: ``python -m course.ship``. Chapter 5.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from .corpus import bits_per_byte
from .device import load_average
from .model import GPT, GPTConfig
from .tokenizer import VOCAB_SIZE

RUNNING_STEPS = 20
"""The progress bar shows the mean training loss of this many recent steps."""

SHIPPED_MODEL = GPTConfig(vocab_size=VOCAB_SIZE, max_seq_len=128, d_model=128, n_heads=4,
                          n_layers=4)
"""The shipped model's sizes (vocab_size is 256: bytes)."""

MODEL_SETTINGS = ("d_model", "n_layers", "n_heads", "max_seq_len")
"""The model's sizes a training run sets (the rest keep GPTConfig's defaults)."""


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run: the model's sizes (a GPTConfig) and the optimisation's.
    The defaults made the shipped model."""

    model: GPTConfig = SHIPPED_MODEL
    # optimisation
    steps: int = 3000
    batch_size: int = 16
    lr: float = 5e-3
    min_lr_ratio: float = 0.1          # the cosine ends at lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1          # on matrices only, not on biases or norm parameters
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0             # the gradient's global norm is clipped to this
    seed: int = 0
    # evaluation during training
    eval_every: int = 100
    eval_windows: int = 128            # validation windows scored at each evaluation
    backend: str = "explicit"          # attention backend (llmcore.attention.BACKENDS)

    def __post_init__(self) -> None:
        if not isinstance(self.model, GPTConfig):
            raise TypeError(f"TrainConfig.model: expected a GPTConfig, got "
                            f"{type(self.model).__name__}")
        if self.model.vocab_size != VOCAB_SIZE:
            raise ValueError(f"TrainConfig.model.vocab_size must be {VOCAB_SIZE} (the tokens are "
                             f"bytes), got {self.model.vocab_size}")
        for name in ("steps", "batch_size", "eval_every", "eval_windows"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} must be positive, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"TrainConfig.min_lr_ratio must lie in [0, 1], got "
                             f"{self.min_lr_ratio}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"TrainConfig.warmup_steps must lie in [0, steps = {self.steps}], "
                             f"got {self.warmup_steps}")
        if self.grad_clip <= 0:
            raise ValueError(f"TrainConfig.grad_clip must be positive, got {self.grad_clip}")

    @classmethod
    def from_settings(cls, **settings) -> "TrainConfig":
        """A config from flat settings: the model's sizes (MODEL_SETTINGS) next to the training
        fields, as the command line and metrics.json spell them."""
        sizes = {k: settings.pop(k) for k in MODEL_SETTINGS if k in settings}
        return cls(model=replace(SHIPPED_MODEL, **sizes), **settings)

    def settings(self) -> dict:
        """The flat settings :meth:`from_settings` reads: the model's sizes, then the rest."""
        flat = {k: getattr(self.model, k) for k in MODEL_SETTINGS}
        flat.update({f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"})
        return flat


def learning_rate(step: int, config: TrainConfig) -> float:
    """The learning rate at ``step`` (0-based): linear warm-up from lr / warmup_steps to lr over
    the first warmup_steps steps, then a half cosine from lr down to lr * min_lr_ratio at the
    last step. Chapter 5."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - 1 - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)           # 0 -> 1
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))                # 1 -> 0
    return config.lr * (config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine)


def _check_stream(name: str, tokens: Tensor, seq_len: int) -> None:
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{name}: expected a 1-D tensor of byte tokens, got {type(tokens).__name__}")
    if tokens.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D tensor of byte tokens (N,), got shape "
                         f"{tuple(tokens.shape)}")
    if tokens.shape[0] < seq_len + 1:
        raise ValueError(f"{name}: {tokens.shape[0]} tokens are fewer than one window of "
                         f"seq_len + 1 = {seq_len + 1}")


def random_batch(tokens: Tensor, batch_size: int, seq_len: int,
                 generator: torch.Generator) -> Tensor:
    """b windows of n + 1 consecutive tokens from random offsets of a token stream.

    tokens: (N,) -> (b, n + 1) long; inputs are [:, :-1] and targets [:, 1:]. Chapter 5.
    """
    _check_stream("tokens", tokens, seq_len)
    starts = torch.randint(0, tokens.shape[0] - seq_len, (batch_size,), generator=generator,
                           device=generator.device)
    offsets = torch.arange(seq_len + 1, device=starts.device)
    return tokens[(starts[:, None] + offsets).to(tokens.device)].long()     # (b, n + 1)


def evaluation_windows(tokens: Tensor, seq_len: int) -> Tensor:
    """Cut a token stream into windows of n + 1 tokens that overlap by one token, so every token
    after the first is a target exactly once; a tail shorter than n is left out.

    tokens: (N,) -> (k, n + 1) long with k = (N - 1) // n. Chapter 5.
    """
    _check_stream("tokens", tokens, seq_len)
    k = (tokens.shape[0] - 1) // seq_len
    index = torch.arange(k, device=tokens.device)[:, None] * seq_len + \
        torch.arange(seq_len + 1, device=tokens.device)                    # (k, n + 1)
    return tokens[index].long()


def spread(windows: Tensor, count: int) -> Tensor:
    """``count`` windows evenly spaced through all of them (all if there are fewer):
    a fixed, representative subset for evaluations during training. (k, n + 1) -> (count, n + 1)."""
    if count >= windows.shape[0]:
        return windows
    return windows[torch.linspace(0, windows.shape[0] - 1, count).round().long()]


def next_byte_loss(model: GPT, windows: Tensor, *, backend: str = "explicit") -> Tensor:
    """Mean cross-entropy (nats) of predicting each window's tokens 1..n from the ones before.

    windows: (b, n + 1) -> () float32. The logits are upcast to float32 first. Chapter 5.
    """
    logits = model(windows[:, :-1], backend=backend)                         # (b, n, v)
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


def train_step(model, params, optimizer: torch.optim.Optimizer, windows: Tensor, *,
               grad_clip: float, backend: str = "explicit") -> tuple[float, float]:
    """One optimizer step on a batch of windows (b, n + 1): the mean next-byte loss
    (:func:`next_byte_loss`), its gradient, the gradient's norm over ``params`` clipped to
    grad_clip, then ``optimizer.step()``. -> (the loss in bits per byte, the norm before
    clipping). The one step of :func:`train` and of :func:`llmcore.lora.fine_tune`.
    Chapters 5 and 14."""
    loss = next_byte_loss(model, windows, backend=backend)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    return bits_per_byte(loss.item()), float(norm)


@torch.no_grad()
def evaluate_bits_per_byte(model: GPT, windows: Tensor, *, batch_size: int = 32,
                           backend: str = "explicit") -> float:
    """The model's mean loss over every target of every window, in bits per byte.

    windows: (k, n + 1) long, e.g. from :func:`evaluation_windows`. Leaves the model's
    train/eval mode as it found it. Chapter 5.
    """
    if windows.dim() != 2 or windows.shape[0] == 0 or windows.shape[1] < 2:
        raise ValueError(f"windows: expected shape (k, n + 1) with k >= 1 and n >= 1, got "
                         f"{tuple(windows.shape)}")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, windows.shape[0], batch_size):
            chunk = windows[start:start + batch_size].to(model.device)
            loss = next_byte_loss(model, chunk, backend=backend)
            targets = chunk[:, 1:].numel()
            total, count = total + float(loss) * targets, count + targets
    finally:
        model.train(was_training)
    return bits_per_byte(total / count)


@dataclass
class TrainHistory:
    """What a run measured: the training loss (bits per byte) of every step, the learning rate,
    the gradient norm before clipping, and the validation evaluations."""

    train_bits: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_bits: list[float] = field(default_factory=list)
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    loadavg_start: tuple[float, ...] = ()
    loadavg_end: tuple[float, ...] = ()


def _optimizer(model: GPT, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (and embeddings) only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2))


class _PlainProgress:
    """The progress bar's stand-in where tqdm is not installed (llmcore needs only torch, NumPy
    and safetensors): iterates over the steps and prints each line it is asked to write."""

    def __init__(self, steps: int, enabled: bool):
        self.steps, self.enabled = range(steps), enabled

    def __iter__(self):
        return iter(self.steps)

    def set_postfix(self, **values) -> None:
        pass

    def write(self, line: str) -> None:
        if self.enabled:
            print(line, flush=True)

    def close(self) -> None:
        pass


def _progress_bar(steps: int, *, enabled: bool):
    """tqdm's bar over range(steps) when tqdm is installed, else plain printed lines."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PlainProgress(steps, enabled)
    return tqdm(range(steps), desc="training", unit="step", disable=not enabled,
                dynamic_ncols=True, mininterval=1.0)


def train(config: TrainConfig, train_tokens: Tensor, validation_tokens: Tensor, *,
          device: torch.device | str = "cpu", progress: bool = True) -> tuple[GPT, TrainHistory]:
    """Train a fresh GPT (weights seeded by ``config.seed``) for ``config.steps`` steps.

    train_tokens, validation_tokens: (N,) byte streams (uint8 or long). Each step draws
    batch_size random windows of max_seq_len + 1 bytes (from a generator seeded by the seed),
    computes the mean next-byte loss, back-propagates, clips the gradient norm and takes an
    AdamW step at :func:`learning_rate`. Every eval_every steps, and after the last, scores
    eval_windows fixed validation windows. Returns the model (eval mode) and its history.
    With one torch thread a run repeats bit for bit; with several, multithreaded sums may
    differ in their last bits from run to run. Chapter 5.
    """
    _check_stream("train_tokens", train_tokens, config.model.max_seq_len)
    _check_stream("validation_tokens", validation_tokens, config.model.max_seq_len)
    device = torch.device(device)
    model = GPT(config.model, device=device, seed=config.seed).train()
    optimizer = _optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    probe = spread(evaluation_windows(validation_tokens, config.model.max_seq_len),
                   config.eval_windows)
    history = TrainHistory(loadavg_start=load_average())
    wall, cpu = time.perf_counter(), time.process_time()
    bar = _progress_bar(config.steps, enabled=progress)
    for step in bar:
        lr = learning_rate(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = random_batch(train_tokens, config.batch_size, config.model.max_seq_len,
                             generator).to(device)                            # (b, n + 1)
        bits, norm = train_step(model, model.parameters(), optimizer, batch,
                                grad_clip=config.grad_clip, backend=config.backend)
        if not math.isfinite(bits):
            raise FloatingPointError(f"the training loss became {bits} at step {step}; "
                                     f"try a lower lr than {config.lr}")
        history.train_bits.append(bits)
        history.lr.append(lr)
        history.grad_norm.append(norm)
        recent = history.train_bits[-RUNNING_STEPS:]
        running = sum(recent) / len(recent)
        bar.set_postfix(loss=f"{running:.3f} bits/byte", lr=f"{lr:.2e}", refresh=False)
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            val = evaluate_bits_per_byte(model, probe, backend=config.backend)
            history.eval_steps.append(step + 1)
            history.eval_bits.append(val)
            bar.write(f"step {step + 1:5d}: train {running:.3f}, validation {val:.3f} bits/byte")
    bar.close()
    history.wall_seconds = time.perf_counter() - wall
    history.cpu_seconds = time.process_time() - cpu
    history.loadavg_end = load_average()
    return model.eval(), history
