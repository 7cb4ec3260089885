"""Cheats on the op rules and the memory rule (issue 20), as real submissions.

Same form as tests/grading/cheats.py, whose CHEATS list these join: each starts from the released
notebook with every answer filled from solutions/, edits one answer cell, and states its score,
the test cells that fail and its honest score (the same answers without the cheat). The op rules
are allowlists (llmcheck.recorder: PRODUCTS, SOFTMAXES, ATTENTIONS), so a product or a softmax
reached through an op nobody listed is refused all the same ("not among the operations this test
allows"); the memory rule measures storages, so an (n, m) score matrix grown without a new
allocation (``resize_``, ``out=``, ``set_``, ``resize_as_``, a buffer made before the call) is
seen all the same ("elements in one storage").
"""

from __future__ import annotations

from cheats import DOT_AND_MATMUL, LIBRARY_MATMUL, MATMUL_CELLS, Cheat
from mutants import ATTENTION, MATMUL, Replace, Source

TILED = "07_tiled_attention"
UNLISTED = "is not among the operations this test allows"
SOFTMAX_CELLS = frozenset({"test_softmax", "test_softmax_large_hidden",
                           "test_softmax_masked_hidden"})
ATTENTION_CELLS = frozenset({"test_attention", "test_attention_hidden"})
MEMORY_CELLS = frozenset({"test_tiled_attention", "test_tiled_memory_hidden"})


def _dot(body: str) -> dict:
    return {"dot": Source(f"import torch.nn.functional as F\n\ndef dot(a, b):\n{body}")}


def _matmul(body: str) -> dict:
    return {"matmul": Replace(LIBRARY_MATMUL, f"{LIBRARY_MATMUL}\n    {body}")}


def _dot_cheat(student: str, why: str, body: str, op: str) -> Cheat:
    """dot through a product op outside PRODUCTS' allowlist; matmul, which calls dot, fails too
    (the shape error of test_matmul_error comes first and still passes): 4 of 12, as honest."""
    return Cheat(student, MATMUL, f"{why}; matmul calls it (honest: 4)", score=4,
                 failing=DOT_AND_MATMUL, honest=4, edits=_dot(body),
                 reasons={"test_dot": UNLISTED, "test_dot_hidden": op})


def _matmul_cheat(student: str, why: str, body: str, op: str) -> Cheat:
    return Cheat(student, MATMUL, f"{why} (honest: 7)", score=7, failing=MATMUL_CELLS, honest=7,
                 edits=_matmul(body), reasons={"test_matmul": UNLISTED, "test_matmul_hidden": op})


PRODUCT_CHEATS = [
    _dot_cheat("bilinear_dot", "dot by F.bilinear with an identity weight (aten._trilinear)",
               "    weight = torch.eye(a.shape[0], dtype=a.dtype)[None]\n"
               "    return F.bilinear(a[None], b[None], weight)[0, 0]\n", "aten._trilinear"),
    _dot_cheat("embedding_bag_dot",
               "dot by F.embedding_bag summing the rows of a, weighted per sample by b",
               "    rows = torch.arange(a.shape[0])[None]\n"
               "    return F.embedding_bag(rows, a[:, None], mode='sum',\n"
               "                           per_sample_weights=b[None])[0, 0]\n",
               "embedding_bag"),
    _dot_cheat("conv_tbc_dot", "dot by torch.conv_tbc: one time step, one batch, k channels",
               "    k = a.shape[0]\n"
               "    return torch.conv_tbc(a.view(1, 1, k), b.view(1, k, 1),\n"
               "                          torch.zeros(1, dtype=a.dtype))[0, 0, 0]\n",
               "aten.conv_tbc"),
    _dot_cheat("conv2d_dot", "dot by F.conv2d of a (1, 1, 1, k) image with a (1, 1, 1, k) kernel",
               "    k = a.shape[0]\n"
               "    return F.conv2d(a.view(1, 1, 1, k), b.view(1, 1, 1, k)).reshape(())\n",
               "convolution"),
    _dot_cheat("cdist_dot",
               "dot from distances, (|a|^2 + |b|^2 - |a - b|^2) / 2, with |a - b| by torch.cdist",
               "    distance = torch.cdist(a[None], b[None])[0, 0]\n"
               "    return ((a * a).sum() + (b * b).sum() - distance ** 2) / 2\n", "cdist"),
    _dot_cheat("fft_dot", "dot as the middle term of a convolution computed by FFT",
               "    k = a.shape[0]\n"
               "    spectrum = torch.fft.rfft(a, 2 * k) * torch.fft.rfft(b.flip(0), 2 * k)\n"
               "    return torch.fft.irfft(spectrum, 2 * k)[k - 1]\n", "fft"),
    _matmul_cheat("sparse_mm_matmul", "matmul by torch.sparse.mm on a made sparse",
                  "return torch.sparse.mm(a.to_sparse(), b)", "sparse"),
    _matmul_cheat("conv1d_matmul",
                  "matmul by F.conv1d: a's columns as channels, b's columns as 1-wide kernels",
                  "import torch.nn.functional as F\n"
                  "    return F.conv1d(a.t()[None], b.t()[:, :, None])[0].t()", "convolution"),
    _matmul_cheat("conv_tbc_matmul", "matmul by torch.conv_tbc, a's rows as the batch",
                  "return torch.conv_tbc(a[None], b[None], torch.zeros(m, dtype=a.dtype))[0]",
                  "aten.conv_tbc"),
    _matmul_cheat("linear_module_matmul", "matmul by an nn.Linear module holding b's transpose",
                  "layer = torch.nn.Linear(a.shape[1], m, bias=False).to(a.dtype)\n"
                  "    with torch.no_grad():\n"
                  "        layer.weight.copy_(b.t())\n"
                  "        return layer(a)", "aten.mm"),
    _matmul_cheat("baddbmm_matmul", "matmul by torch.baddbmm onto zeros",
                  "return torch.baddbmm(torch.zeros(1, n, m, dtype=a.dtype), a[None], b[None])[0]",
                  "aten.baddbmm"),
    _matmul_cheat("addmv_matmul", "matmul column by column with torch.addmv",
                  "return torch.stack([torch.addmv(torch.zeros(n, dtype=a.dtype), a, b[:, j])\n"
                  "                        for j in range(m)], dim=1)", "aten.addmv"),
    _matmul_cheat("mm_out_matmul", "matmul by torch.mm into a buffer given as out=",
                  "out = torch.empty(0, dtype=a.dtype)\n"
                  "    torch.mm(a, b, out=out)\n"
                  "    return out", "aten.mm"),
    _matmul_cheat("multi_dot_matmul", "matmul by torch.linalg.multi_dot",
                  "return torch.linalg.multi_dot([a, b])", "aten.mm"),
]


def _softmax_cheat(student: str, why: str, source: str) -> Cheat:
    """softmax_rows through an op no policy lists: refused under SOFTMAXES and, since attention
    calls softmax_rows, under ATTENTIONS too (3 of 13; honest, with torch.softmax: 8)."""
    return Cheat(student, ATTENTION, f"{why}; attention calls it (honest, with torch.softmax: 8)",
                 score=3, failing=SOFTMAX_CELLS | ATTENTION_CELLS, honest=8,
                 edits={"softmax_rows": Source(source)},
                 reasons={"test_softmax": UNLISTED, "test_attention": UNLISTED})


SOFTMAX_CHEATS = [
    _softmax_cheat("sparse_softmax",
                   "softmax_rows by torch.sparse.softmax on x as a sparse tensor with every entry "
                   "stored (a fully masked row's nan put back to 0)", '''
def softmax_rows(x):
    every = torch.ones_like(x).nonzero().t()                 # every entry, zeros included
    sparse = torch.sparse_coo_tensor(every, x.flatten(), x.shape)
    return torch.nan_to_num(torch.sparse.softmax(sparse, dim=-1).to_dense(), nan=0.0)
'''),
    _softmax_cheat("identity_attention_softmax",
                   "softmax_rows as F.scaled_dot_product_attention of x against identity keys "
                   "and values, scale 1 (its softmax is aten._safe_softmax)", '''
import torch.nn.functional as F

def softmax_rows(x):
    eye = torch.eye(x.shape[-1], dtype=x.dtype)
    return F.scaled_dot_product_attention(x[None], eye[None], eye[None], scale=1.0)[0]
'''),
    Cheat("softmin_softmax", ATTENTION,
          "softmax_rows as F.softmin of -x: torch's softmax by another name (honest, with "
          "torch.softmax: 8); attention may use a softmax, so only the softmax cells fail",
          score=8, failing=SOFTMAX_CELLS, honest=8,
          edits={"softmax_rows": Source('''
import torch.nn.functional as F

def softmax_rows(x):
    return F.softmin(-x, dim=-1)
''')}, reasons={"test_softmax": "aten._softmax"}),
]


_TILED = '''
def tiled_attention(q, k, v, block, causal=False):
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
{make}
    rows = torch.arange(n).unsqueeze(-1)
    for j0 in range(0, m, block):
        j1 = min(j0 + block, m)
        tile = q @ k[..., j0:j1, :].transpose(-2, -1) / math.sqrt(d_head)
        if causal:
            tile = tile.masked_fill(torch.arange(j0, j1) > rows + (m - n), float("-inf"))
        scores[..., j0:j1] = tile                    # the whole (..., n, m) fills up
    top = scores.amax(dim=-1, keepdim=True)
    scores.sub_(top).exp_()                          # in place: no new (n, m) tensor
    return scores @ v / scores.sum(dim=-1, keepdim=True)
'''


def _memory_cheat(student: str, why: str, make: str, prelude: str = "") -> Cheat:
    """tiled_attention holding the whole (..., n, m) score matrix in a storage grown without an
    allocation op: right everywhere, refused by both memory tests (10 of 15, as the honest whole
    score matrix)."""
    return Cheat(student, TILED, f"{why} (honest, allocating it: 10)", score=10,
                 failing=MEMORY_CELLS, honest=10,
                 edits={"tiled_attention": Source(prelude + _TILED.format(make=make))},
                 reasons={"test_tiled_attention": "elements in one storage",
                          "test_tiled_memory_hidden": "elements in one storage"})


MEMORY_CHEATS = [
    _memory_cheat("resize_scores", "the (n, m) scores in an empty tensor grown by resize_",
                  "    scores = q.new_empty(0)\n    scores.resize_(*q.shape[:-1], m)"),
    _memory_cheat("resize_as_scores",
                  "the (n, m) scores in an empty tensor grown by resize_as_ to an expanded view",
                  "    shape = k[..., :1, :1].transpose(-2, -1).expand(*q.shape[:-1], m)\n"
                  "    scores = q.new_empty(0).resize_as_(shape)"),
    Cheat("out_scores", TILED,
          "the whole q k^T at once by torch.matmul into an empty tensor given as out=, masked "
          "and normalised in place (honest, allocating it: 10)", score=10, failing=MEMORY_CELLS,
          honest=10, reasons={"test_tiled_attention": "elements in one storage"},
          edits={"tiled_attention": Source('''
def tiled_attention(q, k, v, block, causal=False):
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = q.new_empty(0)
    torch.matmul(q / math.sqrt(d_head), k.transpose(-2, -1), out=scores)   # resized by the op
    if causal:
        rows = torch.arange(n).unsqueeze(-1)
        for j0 in range(0, m, block):
            future = torch.arange(j0, min(j0 + block, m)) > rows + (m - n)
            scores[..., j0:j0 + block].masked_fill_(future, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    scores.sub_(top).exp_()
    return scores @ v / scores.sum(dim=-1, keepdim=True)
''')}),
    _memory_cheat("set_scores", "the (n, m) scores on a storage set_ into an empty tensor",
                  "    count = q[..., :1].numel() * m\n"
                  "    scores = q.new_empty(0)\n"
                  "    scores.set_(torch.UntypedStorage(count * q.element_size()), 0,\n"
                  "                (*q.shape[:-1], m))"),
    _memory_cheat("premade_buffer", "the (n, m) scores in a view of a buffer made before the call",
                  "    count = q[..., :1].numel() * m\n"
                  "    scores = SCRATCH[:count].view(*q.shape[:-1], m)",
                  prelude="SCRATCH = torch.zeros(2 * 3 * 64 * 128, dtype=torch.float64)\n"),
]

OP_CHEATS = PRODUCT_CHEATS + SOFTMAX_CHEATS + MEMORY_CHEATS
"""Appended to cheats.CHEATS (graded in tests/test_grading_verdicts.py's one cheat run)."""
