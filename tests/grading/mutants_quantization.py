"""Wrong submissions of exercise 10 (int8 and int4 quantization, a quantized linear layer), as
test data: each starts from the released notebook with every answer filled from solutions/ and
edits answer cells; each states its score and exactly which test cells fail
(tests/grading/mutants.py). The assignment has 18 points."""

from grading_mutants import Submission, Replace, Source  # noqa: F401

QUANT = "10_quantization"
INT8 = frozenset({"test_quantize_int8", "test_quantize_int8_hidden"})
UNPACKING = frozenset({"test_pack_int4", "test_pack_int4_hidden", "test_dequantize_int4",
                       "test_dequantize_int4_hidden", "test_quantized_linear",
                       "test_quantized_linear_hidden", "test_quantized_memory_hidden"})
LINEAR = frozenset({"test_quantized_linear", "test_quantized_linear_hidden",
                    "test_quantized_memory_hidden"})

WRONG = [
    Submission(
        "q_scale_per_row", QUANT,
        "the int8 scale is the largest |w| of each row (amax over dim 1, keepdim) instead of each "
        "output column: one scale per input row, (d_in, 1), and the wrong values",
        score=15, failing=INT8,
        edits={"quantize_int8": Replace("scale = w.abs().amax(dim=0) / 127",
                                        "scale = w.abs().amax(dim=1, keepdim=True) / 127")}),
    Submission(
        "q_divides_by_128", QUANT,
        "the int8 scale divides by 128 (the int8 range's size) instead of 127: the largest weight "
        "of a column lands on 128, clamped to 127, and every other value is off by 128/127",
        score=15, failing=INT8,
        edits={"quantize_int8": Replace("scale = w.abs().amax(dim=0) / 127",
                                        "scale = w.abs().amax(dim=0) / 128")}),
    Submission(
        "q_truncates", QUANT,
        "the int8 values are converted with .to(torch.int8) without rounding: truncation toward "
        "zero, up to a whole step off instead of half",
        score=15, failing=INT8,
        edits={"quantize_int8": Replace("values = torch.round(w / scale).clamp(-127, 127)",
                                        "values = (w / scale).clamp(-127, 127)")}),
    Submission(
        "q_zero_column", QUANT,
        "no guard for a column of zeros: its scale stays 0 and its values are round(0 / 0); right "
        "on every matrix without such a column, as in the visible test",
        score=16, failing=frozenset({"test_quantize_int8_hidden"}),
        edits={"quantize_int8": Replace(
            "scale = torch.where(scale == 0, torch.ones_like(scale), scale)", "")}),
    Submission(
        "q_torch_quantize", QUANT,
        "quantize_int8 hands the rounding to torch.quantize_per_channel (then int_repr): the right "
        "numbers from a library quantizer, which the tests refuse",
        score=15, failing=INT8,
        edits={"quantize_int8": Source('''
def quantize_int8(w):
    scale = w.abs().amax(dim=0) / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zeros = torch.zeros(w.shape[1], dtype=torch.long)
    quantized = torch.quantize_per_channel(w, scale.double(), zeros, 1, torch.qint8)
    return quantized.int_repr(), scale
''')}),
    Submission(
        "q_strided_groups", QUANT,
        "the int4 groups are cut with reshape(group, d_in // group, d_out) and reduced over dim 0: "
        "each 'group' is every (d_in // group)-th row, not g consecutive rows; dequantize_int4 "
        "makes the same mistake (the linear layer, which slices its own groups, is right)",
        score=13, failing=frozenset({"test_quantize_int4", "test_quantize_int4_hidden",
                                     "test_dequantize_int4", "test_dequantize_int4_hidden"}),
        edits={"quantize_int4": Source('''
def quantize_int4(w, group):
    d_in, d_out = w.shape
    if d_in % group:
        raise ValueError(f"quantize_int4: group {group} does not divide d_in {d_in}")
    groups = w.reshape(group, d_in // group, d_out)
    lo, hi = groups.amin(dim=0), groups.amax(dim=0)
    scale = (hi - lo) / 15
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = -lo / scale
    codes = torch.round(groups / scale + zero).clamp(0, 15)
    return codes.reshape(d_in, d_out).to(torch.uint8), scale, zero
'''),
               "dequantize_int4": Source('''
def dequantize_int4(packed, scale, zero, group):
    codes = unpack_int4(packed)
    d_in, d_out = codes.shape
    groups = codes.reshape(group, d_in // group, d_out).to(scale.dtype)
    return ((groups - zero) * scale).reshape(d_in, d_out)
''')}),
    Submission(
        "q_rounds_zero_point", QUANT,
        "the int4 zero point is rounded and clamped to [0, 15] before the codes are computed: "
        "wrong whenever -lo / scale is not a whole number, and badly wrong for a group whose "
        "weights all have one sign",
        score=15, failing=frozenset({"test_quantize_int4", "test_quantize_int4_hidden"}),
        edits={"quantize_int4": Replace("zero = -lo / scale ",
                                        "zero = torch.round(-lo / scale).clamp(0, 15) ")}),
    Submission(
        "q_constant_group", QUANT,
        "no guard for a group whose weights are all equal: scale 0, then 0 / 0 in its zero point "
        "and codes; right on every matrix without such a group, as in the visible test",
        score=16, failing=frozenset({"test_quantize_int4_hidden"}),
        edits={"quantize_int4": Replace(
            "scale = torch.where(scale == 0, torch.ones_like(scale), scale)", "")}),
    Submission(
        "q_nibbles_swapped", QUANT,
        "pack_int4 puts the even row in the high 4 bits and the odd row in the low 4 bits, and "
        "unpack_int4 reads them back the same way: the round trip holds, but the bytes are not the "
        "format's, so every packed matrix the tests hand over is read wrong",
        score=8, failing=UNPACKING,
        edits={"pack_int4": Source('''
def pack_int4(codes):
    return (codes[0::2] << 4) | codes[1::2]


def unpack_int4(packed):
    high, low = packed >> 4, packed & 15
    return torch.stack([high, low], dim=1).reshape(2 * packed.shape[0], packed.shape[1])
''')}),
    Submission(
        "q_unpack_concatenates", QUANT,
        "unpack_int4 concatenates all the low nibbles, then all the high ones (torch.cat along "
        "dim 0) instead of interleaving them: row order 0, 2, 4, ..., 1, 3, 5; right only for a "
        "single row of bytes (groups of 2 in the linear layer)",
        score=8, failing=UNPACKING,
        edits={"pack_int4": Replace(
            "return torch.stack([low, high], dim=1).reshape(2 * packed.shape[0], packed.shape[1])",
            "return torch.cat([low, high], dim=0)")}),
    Submission(
        "q_library_pack", QUANT,
        "pack_int4 and unpack_int4 are llmcore.quantize's own (imported): refused wherever they "
        "run, in dequantize_int4 and the linear layer too",
        score=8, failing=UNPACKING,
        edits={"pack_int4": Source('''
from llmcore.quantize import pack_int4, unpack_int4
''')}),
    Submission(
        "q_materialises", QUANT,
        "the linear layer dequantizes the whole matrix and multiplies once: the right numbers, "
        "but it holds all d_in x d_out weights, which the memory tests refuse",
        score=14, failing=frozenset({"test_quantized_linear", "test_quantized_memory_hidden"}),
        edits={"quantized_linear": Source('''
def quantized_linear(x, packed, scale, zero, group):
    return x @ dequantize_int4(packed, scale, zero, group)
''')}),
    Submission(
        "q_unpacks_everything", QUANT,
        "the linear layer dequantizes group by group, but unpacks every byte first: a (d_in, "
        "d_out) matrix of codes, as many elements as the whole matrix",
        score=14, failing=frozenset({"test_quantized_linear", "test_quantized_memory_hidden"}),
        edits={"quantized_linear": Source('''
def quantized_linear(x, packed, scale, zero, group):
    codes = unpack_int4(packed)                                     # (d_in, d_out) at once
    out = None
    for t in range(scale.shape[0]):
        tile = (codes[t * group:(t + 1) * group].to(scale.dtype) - zero[t]) * scale[t]
        part = x[..., t * group:(t + 1) * group] @ tile
        out = part if out is None else out + part
    return out
''')}),
    Submission(
        "q_group_bytes", QUANT,
        "the linear layer takes `group` rows of bytes per group instead of group // 2 (two weight "
        "rows per byte): every tile has the wrong rows, or twice too many",
        score=12, failing=LINEAR,
        edits={"quantized_linear": Replace("half = group // 2 ", "half = group ")}),
    Submission(
        "q_ignores_zero", QUANT,
        "the linear layer dequantizes each tile as codes * scale, forgetting the zero point",
        score=12, failing=LINEAR,
        edits={"quantized_linear": Replace("tile = (codes.to(scale.dtype) - zero[t]) * scale[t]",
                                           "tile = codes.to(scale.dtype) * scale[t]")}),
]
