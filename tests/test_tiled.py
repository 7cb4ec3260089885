"""llmcore.tiled: the online softmax equals the softmax, tiled attention equals explicit attention
(causal or not, decode and chunked prefill, grouped K/V heads, masks, tile sizes that do not divide
n or m), future tiles are skipped, a kept shift that overflows or underflows is caught and computed
again with the rescaling, and at n = 4096 the tiled peak memory is far below the (n, n)
score matrix that explicit attention needs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.overrides import TorchFunctionMode

from llmcore import testing
from llmcore.attention import attention
from llmcore.peak_memory import peak_memory
from llmcore.softmax import softmax
from llmcore.tiled import (TileSource, attend_query_tile, online_softmax, online_softmax_loop,
                           online_softmax_step, shift_held, tiled_attention)

F64 = dict(rtol=1e-12, atol=1e-12)          # between our own rungs, in float64


def qkv(rng, b, h, h_kv, n, m, d_head, *, device=None, dtype=torch.float64):
    return (testing.randn(rng, b, h, n, d_head, device=device, dtype=dtype),
            testing.randn(rng, b, h_kv, m, d_head, device=device, dtype=dtype),
            testing.randn(rng, b, h_kv, m, d_head, device=device, dtype=dtype))


# --- the online softmax -----------------------------------------------------------------------

def rows_with_hard_cases(rng):
    """(4, 9) float64: ordinary, large logits (overflow without the max shift), a row whose maximum
    arrives last (forces every rescale), and a fully masked row."""
    x = testing.randn(rng, 4, 9, dtype=torch.float64)
    x[1] = x[1] * 300 + 1000
    x[2] = torch.arange(9, dtype=torch.float64) * 5
    x[3] = float("-inf")
    x[0, [1, 4]] = float("-inf")
    return x


def test_online_softmax_loop_equals_softmax(rng):
    x = rows_with_hard_cases(rng)
    out = online_softmax_loop(x)
    testing.assert_close(out, softmax(x), **F64)
    assert torch.equal(out[3], torch.zeros(9, dtype=torch.float64))        # masked: zeros, no NaN


@pytest.mark.parametrize("block", [1, 2, 4, 9, 50])
@pytest.mark.parametrize("dim", [-1, 0])
def test_online_softmax_equals_softmax(block, dim, rng):
    x = rows_with_hard_cases(rng)
    testing.assert_close(online_softmax(x, dim, block=block), softmax(x, dim), **F64)
    testing.assert_close(online_softmax_loop(x, dim), softmax(x, dim), **F64)


def test_online_softmax_step_rescales_to_the_new_maximum():
    running_max = torch.tensor([[float("-inf")], [float("-inf")]], dtype=torch.float64)
    running_sum = torch.zeros(2, 1, dtype=torch.float64)
    first = torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]], dtype=torch.float64)
    running_max, running_sum, rescale, weights = online_softmax_step(running_max, running_sum,
                                                                     first)
    assert running_max[1].item() == float("-inf") and running_sum[1].item() == 0.0   # nothing seen
    assert torch.equal(rescale, torch.zeros(2, 1, dtype=torch.float64))              # exp(-inf)
    second = torch.tensor([[3.0, 2.0], [5.0, float("-inf")]], dtype=torch.float64)
    running_max, running_sum, rescale, weights = online_softmax_step(running_max, running_sum,
                                                                     second)
    assert running_max.flatten().tolist() == [3.0, 5.0]
    testing.assert_close(rescale[0], [math.exp(1.0 - 3.0)], **F64)    # old max 1 -> new max 3
    testing.assert_close(weights, [[1.0, math.exp(-1.0)], [1.0, 0.0]], **F64)
    testing.assert_close(running_sum.flatten(), [sum(math.exp(v - 3.0) for v in (0, 1, 3, 2)), 1.0],
                         **F64)


@pytest.mark.parametrize("inplace", [False, True])
def test_online_softmax_step_in_base_2_gives_the_same_weights(inplace, rng):
    """Scores times log2(e) with exp2 are the scores with exp: same weights, sum and rescale."""
    x = rows_with_hard_cases(rng)
    start_max, start_sum = torch.full((4, 1), float("-inf"), dtype=torch.float64), \
        torch.zeros(4, 1, dtype=torch.float64)
    first = online_softmax_step(start_max, start_sum, x[:, :4].clone())
    first_2 = online_softmax_step(start_max, start_sum, x[:, :4] * math.log2(math.e),
                                  base2=True, inplace=inplace)
    second = online_softmax_step(first[0], first[1], x[:, 4:].clone())
    second_2 = online_softmax_step(first_2[0], first_2[1], x[:, 4:] * math.log2(math.e),
                                   base2=True, inplace=inplace)
    for base_e, base_2 in ((first, first_2), (second, second_2)):
        testing.assert_close(base_2[0], base_e[0] * math.log2(math.e), **F64)     # the maximum
        for got, want in zip(base_2[1:], base_e[1:]):                    # sum, rescale, weights
            testing.assert_close(got, want, **F64)
    assert second_2[1][3].item() == 0.0                                # all masked: sum 0, no NaN


# --- tiled attention == explicit attention ------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, m", [(9, 9), (1, 13), (5, 13), (13, 13)])   # prefill, decode, chunked
@pytest.mark.parametrize("block_q, block_k", [(4, 5), (3, 2), (1, 1), (128, 128)])
def test_tiled_equals_explicit_float64(n, m, causal, block_q, block_k, rng):
    q, k, v = qkv(rng, 2, 3, 3, n, m, 6)                          # b = 2, h = 3, d_head = 6
    want = attention(q, k, v, causal=causal)
    got = tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    assert got.shape == (2, 3, n, 6) and got.dtype == torch.float64
    testing.assert_close(got, want, **F64)


@pytest.mark.parametrize("h, h_kv", [(4, 2), (6, 1), (4, 4)])          # grouped, multi-query, plain
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_grouped_query_heads(h, h_kv, causal, rng):
    q, k, v = qkv(rng, 2, h, h_kv, 7, 11, 5)
    want = attention(q, k, v, causal=causal)
    testing.assert_close(tiled_attention(q, k, v, causal=causal, block_q=3, block_k=4), want, **F64)


def test_tiled_float32_on_every_device(device, rng):
    q, k, v = qkv(rng, 3, 4, 2, 10, 17, 8, device=device, dtype=torch.float32)
    got = tiled_attention(q, k, v, causal=True, block_q=4, block_k=6)
    assert got.device.type == device.type and got.dtype == torch.float32
    torch.testing.assert_close(got, attention(q, k, v, causal=True))
    torch.testing.assert_close(got, attention(q, k, v, causal=True, backend="fused"))


def test_tiled_without_head_axis(rng):
    q, k, v = (testing.randn(rng, s, 4, dtype=torch.float64) for s in (5, 8, 8))   # (n, d_head)
    testing.assert_close(tiled_attention(q, k, v, causal=True, block_q=2, block_k=3),
                         attention(q, k, v, causal=True), **F64)


def test_tiled_on_transposed_inputs(rng):
    """q, k, v as the model's split_heads gives them, (b, n, h, d_head) transposed to
    (b, h, n, d_head), not contiguous: the tiles are copies instead of views, the result the
    same (grouped heads and a mask too)."""
    q, k, v = (testing.randn(rng, 2, s, h, 5, dtype=torch.float64).transpose(1, 2)
               for s, h in ((7, 4), (12, 2), (12, 2)))
    mask = torch.from_numpy(rng.random((2, 1, 7, 12)) > 0.3)
    assert not q.is_contiguous() and not k.is_contiguous()
    for options in (dict(causal=True), dict(mask=mask)):
        testing.assert_close(tiled_attention(q, k, v, block_q=3, block_k=5, **options),
                             attention(q, k, v, **options), **F64)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_shape", [(2, 1, 6, 10), (6, 10), (2, 4, 6, 10)])
def test_tiled_with_mask_and_fully_masked_rows(mask_shape, causal, rng):
    q, k, v = qkv(rng, 2, 4, 2, 6, 10, 5)
    mask = torch.from_numpy(rng.random(mask_shape) > 0.4)
    mask[..., 2, :] = False                                      # query 2 may see nothing
    want = attention(q, k, v, causal=causal, mask=mask)
    got = tiled_attention(q, k, v, causal=causal, mask=mask, block_q=4, block_k=3)
    assert not torch.isnan(got).any()
    assert torch.equal(got[..., 2, :], torch.zeros_like(got[..., 2, :]))
    testing.assert_close(got, want, **F64)


def test_tiled_padding_mask_as_the_model_builds_it(rng):
    """Left padding: sequence 0 has 3 padding keys; padding queries see nothing at all."""
    b, n = 2, 7
    q, k, v = qkv(rng, b, 2, 2, n, n, 4)
    real = torch.ones(b, n, dtype=torch.bool)
    real[0, :3] = False
    mask = (torch.ones(n, n, dtype=torch.bool).tril() & real[:, None, None, :]
            & real[:, None, :, None])                                     # (b, 1, n, n)
    got = tiled_attention(q, k, v, mask=mask, block_q=2, block_k=2)
    testing.assert_close(got, attention(q, k, v, mask=mask), **F64)
    assert torch.equal(got[0, :, :3], torch.zeros(2, 3, 4, dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 2), h_kv=st.integers(1, 2), group=st.integers(1, 3),
       n=st.integers(1, 12), extra=st.integers(0, 9), d_head=st.integers(1, 6),
       block_q=st.integers(1, 13), block_k=st.integers(1, 13), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_tiled_random_shapes_and_tiles(b, h_kv, group, n, extra, d_head, block_q, block_k,
                                       causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, b, h_kv * group, h_kv, n, n + extra, d_head)
    testing.assert_close(tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k),
                         attention(q, k, v, causal=causal), **F64)


class MatmulCounter(TorchFunctionMode):
    """Counts the matrix products a call performs (each key tile costs two: q k^T and p v), in
    whichever form: matmul, @, bmm, baddbmm (in place or not)."""

    PRODUCTS = (torch.Tensor.matmul, torch.Tensor.__matmul__, torch.matmul, torch.bmm,
                torch.Tensor.bmm, torch.baddbmm, torch.Tensor.baddbmm, torch.Tensor.baddbmm_)

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.PRODUCTS:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("n, m, block, tiles_causal", [
    (8, 8, 2, 1 + 2 + 3 + 4),       # the lower triangle of a 4 x 4 grid of tiles
    (4, 8, 2, 3 + 4),               # chunked prefill: queries are keys 4..7
    (1, 8, 2, 4),                   # decode: one query sees every key tile
])
def test_causal_skips_key_tiles_in_the_future(n, m, block, tiles_causal, rng):
    q, k, v = qkv(rng, 1, 1, 1, n, m, 3)
    tiles_all = math.ceil(n / block) * math.ceil(m / block)
    for causal, tiles in ((False, tiles_all), (True, tiles_causal)):
        with MatmulCounter() as counter:
            tiled_attention(q, k, v, causal=causal, block_q=block, block_k=block)
        assert counter.count == 2 * tiles


def test_tiled_on_meta_device():
    q = torch.empty(2, 4, 6, 8, device="meta")
    k = v = torch.empty(2, 2, 9, 8, device="meta")
    out = tiled_attention(q, k, v, causal=True, mask=torch.ones(6, 9, dtype=torch.bool,
                                                                   device="meta"),
                          block_q=4, block_k=4)
    assert out.device.type == "meta" and out.shape == (2, 4, 6, 8)
    assert online_softmax(torch.empty(3, 7, device="meta"), block=3).device.type == "meta"


def test_tiled_follows_dtype(rng):
    q, k, v = qkv(rng, 1, 2, 2, 5, 5, 4, dtype=torch.bfloat16)
    out = tiled_attention(q, k, v, causal=True, block_q=2, block_k=2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), attention(q.float(), k.float(), v.float(), causal=True),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(block_q=0), ValueError, "block_q"),
    (dict(block_k=-3), ValueError, "block_k"),
    (dict(block_k=2.5), TypeError, "block_k"),
    (dict(block_q=True), TypeError, "block_q"),
    (dict(causal=True, q_len=9), ValueError, "m >= n"),
    (dict(mask_dtype=torch.float32), TypeError, "mask"),
])
def test_tiled_bad_arguments(kwargs, error, words, rng):
    kwargs = dict(kwargs)                                        # the parameter itself stays intact
    q_len = kwargs.pop("q_len", 5)
    mask_dtype = kwargs.pop("mask_dtype", None)
    q, k, v = qkv(rng, 1, 2, 2, q_len, 6, 4)
    if mask_dtype is not None:
        kwargs["mask"] = torch.ones(q_len, 6, dtype=mask_dtype)
    with pytest.raises(error, match=words):
        tiled_attention(q, k, v, **kwargs)


def test_tiled_checks_like_attention(rng):
    q, k, v = qkv(rng, 1, 3, 2, 5, 6, 4)                         # 2 K/V heads cannot serve 3
    with pytest.raises(ValueError, match="h_kv"):
        tiled_attention(q, k, v)
    q, k, v = qkv(rng, 1, 2, 2, 5, 6, 4)
    with pytest.raises(TypeError, match="dtype"):
        tiled_attention(q.float(), k, v)
    with pytest.raises(TypeError, match="q"):
        tiled_attention(q.tolist(), k, v)
    with pytest.raises(ValueError, match="block"):
        online_softmax(q, block=0)


# --- the memory claim ---------------------------------------------------------------------------

@pytest.fixture
def one_thread():
    """Small tiles are slow when a busy machine's threads must synchronise for each tiny product;
    one thread keeps the n = 4096 run to a fraction of a second. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_tiled_peak_memory_far_below_the_score_matrix(one_thread, rng):
    n, d_head = 4096, 16
    q, k, v = qkv(rng, 1, 1, 1, n, n, d_head, dtype=torch.float32)
    score_bytes = n * n * 4                             # one (n, n) float32 matrix: 64 MiB
    explicit = peak_memory(attention, q, k, v, causal=True)
    tiled = peak_memory(tiled_attention, q, k, v, causal=True, block_q=256, block_k=256)
    assert explicit >= score_bytes, f"explicit peak {explicit} B < (n, n) scores {score_bytes} B"
    assert tiled < score_bytes / 16, f"tiled peak {tiled} B is not far below {score_bytes} B"
    assert tiled >= q.numel() * 4                                 # it does count the output


# --- the first tile's maximum as a kept shift ----------------------------------------------------

def climbing_keys(dtype, per_key):
    """One query of 10s against 12 keys (per_key j, ..., per_key j): its base-2 scores climb by
    80 per_key / sqrt(8) log2(e) = 40.8 per_key a key, so a shift kept from keys 0-3 overflows
    when the last key passes it by exp's range (2**128 in float32, 2**1024 in float64)."""
    q = torch.full((1, 1, 1, 8), 10.0, dtype=dtype)
    k = (torch.arange(12, dtype=dtype) * per_key)[:, None].expand(12, 8)[None, None]
    v = torch.randn(1, 1, 12, 8, generator=torch.Generator().manual_seed(0), dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype, per_key", [(torch.float32, 2.0), (torch.float64, 12.0)])
def test_a_kept_shift_that_overflows_is_computed_again_with_the_rescaling(dtype, per_key):
    q, k, v = climbing_keys(dtype, per_key)
    tiles = TileSource(q, k, v, causal=False, mask=None, group=1, block_q=4, block_k=4)
    assert not shift_held(*attend_query_tile(tiles, 0, 1, rescale=False))
    assert shift_held(*attend_query_tile(tiles, 0, 1, rescale=True))
    with MatmulCounter() as counter:
        got = tiled_attention(q, k, v, block_q=4, block_k=4)
    assert counter.count == 2 * 3 * 2                  # 3 key tiles, each pass
    want = attention(q.double(), k.double(), v.double())
    assert torch.isfinite(got).all()
    testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_ordinary_scores_keep_the_first_tiles_shift():
    q, k, v = climbing_keys(torch.float32, 0.25)    # 8 keys x 10.2 = 82 binades: in range
    tiles = TileSource(q, k, v, causal=False, mask=None, group=1, block_q=4, block_k=4)
    acc, total = attend_query_tile(tiles, 0, 1, rescale=False)
    assert shift_held(acc, total) and total.item() > 1e20   # weights far above 1, still exact
    with MatmulCounter() as counter:
        got = tiled_attention(q, k, v, block_q=4, block_k=4)
    assert counter.count == 2 * 3
    testing.assert_close(got.double(), attention(q.double(), k.double(), v.double()),
                         rtol=1e-5, atol=1e-6)


def test_a_query_that_sees_nothing_in_its_first_tile_cannot_lose_its_weights(rng):
    """Query 0's first key tile is masked: its kept shift would be 0, and its visible scores lie
    about 300 binades below it (exp2 underflows to 0 in float32): caught, rescaled, exact."""
    q = torch.full((1, 1, 2, 4), -10.0)
    k = torch.full((1, 1, 8, 4), 10.0)
    v = testing.randn(rng, 1, 1, 8, 4, dtype=torch.float32)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :4] = False
    tiles = TileSource(q, k, v, causal=False, mask=mask, group=1, block_q=2, block_k=4)
    assert not shift_held(*attend_query_tile(tiles, 0, 2, rescale=False))
    got = tiled_attention(q, k, v, mask=mask, block_q=2, block_k=4)
    want = attention(q.double(), k.double(), v.double(), mask=mask)
    testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert got[0, 0, 0].abs().sum() > 0                 # not the zeros of a query that saw nothing


@pytest.mark.parametrize("b, n", [(0, 5), (1, 0)])
def test_an_empty_batch_or_no_queries_gives_an_empty_output(b, n):
    q, k = torch.randn(b, 2, n, 4), torch.randn(b, 2, 7, 4)
    out = tiled_attention(q, k, k, causal=True, block_q=2, block_k=3)
    assert out.shape == (b, 2, n, 4)
