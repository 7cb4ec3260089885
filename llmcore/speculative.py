"""Speculative decoding: guess k tokens cheaply, check them with one forward.

Decoding reads every weight of the model to make one token (chapter 7).
Checking k guessed tokens is one forward over k + 1 positions on the KV
cache, the prefill shape, which reads the weights once; when the guesses
agree with what the model would have picked, one weight read buys up to
k + 1 tokens. A round::

    draft   = drafter(context, k)             up to k guessed tokens (t,)
    logits  = model([pending] + draft, cache) (t + 1, v): ONE forward
    a, next = accept(draft, logits)           agreeing prefix, then a token
    cache.truncate(length + 1 + a)            forget the rejected positions
    context += draft[:a] + [next]             next is the new pending token

Drafts come from the context itself (:class:`PromptLookupDraft`: the tokens
that followed the last n-gram's earlier occurrence; no second model) or
from a smaller model (:class:`ModelDraft`, e.g. :func:`truncated_model`:
the target's first layers with its head). Greedy acceptance keeps the
longest prefix equal to the model's argmax, so the tokens are plain greedy
decoding's exactly; sampled acceptance keeps a draft token with probability
min(1, p/q) and otherwise draws from max(0, p - q) normalised, which gives
every token the target's distribution p. Loop forms (``*_loop``), matrix
forms, and NumPy twins in :mod:`llmcore.reference`. Chapter 15.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Hashable, Protocol

import torch
from torch import Tensor

from .cache import Cache
from .decode import check_request
from .kvcache import KVCache
from .layout import Layout
from .paged import PagedKVCache
from .shapes import check_shape, check_tensor
from .softmax import softmax


def check_k(k: int) -> int:
    """k, the most tokens a round drafts: an int >= 1 (else ValueError)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (tokens drafted per round) must be an int >= 1, "
                         f"got {k!r}")
    return k


def check_ngram(ngram: int) -> int:
    """ngram: an int >= 1 (else ValueError)."""
    if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 1:
        raise ValueError(f"ngram must be an int >= 1, got {ngram!r}")
    return ngram


def check_context(tokens: object) -> Tensor:
    """tokens: (m,) integer ids, m >= 1."""
    tokens = check_tensor("tokens", tokens)
    check_shape("tokens", tokens, ("m",))
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens: expected integer token ids, got "
                        f"{tokens.dtype}")
    if tokens.shape[0] == 0:
        raise ValueError("tokens: expected at least one token")
    return tokens


# ---------------------------------------------------- drafting from the context

def prompt_lookup_loop(tokens: Tensor, k: int, *, ngram: int = 3) -> Tensor:
    """Prompt lookup, one earlier position at a time: the tokens that
    followed the most recent earlier occurrence of the context's last
    n-gram (n = ngram first, then shorter, down to 1).

    tokens: (m,) ids -> draft (t,), 0 <= t <= k (empty if nothing recurs).
    Chapter 15.
    """
    tokens, k, ngram = check_context(tokens), check_k(k), check_ngram(ngram)
    m = tokens.shape[0]
    for n in range(min(ngram, m - 1), 0, -1):
        last = tokens[m - n:].tolist()               # the n-gram to look up
        for start in range(m - n - 1, -1, -1):       # latest first
            if tokens[start:start + n].tolist() == last:
                return tokens[start + n:start + n + k].clone()
    return tokens[:0].clone()


def prompt_lookup(tokens: Tensor, k: int, *, ngram: int = 3) -> Tensor:
    """Same contract as :func:`prompt_lookup_loop`; every earlier window
    compared at once. The windows of n tokens are a view (``unfold``,
    (m - n, n)); one comparison with the last n-gram marks them all.

    tokens: (m,) -> (t,), 0 <= t <= k."""
    tokens, k, ngram = check_context(tokens), check_k(k), check_ngram(ngram)
    m = tokens.shape[0]
    for n in range(min(ngram, m - 1), 0, -1):
        windows = tokens[:m - 1].unfold(0, n, 1)          # (m - n, n)
        hits = (windows == tokens[m - n:]).all(dim=1)     # (m - n,)
        if bool(hits.any()):
            start = int(hits.nonzero()[-1])               # most recent
            return tokens[start + n:start + n + k].clone()
    return tokens[:0].clone()


# ---------------------------------------------------- drafting with a model

def truncated_model(model, n_layers: int):
    """The target's first ``n_layers`` blocks with its own embedding,
    final norm and head: a smaller draft model that needs no training
    (its weights are copies of the target's).

    model: a GPT (or an llmcore decoder with ``blocks.<i>``). Chapter 15.
    """
    total = model.config.n_layers
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) \
            or not 0 < n_layers <= total:
        raise ValueError(f"n_layers must be an int in [1, {total}], "
                         f"got {n_layers!r}")
    config = dataclasses.replace(model.config, n_layers=n_layers)
    small = type(model)(config, device=model.device, dtype=model.dtype)
    kept = {name: value for name, value in model.state_dict().items()
            if not name.startswith("blocks.")
            or int(name.split(".")[1]) < n_layers}
    small.load_state_dict(kept)
    return small.eval()


class Drafter(Protocol):
    """What proposes the next tokens: the draft, and the distributions q
    it was drawn from, or None for a deterministic draft (q one-hot)."""

    def __call__(self, context: Tensor,
                 k: int) -> tuple[Tensor, Tensor | None]:
        """context: (m,) every token so far
        -> draft (t,), 0 <= t <= k, and q (t, v) or None."""
        ...


@dataclass
class PromptLookupDraft:
    """Drafts from the context itself (:func:`prompt_lookup`): no model,
    no cost but a search. Chapter 15."""

    ngram: int = 3

    def __call__(self, context: Tensor, k: int) -> tuple[Tensor, None]:
        return prompt_lookup(context, k, ngram=self.ngram), None


@dataclass
class ModelDraft:
    """Drafts k tokens with a smaller model, one cached decode step each,
    greedily (temperature 0) or sampled at ``temperature`` (then q, the
    distributions drawn from, comes back too).

    Its own KV cache follows the context: before each draft it is rolled
    back to the longest prefix of the context it holds, and only the tokens
    after that are run. Chapter 15."""

    model: object
    temperature: float = 0.0
    generator: torch.Generator | None = None
    cache: KVCache | None = field(default=None, init=False)
    held: list = field(default_factory=list, init=False)  # what it caches

    def __call__(self, context: Tensor,
                 k: int) -> tuple[Tensor, Tensor | None]:
        context = check_context(context)
        if self.cache is None:
            self.cache = KVCache.for_model(self.model, 1)
        tokens = context.tolist()
        common, limit = 0, min(len(self.held), len(tokens) - 1)
        while common < limit and self.held[common] == tokens[common]:
            common += 1                     # the prefix it still holds
        self.cache.truncate(common)
        self.held = tokens[:common]
        k = min(k, self.model.config.max_seq_len - len(tokens))
        new, draft, dists = context[common:], [], []
        with torch.no_grad():
            for _ in range(k):
                logits = self.model(new[None], self.cache,
                                    last_only=True)[0, -1]        # (v,)
                self.held += new.tolist()
                if self.temperature == 0:
                    token = logits.argmax()
                else:
                    q = softmax(logits.double() / self.temperature, dim=-1)
                    token = torch.multinomial(q, 1,
                                              generator=self.generator)[0]
                    dists.append(q)
                draft.append(token)
                new = token[None]
        draft = torch.stack(draft) if draft else context[:0].clone()
        return draft, (torch.stack(dists) if dists else None)


# ---------------------------------------------------- verification, rollback

class RollbackCache(Cache, Protocol):
    """A cache of one sequence that can forget its last tokens: what
    speculative decoding verifies on. :class:`llmcore.kvcache.KVCache`
    (batch 1) is one; :class:`PagedSequence` makes one of a paged cache's
    sequences."""

    def truncate(self, length: int) -> None:
        """Keep tokens [0, length); forget the rest."""
        ...


class PagedSequence:
    """One sequence of a :class:`llmcore.paged.PagedKVCache` as a cache
    the model takes and speculative decoding rolls back. Chapter 15."""

    def __init__(self, paged: PagedKVCache, seq_id: Hashable):
        self.paged, self.seq_id = paged, seq_id
        self.view = paged.batch([seq_id])

    @property
    def max_length(self) -> int:
        return self.paged.length(self.seq_id)

    def prepare(self, b: int, n: int,
                attention_mask: Tensor | None) -> Layout:
        return self.view.prepare(b, n, attention_mask)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor,
               layout: Layout, backend: str = "explicit") -> Tensor:
        return self.view.attend(layer, q, k, v, layout, backend)

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        self.view.commit(n, attention_mask)

    def truncate(self, length: int) -> None:
        """Forget tokens from ``length`` on; a block left empty goes
        back to the pool's free list."""
        self.paged.truncate(self.seq_id, length)


def check_verify(cache, tokens: Tensor) -> None:
    """tokens: (1, t); cache: one that can roll back."""
    check_tensor("tokens", tokens)
    check_shape("tokens", tokens, (1, "t"))
    if not hasattr(cache, "truncate"):
        raise TypeError(f"cache: expected a cache that can roll back "
                        f"(KVCache or PagedSequence), got "
                        f"{type(cache).__name__}")


def verify_loop(model, cache: RollbackCache, tokens: Tensor) -> Tensor:
    """What plain decoding does: one forward per position, one token each.

    tokens: (1, t) the pending token, then the draft -> logits (t, v);
    the cache gains t tokens. t forwards: t reads of every weight.
    Chapter 15."""
    check_verify(cache, tokens)
    with torch.no_grad():
        rows = [model(tokens[:, i:i + 1], cache)[0, -1]
                for i in range(tokens.shape[1])]
    return torch.stack(rows)                                    # (t, v)


def verify(model, cache: RollbackCache, tokens: Tensor) -> Tensor:
    """Same contract as :func:`verify_loop`, in ONE forward over the t
    positions: the prefill shape, t queries against the cached keys and
    the t new ones (causal). Row i predicts the token after tokens[0, i].

    tokens: (1, t) -> logits (t, v)."""
    check_verify(cache, tokens)
    with torch.no_grad():
        return model(tokens, cache)[0]                          # (t, v)


# ---------------------------------------------------- acceptance

def check_acceptance(draft: Tensor, logits: Tensor) -> tuple[int, int]:
    """draft (..., k) ids, logits (..., k + 1, v) -> (k, v)."""
    check_tensor("draft", draft)
    check_tensor("logits", logits)
    if draft.dtype.is_floating_point or draft.dtype == torch.bool:
        raise TypeError(f"draft: expected integer token ids, got "
                        f"{draft.dtype}")
    k = check_shape("draft", draft, ("...", "k"))["k"]
    v = check_shape("logits", logits, ("...", k + 1, "v"))["v"]
    if tuple(draft.shape[:-1]) != tuple(logits.shape[:-2]):
        raise ValueError(f"draft {tuple(draft.shape)} and logits "
                         f"{tuple(logits.shape)}: leading sizes differ")
    return k, v


def accept_greedy_loop(draft: Tensor,
                       logits: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy acceptance, one draft token at a time: keep draft tokens
    while each is the argmax of its row; the first that is not is replaced
    by the argmax (all kept: the last row's argmax is a bonus token).

    draft: (k,)   logits: (k + 1, v) -> accepted a (), next token ().
    Chapter 15."""
    k, _ = check_acceptance(draft, logits)
    check_shape("draft", draft, (k,))
    a = 0
    while a < k and int(logits[a].argmax()) == int(draft[a]):
        a += 1
    return torch.tensor(a, device=draft.device), logits[a].argmax()


def accept_greedy(draft: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
    """Same contract as :func:`accept_greedy_loop`, every position at
    once, with leading batch dimensions: the agreeing prefix is a
    cumulative product of the matches.

    draft: (..., k)   logits: (..., k + 1, v) -> a (...), next (...)."""
    check_acceptance(draft, logits)
    best = logits.argmax(dim=-1)                          # (..., k + 1)
    agree = (best[..., :-1] == draft).long()              # (..., k)
    a = agree.cumprod(dim=-1).sum(dim=-1)                 # (...)
    return a, best.gather(-1, a[..., None])[..., 0]


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """max(0, p - q), normalised: what a rejected position draws from.

    p, q: (..., v) probabilities -> (..., v). Where p == q nothing is
    ever rejected and the sum is 0: the row is then p. Chapter 15."""
    excess = (p - q).clamp(min=0)                         # (..., v)
    total = excess.sum(dim=-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, excess / safe, p)


def draw(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sampling: the first token whose cumulative probability
    exceeds u times the total.

    probs: (..., v)   u: (...) in [0, 1) -> token ids (...). Chapter 15."""
    cdf = probs.cumsum(dim=-1)                            # (..., v)
    target = (u * cdf[..., -1])[..., None]                # (..., 1)
    token = torch.searchsorted(cdf.contiguous(), target.contiguous(),
                               right=True)[..., 0]
    return token.clamp(max=probs.shape[-1] - 1)


def one_hot_draft(draft: Tensor, v: int, dtype: torch.dtype) -> Tensor:
    """q of a deterministic draft: ids (..., k) -> (..., k, v), one-hot."""
    return torch.nn.functional.one_hot(draft, v).to(dtype)


def check_sampled(draft, p, q, u, u_draw) -> tuple[int, int]:
    """The shapes of :func:`accept_sampled`'s arguments -> (k, v)."""
    k, v = check_acceptance(draft, p)
    batch = tuple(draft.shape[:-1])
    if q is not None:
        check_tensor("q", q)
        check_shape("q", q, (*batch, k, v))
    check_tensor("u", u)
    check_shape("u", u, (*batch, k))
    check_tensor("u_draw", u_draw)
    check_shape("u_draw", u_draw, batch)
    return k, v


def accept_sampled_loop(draft: Tensor, p: Tensor, q: Tensor | None,
                        u: Tensor, u_draw: Tensor) -> tuple[Tensor, Tensor]:
    """Sampled acceptance, one draft token at a time. Token i is kept when
    u[i] < p[i, d_i] / q[i, d_i] (probability min(1, p/q)); at the first
    rejection the next token is drawn from max(0, p[i] - q[i]) normalised;
    all kept, from p[k] (a bonus token). The uniforms are arguments, so
    that the loop and matrix forms can be compared exactly.

    draft: (k,)   p: (k + 1, v) the target's probabilities   q: (k, v)
    the draft's, or None for a deterministic draft (one-hot)   u: (k,)
    u_draw: () uniforms -> accepted a (), next token (). Chapter 15."""
    k, v = check_sampled(draft, p, q, u, u_draw)
    check_shape("draft", draft, (k,))
    q = one_hot_draft(draft, v, p.dtype) if q is None else q
    for i in range(k):
        token = int(draft[i])
        if float(u[i]) * float(q[i, token]) < float(p[i, token]):
            continue                                      # u < p / q: keep
        residual = residual_distribution(p[i], q[i])
        return torch.tensor(i, device=draft.device), draw(residual, u_draw)
    return torch.tensor(k, device=draft.device), draw(p[k], u_draw)


def accept_sampled(draft: Tensor, p: Tensor, q: Tensor | None, u: Tensor,
                   u_draw: Tensor) -> tuple[Tensor, Tensor]:
    """Same contract as :func:`accept_sampled_loop`, every position at
    once, with leading batch dimensions: the tests u q < p, their
    cumulative product, then one row to draw from per sequence.

    draft: (..., k)   p: (..., k + 1, v)   q: (..., k, v) or None
    u: (..., k)   u_draw: (...) -> a (...), next (...)."""
    k, v = check_sampled(draft, p, q, u, u_draw)
    q = one_hot_draft(draft, v, p.dtype) if q is None else q
    index = draft[..., None]                              # (..., k, 1)
    p_draft = p[..., :k, :].gather(-1, index)[..., 0]     # (..., k)
    q_draft = q.gather(-1, index)[..., 0]                 # (..., k)
    keep = (u * q_draft < p_draft).long()                 # (..., k)
    a = keep.cumprod(dim=-1).sum(dim=-1)                  # (...)
    residuals = residual_distribution(p[..., :k, :], q)   # (..., k, v)
    rows = torch.cat([residuals, p[..., k:, :]], dim=-2)  # (..., k + 1, v)
    row = rows.gather(-2, a[..., None, None].expand(*a.shape, 1, v))
    return a, draw(row[..., 0, :], u_draw)


def expected_tokens_per_forward(alpha: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): the tokens a round yields on average when
    each of k draft tokens is accepted with probability a, independently
    (Leviathan et al., 2023); k + 1 at a = 1. Chapter 15."""
    check_k(k)
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


# ---------------------------------------------------- the decoding loop

@dataclass
class SpeculativeResult:
    """tokens: (1, n + t) the prompt and what was generated. forwards:
    target forwards, the prefill's included; rounds: the verifying ones.
    drafted, tested, accepted: draft tokens proposed, examined (the kept
    ones and the one rejected in a round) and kept. seconds: wall clock;
    prompt_length: n."""

    tokens: Tensor
    prompt_length: int
    forwards: int = 0
    rounds: int = 0
    drafted: int = 0
    tested: int = 0
    accepted: int = 0
    seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        """The estimated probability that a draft token is kept when those
        before it were: accepted / tested."""
        return self.accepted / self.tested if self.tested else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens per verifying forward (the prefill's token left out)."""
        new = self.tokens.shape[1] - self.prompt_length - 1
        return new / self.rounds if self.rounds else 0.0


def check_speculative(model, prompt_ids, max_new_tokens, k, cache,
                      temperature):
    """Check a request once -> the cache to use (a fresh KVCache if
    None)."""
    b, _ = check_request(model, prompt_ids, max_new_tokens)
    check_k(k)
    if b != 1:
        raise ValueError(f"speculative decoding takes one sequence (b = 1), "
                         f"got b = {b}: sequences accept different numbers "
                         f"of tokens per round")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    cache = KVCache.for_model(model, 1) if cache is None else cache
    if not hasattr(cache, "truncate"):
        raise TypeError(f"cache: expected a KVCache or a PagedSequence, "
                        f"got {type(cache).__name__}")
    if cache.max_length != 0:
        raise ValueError(f"cache: expected an empty cache, it holds "
                         f"{cache.max_length} tokens")
    return cache


def speculative_decode(model, prompt_ids: Tensor, max_new_tokens: int, *,
                       draft: Drafter, k: int,
                       cache: RollbackCache | None = None,
                       temperature: float = 0.0,
                       seed: int | None = None) -> SpeculativeResult:
    """Generate max_new_tokens, up to k drafted tokens checked per forward.

    prompt_ids: (1, n). draft: a :class:`Drafter`. cache: empty, for one
    sequence (default: a KVCache); rolled back after each round. At
    temperature 0, greedy acceptance: plain greedy decoding's tokens.
    Above 0, sampled acceptance: each token has the distribution
    softmax(logits / temperature), drawn with a generator seeded with
    ``seed``. Chapter 15."""
    cache = check_speculative(model, prompt_ids, max_new_tokens, k, cache,
                              temperature)
    n = prompt_ids.shape[1]
    result = SpeculativeResult(prompt_ids, n)
    if max_new_tokens == 0:
        return result
    generator = None
    if temperature > 0:                       # greedy draws nothing
        generator = torch.Generator(device=prompt_ids.device)
        if seed is not None:
            generator.manual_seed(seed)
    uniform = lambda size: torch.rand(size, generator=generator,
                                      dtype=torch.float64,
                                      device=prompt_ids.device)
    probs = lambda logits: softmax(logits.double() / temperature, dim=-1)
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(prompt_ids, cache, last_only=True)[0, -1]  # prefill
        result.forwards += 1
        pending = logits.argmax() if temperature == 0 \
            else draw(probs(logits), uniform(()))
        context = torch.cat([prompt_ids[0], pending[None]])
        while context.shape[0] - n < max_new_tokens:
            room = max_new_tokens - (context.shape[0] - n) - 1
            proposal, q = draft(context, k) if room > 0 else (context[:0],
                                                              None)
            proposal = proposal[:room]
            t = proposal.shape[0]
            length = cache.max_length            # the context but pending
            tokens = torch.cat([pending[None], proposal])[None]   # (1, t+1)
            logits = verify(model, cache, tokens)                 # (t+1, v)
            if temperature == 0:
                a, pending = accept_greedy(proposal, logits)
            else:
                u = uniform(t + 1)
                q = None if q is None else q[:t]
                a, pending = accept_sampled(proposal, probs(logits), q,
                                            u[:t], u[t])
            a = int(a)
            cache.truncate(length + 1 + a)                    # roll back
            context = torch.cat([context, proposal[:a], pending[None]])
            result.forwards += 1
            result.rounds += 1
            result.drafted += t
            result.accepted += a
            result.tested += a + (1 if a < t else 0)
    result.tokens = context[None]
    result.seconds = time.perf_counter() - start
    return result
