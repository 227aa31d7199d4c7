"""The daemon's numerics in torch: quantizers and the GEMM contract of mx/README.md,
bit for bit, on any device.

    w = emulator.quantize(weight, "MXFP4")             # rows × K, blocks of 32 along K
    y = emulator.linear(emulator.quantize(x, "MXFP4"), w, bias)   # Y = X·Wᵀ + b, FP32
    dx = emulator.grad_input(dy, weight, "MXFP4")      # dY·W, dY blocked along N
    dw = emulator.grad_weight(dy, x, "MXFP4")          # dYᵀ·X, both blocked along M
    db = emulator.column_sums(dy)                      # Σ rows, FP32, rows ascending

What `offload(..., compute="local")` runs instead of calling the daemon. The
contract, and how each part is computed here exactly:

- **MX × MX.** Every element is an integer in units of its format's smallest step
  (fewer than 8 significant bits, below 2^32), so a block's dot product is a sum of
  32 integer products. It is computed in the cheapest arithmetic that is exact for
  the call's actual operands: FP32 matrix products while 32·max|x|·max|w| < 2^24
  (every partial sum an integer below 2^24, in any order: MXFP4, MXFP6 and MXINT8
  pairs), FP64 below 2^53 (MXFP8 E4M3), and otherwise (E5M2 with E4M3 or E5M2) 16-bit
  limbs whose four FP64 products recombine in int64. The exact dot times
  2^(scale_x + scale_w) is rounded once to FP32: in FP64 the scaling is exact, and
  a value carried with a sticky bit (round to odd) rounds correctly on conversion.
  Block results are added in FP32 in ascending block order from +0.0 or the bias.
- **INT8 × INT8.** The integer dot (exact in FP32 below 2^24, else FP64), then
  `float(dot)·sx·sw + bias` in FP32, left to right.
- **Everything else** (FP16, BF16, FP32, mixed kinds): both operands rounded to
  their formats, then one FP32 fused multiply-add per k, k ascending, from the
  bias: where the products are exact in FP32 (FP16 × FP16 always, BF16 × BF16 away
  from the extremes of its range) a multiply and an add; otherwise an FP64 sum
  rounded to odd, then to FP32 — a correctly rounded fma either way.

Only IEEE-exact operations are used (matrix products on integers whose every
partial sum is exact, element-wise +, ×, ÷, ldexp, conversions), so CPU and CUDA
give the same bits; TF32 is never needed (an FP32 product on the GPU with TF32 on
would still be exact: every MX element has at most 8 significant bits).
Memory stays bounded: block products are computed for as many blocks at once as
`MXSERVE_EMULATOR_TILE_BYTES` (default 256 MiB) allows.

The float path on CUDA defaults to one tensor-core GEMM with FP32 accumulation
(`MXSERVE_EMULATOR_FLOAT=fast`: within the contract's tolerance for float paths,
not the daemon's bits); `MXSERVE_EMULATOR_FLOAT=exact` keeps the fma chain there
too, and is the default on the CPU.

On CUDA, fused Triton kernels (`mxserve.torch.emulator_triton`) take the MX quantizer
(floor rule), every MX pair but those with E5M2, the float path and grad_bias
when Triton imports; `MXSERVE_EMULATOR_TRITON=0` keeps the plain path. Both give
the same bits (bench/gpu_check.py checks them against each other and the CPU).

Quantizers: MX blocks of 32 with round-to-nearest-even, ties-away or seeded
stochastic rounding and the floor, no-saturation, ceil or rceil scale rule
(mx/README.md "Quantizing a block"; tests/golden/scale_rules.json holds vectors for
all four rules), INT8 per row (scale = amax/127), BF16/FP16 by IEEE conversion,
FP32 as is. Stochastic rounding draws the daemon's bits (mx/stochastic.h): element
(i, j) of the tensor as the daemon receives it draws index i·width + j of the key
(seed, stream), the stream naming the operand (STREAMS), so `quantize(x, fmt,
"stochastic", seed=s, stream=STREAMS["forward_input"])` is the daemon's X of a
LayerForward with seed s, on any device.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import NamedTuple, Optional, Union

import numpy
import torch

__all__ = ["CodebookOperand", "FloatOperand", "FormatSpec", "Int8Operand", "LOBCQ_W4A4",
           "LoBcqGeometry", "LoBcqOperand", "MxOperand", "NvOperand", "Operand",
           "lobcq_codebooks", "quantize_lobcq", "STREAMS", "codebook_table", "nv_tensor_scale",
           "column_sums", "dequantize", "element_codes", "format_spec", "grad_input",
           "grad_weight", "linear", "path_for", "quantize", "scale_bytes", "stochastic_bits"]

BLOCK = 32
SCALE_BIAS = 127


@dataclasses.dataclass(frozen=True)
class FormatSpec:
    """One format's traits, as mx/format.cc's table has them."""
    name: str
    kind: str           # "mx_float", "mx_int", "int8", "float", "nv_float", "codebook", "lobcq"
    bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int
    emax: int           # exponent of the largest normal element (MX)
    max_normal: float
    specials: str       # "none", "e4m3" (NaN only), "ieee"

    @property
    def is_mx(self) -> bool:
        return self.kind in ("mx_float", "mx_int")

    @property
    def fraction_bits(self) -> int:
        """F: elements are integers in units of 2^-F (mx::FixedPointFractionBits)."""
        return 6 if self.kind == "mx_int" else self.mantissa_bits + self.bias - 1

    @property
    def max_fixed(self) -> float:
        """The largest element magnitude in units of 2^-F."""
        return self.max_normal * 2.0 ** self.fraction_bits


_SPECS = {s.name: s for s in (
    FormatSpec("MXFP8_E4M3", "mx_float", 8, 4, 3, 7, 8, 448.0, "e4m3"),
    FormatSpec("MXFP8_E5M2", "mx_float", 8, 5, 2, 15, 15, 57344.0, "ieee"),
    FormatSpec("MXFP6_E3M2", "mx_float", 6, 3, 2, 3, 4, 28.0, "none"),
    FormatSpec("MXFP6_E2M3", "mx_float", 6, 2, 3, 1, 2, 7.5, "none"),
    FormatSpec("MXFP4_E2M1", "mx_float", 4, 2, 1, 1, 2, 6.0, "none"),
    FormatSpec("MXINT8", "mx_int", 8, 0, 0, 0, 0, 127.0 / 64.0, "none"),
    FormatSpec("INT8", "int8", 8, 0, 0, 0, 0, 127.0, "none"),
    FormatSpec("BF16", "float", 16, 8, 7, 127, 127, 3.3895313892515355e38, "ieee"),
    FormatSpec("FP16", "float", 16, 5, 10, 15, 15, 65504.0, "ieee"),
    FormatSpec("FP32", "float", 32, 8, 23, 127, 127, 3.4028234663852886e38, "ieee"),
    FormatSpec("NVFP4", "nv_float", 4, 2, 1, 1, 2, 6.0, "none"),
    FormatSpec("NF4", "codebook", 4, 0, 0, 0, 0, 1.0, "none"),
    FormatSpec("BNB_FP4", "codebook", 4, 0, 0, 0, 0, 1.0, "none"),
    FormatSpec("LO_BCQ", "lobcq", 4, 0, 0, 0, 0, 31.0, "none"),
)}
NV_BLOCK = 16  # mx::kNvBlockSize
CODEBOOK_BLOCK = 64  # mx::kCodebookBlockSize
# mx/codebook.h: NF4's published FP32 values (sorted, code = index); bnb FP4's
# magnitudes by 3-bit code (its dequantization constants; bit 3 the sign) and its
# quantizer's thresholds between the ascending magnitudes (decimal literals).
_NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
_FP4 = (0.0, 5.208333333e-03, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25)
_FP4_ASCENDING = (0b000, 0b001, 0b110, 0b111, 0b100, 0b101, 0b010, 0b011)
_FP4_THRESHOLDS = (0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333)
_LOBCQ_DEFAULT = (  # mx/lobcq.cc's frozen set (mxserve.torch.lobcq.default_codebooks())
    (-31, -23, -18, -14, -10, -7, -4, -1, 1, 4, 7, 10, 14, 18, 23, 31),
    (-31, -23, -17, -13, -9, -6, -3, -1, 1, 3, 6, 9, 13, 17, 23, 31),
    (-29, -24, -19, -15, -11, -8, -4, -1, 1, 4, 7, 11, 15, 19, 24, 29),
    (-26, -22, -18, -14, -10, -7, -4, -1, 1, 4, 7, 10, 14, 18, 22, 26),
    (-24, -20, -16, -12, -9, -6, -4, -1, 1, 4, 6, 9, 12, 16, 20, 24),
    (-22, -19, -15, -12, -9, -6, -4, -1, 1, 3, 6, 9, 12, 15, 19, 22),
    (-21, -18, -14, -11, -8, -6, -3, -1, 1, 3, 6, 8, 11, 14, 18, 21),
    (-19, -16, -13, -10, -8, -5, -3, -1, 1, 3, 5, 8, 10, 13, 16, 19),
    (-18, -15, -12, -10, -7, -5, -3, -1, 1, 3, 5, 7, 10, 12, 15, 18),
    (-16, -14, -11, -9, -7, -5, -3, -1, 1, 3, 5, 7, 9, 11, 14, 16),
    (-15, -13, -11, -8, -6, -4, -3, -1, 1, 3, 4, 6, 8, 11, 13, 15),
    (-14, -12, -10, -8, -6, -4, -2, -1, 1, 2, 4, 6, 8, 10, 12, 14),
    (-13, -11, -9, -7, -5, -4, -2, -1, 1, 2, 4, 5, 7, 9, 11, 13),
    (-11, -10, -8, -6, -5, -3, -2, -1, 1, 2, 3, 5, 6, 8, 10, 11),
    (-10, -8, -7, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 7, 8, 10),
    (-7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8),
)
_ALIASES = {"MXFP8": "MXFP8_E4M3", "MXFP6": "MXFP6_E2M3", "MXFP4": "MXFP4_E2M1"}
ROUNDINGS = ("even", "away", "stochastic")
SCALE_RULES = ("floor", "no_saturation", "ceil", "rceil")
# The stochastic-rounding stream of each operand the daemon quantizes
# (mx::OperandStream).
STREAMS = {"gemm_a": 0, "gemm_b": 1, "forward_input": 2, "grad_output_rows": 3,
           "grad_output_columns": 4, "input_columns": 5}

_MASK32 = 0xFFFFFFFF


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    """C. Wellons' lowbias32 on int64 tensors holding 32-bit values (products
    wrap modulo 2^64 and are masked back to 32 bits)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def _lowbias32_int(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def stochastic_bits(seed: int, stream: int, index: torch.Tensor) -> torch.Tensor:
    """The 32 random bits (as int64 values in [0, 2^32)) that element `index`
    (int64, non-negative) draws under the key (seed, stream): mx::StochasticBits."""
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed: expected an integer in [0, 2^64), got {seed}")
    prefix = 0x9E3779B9
    for word in (seed & _MASK32, seed >> 32, stream & _MASK32):
        prefix = _lowbias32_int(prefix ^ word)
    h = _lowbias32(index.to(torch.int64).bitwise_and(_MASK32) ^ prefix)
    return _lowbias32(h ^ (index.to(torch.int64) >> 32))


_TRITON: list = []


def _triton(t: torch.Tensor):
    """The Triton kernels module for a CUDA tensor when it imports and is not
    disabled (MXSERVE_EMULATOR_TRITON=0), else None."""
    if not t.is_cuda or os.environ.get("MXSERVE_EMULATOR_TRITON", "1") == "0":
        return None
    if not _TRITON:
        try:
            from mxserve.torch import emulator_triton
        except Exception:  # no Triton, or one this code cannot use: the plain path
            emulator_triton = None
        _TRITON.append(emulator_triton)
    return _TRITON[0]


def format_spec(fmt: Union[str, FormatSpec]) -> FormatSpec:
    """The traits of a format by name (case-insensitive; MXFP8/MXFP6/MXFP4 aliases)."""
    if isinstance(fmt, FormatSpec):
        return fmt
    name = str(fmt).upper()
    name = _ALIASES.get(name, name)
    if name not in _SPECS:
        raise ValueError(f"format: unknown format {fmt!r}; expected one of "
                         f"{', '.join(_SPECS)} (or mxfp8, mxfp6, mxfp4)")
    return _SPECS[name]


# --- operands --------------------------------------------------------------------------


class MxOperand(NamedTuple):
    """rows × cols quantized in blocks of 32 along cols. `fixed[r, b, i]` is element
    i of block b as an integer in units of 2^-F (FP32, exact; padding 0), `exponent`
    the shared scale's exponent (byte - 127), `nan` the blocks whose scale is NaN."""
    spec: FormatSpec
    fixed: torch.Tensor      # [rows, blocks, 32] float32
    exponent: torch.Tensor   # [rows, blocks] int32
    nan: torch.Tensor        # [rows, blocks] bool
    cols: int


class Int8Operand(NamedTuple):
    """rows × cols of INT8 codes (as float32 integers) and one FP32 scale per row."""
    spec: FormatSpec
    codes: torch.Tensor      # [rows, cols] float32 in -127..127
    scale: torch.Tensor      # [rows] float32 (NaN: the row held NaN or Inf)
    cols: int


class FloatOperand(NamedTuple):
    """rows × cols rounded to BF16, FP16 or FP32, widened to FP32."""
    spec: FormatSpec
    values: torch.Tensor     # [rows, cols] float32
    cols: int


class NvOperand(NamedTuple):
    """An NVFP4 operand: the E2M1 elements in units of 2^-1 as floats [rows, blocks,
    16], the UE4M3 block scales' values [rows, blocks] (NaN for a NaN block), and
    the tensor scale each row was quantized under [rows]."""
    spec: FormatSpec
    fixed: torch.Tensor
    scale: torch.Tensor
    tensor_scale: torch.Tensor
    cols: int


class CodebookOperand(NamedTuple):
    """An NF4 or BNB_FP4 operand: the 4-bit codes [rows, blocks, 64] (int64; the
    padding holds the code of 0) and each block's FP32 absmax [rows, blocks]
    (NaN for a block that held NaN or Inf)."""
    spec: FormatSpec
    codes: torch.Tensor
    absmax: torch.Tensor
    cols: int


Operand = Union[MxOperand, Int8Operand, FloatOperand, NvOperand, CodebookOperand,
                "LoBcqOperand"]


def codebook_table(fmt: Union[str, FormatSpec]) -> torch.Tensor:
    """The 16 FP32 values of a codebook format by code (mx::CodebookTable)."""
    spec = format_spec(fmt)
    # Decimal → FP64 → FP32: the golden vectors (exact decimal → FP32) hold these
    # to the same FP32 values.
    if spec.name == "NF4":
        return torch.tensor(_NF4, dtype=torch.float64).float()
    magnitude = torch.tensor(_FP4, dtype=torch.float64).float()
    return torch.cat([magnitude, -magnitude])


def _codebook_thresholds(values: torch.Tensor) -> torch.Tensor:
    """FP32 nearest each exact midpoint of neighbouring (sorted) FP32 values."""
    d = values.double()
    return ((d[:-1] + d[1:]) / 2.0).float()


def _codebook_codes(spec: FormatSpec, n: torch.Tensor) -> torch.Tensor:
    """mx::CodebookCode of normalized FP32 values: how many thresholds each is
    strictly above (NF4), or the same over |n| with the sign of n < 0 (FP4)."""
    table = codebook_table(spec).to(n.device)
    if spec.name == "NF4":
        return (n[..., None] > _codebook_thresholds(table)).sum(-1)
    ascending = torch.tensor(_FP4_ASCENDING, dtype=torch.int64, device=n.device)
    thresholds = torch.tensor(_FP4_THRESHOLDS, dtype=torch.float64, device=n.device).float()
    index = (n.abs()[..., None] > thresholds).sum(-1)
    return ascending[index] | ((n < 0).to(torch.int64) << 3)


def _quantize_codebook(spec: FormatSpec, x: torch.Tensor) -> CodebookOperand:
    """mx::QuantizeCodebookBlock per block of 64: n = x · fp32(1 / absmax) (one
    division x / absmax where the reciprocal overflows), the codes of n; a NaN/Inf
    block absmax NaN, it and an all-zero block the codes of 0."""
    v, nan, amax = _blocks(x, CODEBOOK_BLOCK)
    zero_code = 7 if spec.name == "NF4" else 0
    reciprocal = 1.0 / amax
    n = v * reciprocal[:, :, None]
    overflowed = ~torch.isfinite(reciprocal) & (amax > 0)
    if bool(overflowed.any()):  # rare: absmax below 2^-128 divides once instead
        n = torch.where(overflowed[:, :, None], v / torch.where(overflowed, amax, 1.0)[:, :, None],
                        n)
    codes = _codebook_codes(spec, torch.where(torch.isfinite(n), n, torch.zeros_like(n)))
    plain = (~nan & (amax > 0))[:, :, None]
    codes = torch.where(plain, codes, torch.full_like(codes, zero_code))
    absmax = torch.where(nan, torch.full_like(amax, float("nan")), amax)
    return CodebookOperand(spec, codes.contiguous(), absmax.contiguous(), x.shape[1])


# --- LO-BCQ (mx/lobcq.h) ---------------------------------------------------------------
#
# Block-clustered quantization: along K, arrays of `array_len` values share one
# FP32 scale s = fp32(amax / 31); each block of `block_len` values inside picks
# one of `codebooks` codebooks (its selector), each of 16 INT6 entries in
# [-31, 31]; an element's 4-bit code indexes its block's codebook and stands for
# fp32(entry · s). The choice is exact integer arithmetic on a grid: the scaled
# value y = fp32(x / s), clamped to [-32, 32], as t = rint(256·y); a block takes
# the codebook with the least Σ min_k (t − 256·entry_k)² (the first on ties), an
# element the entry nearest t (the first on ties). A NaN/Inf array has scale NaN,
# selectors and codes 0; an array whose scale is 0 (all zero, or amax so small
# that amax / 31 underflows) is chosen as if every t were 0.

LOBCQ_ENTRY_MAX = 31  # INT6 codebook entries
LOBCQ_GRID = 256      # t: scaled values in units of 1/256


@dataclasses.dataclass(frozen=True)
class LoBcqGeometry:
    """The shape of a LO-BCQ quantization (mx::LoBcqGeometry): block length,
    block-array length (the scale's span) and number of codebooks (≤ 16: a 4-bit
    selector); every codebook has 16 INT6 entries (4-bit codes)."""
    block_len: int = 8
    array_len: int = 64
    codebooks: int = 16

    def __post_init__(self):
        if not 1 <= self.block_len <= 64:
            raise ValueError(f"block_len: expected 1 to 64, got {self.block_len}")
        if not (self.block_len <= self.array_len <= 256 and self.array_len % self.block_len == 0):
            raise ValueError(f"array_len: expected a multiple of block_len ({self.block_len}) "
                             f"up to 256, got {self.array_len}")
        if not 1 <= self.codebooks <= 16:
            raise ValueError(f"codebooks: expected 1 to 16, got {self.codebooks}")

    @property
    def blocks_per_array(self) -> int:
        return self.array_len // self.block_len

    @property
    def bits_per_element(self) -> float:
        """4-bit codes, plus the selectors' and the FP32 scale's share."""
        return 4.0 + math.log2(self.codebooks) / self.block_len + 32.0 / self.array_len


LOBCQ_W4A4 = LoBcqGeometry()  # the LO_BCQ format: the paper's W4A4 point (Lb 8, Nc 16)


class LoBcqOperand(NamedTuple):
    """A LO-BCQ operand: codes [rows, arrays, array_len] and selectors [rows,
    arrays, blocks per array] (int64; padding 0), each array's FP32 scale [rows,
    arrays] (NaN for an array that held NaN or Inf), the codebooks [Nc, 16]
    (int64 INT6 entries) and the geometry."""
    spec: FormatSpec
    codes: torch.Tensor
    selectors: torch.Tensor
    scale: torch.Tensor
    codebooks: torch.Tensor
    geometry: LoBcqGeometry
    cols: int


def lobcq_codebooks(codebooks=None, geometry: LoBcqGeometry = LOBCQ_W4A4) -> torch.Tensor:
    """Codebooks as an int64 [Nc, 16] tensor, checked: the LO_BCQ format's frozen
    set (mx::DefaultLoBcqCodebooks) when None."""
    if codebooks is None:
        if geometry.codebooks != 16:
            raise ValueError("codebooks: the default set has 16 codebooks; pass your own for "
                             f"geometry.codebooks = {geometry.codebooks}")
        codebooks = _LOBCQ_DEFAULT
    books = torch.as_tensor(codebooks).cpu()
    if books.is_floating_point() and not bool((books == books.round()).all()):
        raise ValueError("codebooks: expected integer entries")
    books = books.to(torch.int64)
    if tuple(books.shape) != (geometry.codebooks, 16):
        raise ValueError(f"codebooks: expected shape ({geometry.codebooks}, 16), "
                         f"got {tuple(books.shape)}")
    if bool((books.abs() > LOBCQ_ENTRY_MAX).any()):
        raise ValueError(f"codebooks: entries are INT6, expected -{LOBCQ_ENTRY_MAX} to "
                         f"{LOBCQ_ENTRY_MAX}, got {int(books.min())} to {int(books.max())}")
    return books


def lobcq_grid(x: torch.Tensor, array_len: int):
    """x [rows, cols] FP32 by arrays: t [rows, arrays, array_len] (int64, padding 0),
    the scales [rows, arrays] (FP32, NaN for NaN/Inf arrays)."""
    v, nan, amax = _blocks(x, array_len)
    s = _f32_div(amax, torch.full_like(amax, float(LOBCQ_ENTRY_MAX)))
    live = ~nan & (s > 0)
    y = _f32_div(v, torch.where(live, s, torch.ones_like(s))[:, :, None])
    y = torch.where(live[:, :, None], torch.clamp(y, -32.0, 32.0), torch.zeros_like(y))
    t = torch.round(y * float(LOBCQ_GRID)).to(torch.int64)  # half to even, as rint
    return t, torch.where(nan, torch.full_like(s, float("nan")), s)


def lobcq_select(t: torch.Tensor, books: torch.Tensor, block_len: int,
                 counted: Optional[torch.Tensor] = None):
    """The selector of each block of t [..., blocks·block_len] and the code of each
    value: (selectors [..., blocks], codes like t, squared errors [..., blocks]).
    `counted` (bool like t) leaves padding out of the block errors."""
    shape = t.shape
    blocks = t.reshape(*shape[:-1], shape[-1] // block_len, block_len)
    grid = (books.to(t.device) * LOBCQ_GRID)  # [Nc, 16]
    index16 = torch.arange(16, device=t.device)
    best_key = best_codes = None
    for j in range(grid.shape[0]):
        d = blocks[..., None] - grid[j]
        key = (d * d) * 16 + index16  # the first entry on ties
        element = key.min(dim=-1).values
        codes = element & 15
        err = element >> 4
        if counted is not None:
            err = err * counted.reshape(blocks.shape)
        block_err = err.sum(dim=-1)
        block_key = block_err * 16 + j  # the first codebook on ties
        if best_key is None:
            best_key, best_codes = block_key, codes
        else:
            better = block_key < best_key
            best_key = torch.where(better, block_key, best_key)
            best_codes = torch.where(better[..., None], codes, best_codes)
    return best_key & 15, best_codes.reshape(shape), best_key >> 4


def quantize_lobcq(x: torch.Tensor, codebooks=None,
                   geometry: LoBcqGeometry = LOBCQ_W4A4) -> LoBcqOperand:
    """mx::QuantizeLoBcqArray over x [rows, cols] along cols. `codebooks`: int
    [Nc, 16] INT6 entries (the format's frozen set when None) — calibrate a layer's
    own with mxserve.torch.lobcq.calibrate."""
    x = _as_float32(x, "x")
    books = lobcq_codebooks(codebooks, geometry)
    rows, cols = x.shape
    t, scale = lobcq_grid(x, geometry.array_len)
    counted = torch.zeros_like(t, dtype=torch.bool)
    counted.view(rows, -1)[:, :cols] = True
    # Rows in chunks: the search holds 16 int64s per value and codebook.
    step = max(1, (1 << 22) // max(1, t.shape[1] * t.shape[2] * 16))
    selectors, codes = [], []
    for r in range(0, rows, step):
        sel, code, _ = lobcq_select(t[r:r + step], books, geometry.block_len, counted[r:r + step])
        selectors.append(sel)
        codes.append(code)
    selectors = torch.cat(selectors) if selectors else torch.zeros(
        0, t.shape[1], geometry.blocks_per_array, dtype=torch.int64, device=t.device)
    codes = torch.cat(codes) if codes else torch.zeros_like(t)
    nan = torch.isnan(scale)
    selectors = torch.where(nan[:, :, None], torch.zeros_like(selectors), selectors)
    codes = torch.where(nan[:, :, None] | ~counted, torch.zeros_like(codes), codes)
    return LoBcqOperand(_SPECS["LO_BCQ"], codes.contiguous(), selectors.contiguous(),
                        scale.contiguous(), books, geometry, cols)


def _dequantize_lobcq(op: LoBcqOperand) -> torch.Tensor:
    g = op.geometry
    sel = op.selectors.repeat_interleave(g.block_len, dim=2)
    entries = op.codebooks.to(op.codes.device)[sel, op.codes].float()
    values = entries * op.scale[:, :, None]  # one FP32 multiply
    return values.reshape(values.shape[0], -1)[:, :op.cols]


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^e in FP64, exactly, for integer e in [-1022, 1023], built from its bits
    (torch.ldexp computes 2^e in the default dtype, FP32, first)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def _ldexp(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x · 2^e for FP64 x, exact while the result stays normal."""
    return x * _pow2(exponent)


def _floor_log2(magnitude: torch.Tensor) -> torch.Tensor:
    """floor(log2 |v|) of positive FP64 values, exactly (from the exponent bits)."""
    return torch.frexp(magnitude)[1].to(torch.int32) - 1


def _ceil_log2(magnitude: torch.Tensor) -> torch.Tensor:
    """ceil(log2 |v|) of positive FP64 values, exactly: the floor, plus one unless
    the value is a power of two (frexp's mantissa exactly 1/2)."""
    mantissa, exponent = torch.frexp(magnitude)
    return exponent.to(torch.int32) - (mantissa == 0.5).to(torch.int32)


def _round(u: torch.Tensor, rounding: str, bits: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Non-negative FP64 values to integers: ties to even, away from zero, or
    stochastically — up iff the fraction times 2^32 exceeds the element's `bits`
    (exact: the fraction of an FP32 value scaled by a power of two has at most 24
    significant bits, and the bits are integers below 2^32)."""
    if rounding == "stochastic":
        low = torch.floor(u)
        return low + ((u - low) * 2.0 ** 32 > bits.double()).double()
    return torch.round(u) if rounding == "even" else torch.floor(u + 0.5)


def _round_elements(spec: FormatSpec, t: torch.Tensor, rounding: str,
                    bits: Optional[torch.Tensor] = None) -> torch.Tensor:
    """|t| (FP64, already divided by the block's scale) rounded to the element grid
    and clamped to max normal: the magnitude the element code stands for."""
    a = t.abs()
    if spec.kind == "mx_int":
        # max_normal·64 = 127 (infinite for no_saturation's unclamped rounding).
        return torch.clamp(_round(a * 64.0, rounding, bits), max=spec.max_normal * 64.0) / 64.0
    emin = 1 - spec.bias
    safe = torch.where(a > 0, a, torch.ones_like(a))
    step = torch.clamp(_floor_log2(safe), min=emin) - spec.mantissa_bits
    magnitude = _ldexp(_round(_ldexp(a, -step), rounding, bits), step)
    return torch.clamp(torch.where(a > 0, magnitude, a), max=spec.max_normal)


def _as_float32(x: torch.Tensor, what: str) -> torch.Tensor:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{what}: expected a float32, float16 or bfloat16 tensor, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{what}: expected a 2-D tensor [rows, K], got shape {tuple(x.shape)}")
    return x.float()  # BF16 and FP16 widen exactly


def quantize(x: torch.Tensor, fmt: Union[str, FormatSpec], rounding: str = "even",
             scale_rule: str = "floor", *, seed: Optional[int] = None, stream: int = 0,
             transposed: bool = False, index_offset: int = 0,
             index_row_stride: Optional[int] = None,
             tensor_scale: Optional[float] = None) -> Operand:
    """x [rows, K] (FP32, BF16 or FP16) quantized along K as the daemon does
    (mx::QuantizeRows). `rounding` "even", "away" or "stochastic", `scale_rule`
    "floor", "no_saturation", "ceil" or "rceil" (MX formats; INT8 rounds with
    `rounding` too).

    Stochastic rounding needs `seed` and draws, for x[r, c], the index
    index_offset + r·stride + c (stride: index_row_stride, else K) of (seed,
    stream) — or, with `transposed` (x is the transpose of the tensor the daemon
    was sent, as for grad_weight's operands), index_offset + c·stride + r
    (stride: else rows).

    NVFP4 (mx/quantize.h, QuantizeNvBlock) takes its tensor scale from x's largest
    finite magnitude (nv_tensor_scale), or `tensor_scale` when given; the scale
    rule does not apply to it."""
    spec = format_spec(fmt)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: expected one of {ROUNDINGS}, got {rounding!r}")
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule: expected one of {SCALE_RULES}, got {scale_rule!r}")
    if spec.kind == "codebook":  # its thresholds decide, whatever the rounding
        return _quantize_codebook(spec, _as_float32(x, "x"))
    if spec.kind == "lobcq":  # its codebooks decide, whatever the rounding
        return quantize_lobcq(x)
    if rounding == "stochastic" and seed is None:
        raise ValueError("seed: required with rounding='stochastic' (the random bits' key)")
    x = _as_float32(x, "x")
    rows, cols = x.shape
    if spec.kind == "float":
        if spec.name == "BF16":
            x = x.to(torch.bfloat16).float()
        elif spec.name == "FP16":
            x = x.half().float()
        return FloatOperand(spec, x.contiguous(), cols)
    bits = None
    block = BLOCK if spec.is_mx else NV_BLOCK if spec.kind == "nv_float" else 0
    if rounding == "stochastic":
        bits = _draws(seed, stream, rows, cols, -(-cols // block) * block if block else cols,
                      transposed, index_offset, index_row_stride, x.device)
    if spec.kind == "nv_float":
        return _quantize_nv(spec, x, rounding, bits, tensor_scale)
    if spec.kind == "int8":
        return _quantize_int8(spec, x, rounding, bits)
    kernels = _triton(x) if scale_rule == "floor" and bits is None else None
    if kernels is not None:
        return MxOperand(spec, *kernels.quantize_mx(x, spec, rounding), cols)
    return _quantize_mx(spec, x, rounding, scale_rule, bits)


def _f32_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b as one IEEE FP32 division, on any device: the FP64 quotient of two FP32
    values rounded to FP32 is the correctly rounded FP32 quotient (53 >= 2·24 + 2)."""
    return (a.double() / b.double()).float()


def nv_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor scale of x (mx::NvTensorScale(FiniteAmax)): fp32(amax / 2688),
    amax the largest finite |value|, or 1 where that is not a normal FP32 number.
    A 0-d FP32 tensor on x's device."""
    magnitude = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))
    amax = magnitude.amax() if x.numel() else torch.zeros((), device=x.device)
    scale = _f32_div(amax, torch.full_like(amax, 2688.0))
    return torch.where(scale >= 2.0 ** -126, scale, torch.ones_like(scale))


def _round_e4m3(s: torch.Tensor) -> torch.Tensor:
    """Positive FP32 values in [2^-6, 448] rounded to UE4M3 (nearest, ties to even):
    three fraction bits at each value's own exponent."""
    d = s.double()
    step = _pow2(_floor_log2(d) - 3)
    return (torch.round(d / step) * step).float()


def _blocks(x: torch.Tensor, size: int):
    """x [rows, cols] padded with zeros to whole blocks along cols: the blocks
    [rows, blocks, size], whether each holds NaN or Inf, and each block's largest
    magnitude as FP32 (0 for those), compared as bits as mx does."""
    rows, cols = x.shape
    blocks = -(-cols // size)
    padded = torch.zeros(rows, blocks * size, dtype=torch.float32, device=x.device)
    padded[:, :cols] = x
    v = padded.view(rows, blocks, size)
    max_bits = (v.view(torch.int32) & 0x7FFFFFFF).amax(dim=2)
    nan = max_bits >= 0x7F800000
    amax = torch.where(nan, torch.zeros_like(max_bits), max_bits).view(torch.float32)
    return v, nan, amax


def _quantize_nv(spec: FormatSpec, x: torch.Tensor, rounding: str, bits: Optional[torch.Tensor],
                 tensor_scale: Optional[float]) -> NvOperand:
    rows, cols = x.shape
    v, nan, amax = _blocks(x, NV_BLOCK)
    # A positive finite tensor scale is used as given; anything else is computed
    # (mx::BringsTensorScale).
    given = tensor_scale is not None and 0.0 < float(tensor_scale) <= 3.4028234663852886e38
    ts = torch.tensor(float(tensor_scale), dtype=torch.float32, device=x.device) if given \
        else nv_tensor_scale(x)
    s = _f32_div(_f32_div(amax, torch.full_like(amax, 6.0)), ts.expand_as(amax))
    scale = _round_e4m3(torch.clamp(s, min=2.0 ** -6, max=448.0))
    total = (ts.double() * scale.double()).float()
    q = torch.clamp(_f32_div(v, total[:, :, None]), min=-6.0, max=6.0)
    t = torch.where(nan[:, :, None], torch.zeros_like(q), q).double()
    magnitude = _round_elements(spec, t, rounding,
                                None if bits is None else bits.view(v.shape))
    fixed = torch.copysign(magnitude * 2.0, t) + 0.0
    scale = torch.where(nan, torch.full_like(scale, float("nan")), scale)
    return NvOperand(spec, fixed.float().contiguous(), scale.contiguous(),
                     ts.expand(rows).contiguous(), cols)


def _draws(seed: int, stream: int, rows: int, cols: int, padded_cols: int, transposed: bool,
           offset: int, stride: Optional[int], device) -> torch.Tensor:
    """[rows, padded_cols] random bits of x's elements (padding draws too: its
    zeros never round)."""
    r = torch.arange(rows, dtype=torch.int64, device=device)[:, None]
    c = torch.arange(padded_cols, dtype=torch.int64, device=device)[None, :]
    if transposed:
        index = offset + c * (rows if stride is None else stride) + r
    else:
        index = offset + r * (cols if stride is None else stride) + c
    return stochastic_bits(seed, stream, index)


def _quantize_int8(spec: FormatSpec, x: torch.Tensor, rounding: str,
                   bits: Optional[torch.Tensor] = None) -> Int8Operand:
    finite = torch.isfinite(x).all(dim=1)
    amax = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x)).amax(dim=1) \
        if x.shape[1] else torch.zeros(x.shape[0], device=x.device)
    # Both as one IEEE FP32 division on every device (_f32_div; CUDA divides by a
    # scalar as a multiply by its reciprocal).
    scale = _f32_div(amax, torch.full_like(amax, 127.0))
    q = _f32_div(x, scale[:, None])
    magnitude = torch.clamp(_round(q.abs().double(), rounding, bits), max=127.0)
    codes = torch.where(torch.isnan(q), torch.zeros_like(q),
                        torch.copysign(magnitude.float(), q))
    live = (finite & (amax > 0))[:, None]
    codes = torch.where(live, codes, torch.zeros_like(codes))
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    return Int8Operand(spec, codes.contiguous(), scale, x.shape[1])


def _quantize_mx(spec: FormatSpec, x: torch.Tensor, rounding: str, scale_rule: str,
                 bits: Optional[torch.Tensor] = None) -> MxOperand:
    cols = x.shape[1]
    v, nan, amax = _blocks(x, BLOCK)
    amax = amax.double()
    positive = amax > 0
    safe = torch.where(positive, amax, torch.ones_like(amax))
    if scale_rule == "ceil":
        # ceil(log2(amax)) - emax: the floor's, plus one unless amax is a power of two.
        exponent = _ceil_log2(safe) - spec.emax
    elif scale_rule == "rceil":
        # ceil(log2(q)), q = amax / max_normal rounded once to FP32 (nearest even,
        # subnormals kept; 0 gives -127). The FP64 quotient rounds to FP32 as the FP32
        # division would: max_normal is 7, 15, 3 or 127 times a power of two, so an
        # inexact quotient's binary expansion repeats a 2-, 3-, 4- or 7-bit pattern
        # that is neither all 0s nor all 1s, and its FP64 rounding can never land on
        # an FP32 rounding boundary (a midpoint or a value) it was not already on
        # (checked against numpy's FP32 division for every positive FP32 amax).
        # Divided by a tensor: CUDA divides by a scalar as a multiply by its reciprocal.
        q = (safe / torch.full_like(safe, spec.max_normal)).float().double()
        positive = positive & (q > 0)
        exponent = _ceil_log2(torch.where(positive, q, torch.ones_like(q)))
    else:
        exponent = _floor_log2(safe) - spec.emax
    exponent = torch.clamp(exponent, -SCALE_BIAS, SCALE_BIAS)
    exponent = torch.where(positive, exponent, torch.full_like(exponent, -SCALE_BIAS))
    if scale_rule == "no_saturation":
        # One more where amax/2^e would round past max normal (no element clamped);
        # stochastic rounding decides it as nearest even does.
        scaled_amax = _ldexp(amax, -exponent)
        unclamped = _round_elements(dataclasses.replace(spec, max_normal=float("inf")),
                                    scaled_amax, "even" if rounding == "stochastic" else rounding)
        bump = positive & (unclamped > spec.max_normal) & (exponent < SCALE_BIAS)
        exponent = exponent + bump.to(exponent.dtype)
    t = torch.where(nan[:, :, None], torch.zeros_like(v), v).double()
    t = _ldexp(t, -exponent[:, :, None])
    magnitude = _round_elements(spec, t, rounding, None if bits is None else bits.view(v.shape))
    # + 0.0: no -0 element, so that no block dot is -0 (the daemon's integer dot
    # of zeros is +0).
    fixed = torch.copysign(magnitude * 2.0 ** spec.fraction_bits, t) + 0.0
    return MxOperand(spec, fixed.float().contiguous(), exponent.to(torch.int32).contiguous(), nan,
                     cols)


def dequantize(op: Operand) -> torch.Tensor:
    """The FP32 values an operand stands for, [rows, cols]."""
    if isinstance(op, FloatOperand):
        return op.values
    if isinstance(op, Int8Operand):
        return op.codes * op.scale[:, None]
    if isinstance(op, LoBcqOperand):
        return _dequantize_lobcq(op)
    if isinstance(op, CodebookOperand):
        table = codebook_table(op.spec).to(op.codes.device)
        values = table[op.codes] * op.absmax[:, :, None]  # one FP32 multiply
        return values.reshape(values.shape[0], -1)[:, :op.cols]
    if isinstance(op, NvOperand):
        # (element · S) exact, then · the tensor scale: one FP32 rounding.
        values = (op.fixed * 0.5 * op.scale[:, :, None]) * op.tensor_scale[:, None, None]
        return values.reshape(values.shape[0], -1)[:, :op.cols]
    values = (op.fixed.double() * _block_factors(op)[:, :, None]).float()
    return values.reshape(values.shape[0], -1)[:, :op.cols]


def scale_bytes(op: MxOperand) -> torch.Tensor:
    """The E8M0 scale bytes, [rows, blocks] uint8 (255: NaN)."""
    return torch.where(op.nan, torch.full_like(op.exponent, 255),
                       op.exponent + SCALE_BIAS).to(torch.uint8)


def nv_scale_bytes(op: NvOperand) -> torch.Tensor:
    """NVFP4's UE4M3 block scale bytes, [rows, blocks] uint8 (0x7F: NaN)."""
    d = torch.where(torch.isnan(op.scale), torch.ones_like(op.scale), op.scale).double()
    exponent = _floor_log2(d).to(torch.int64)  # >= -6: the scales are clamped there
    mantissa = (d / _pow2(exponent - 3)).to(torch.int64) - 8
    code = ((exponent + 7) << 3) | mantissa
    return torch.where(torch.isnan(op.scale), torch.full_like(code, 0x7F), code).to(torch.uint8)


def element_codes(op: Union[MxOperand, NvOperand, CodebookOperand],
                  signs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The element codes, one per byte, [rows, cols] uint8. `signs` (the input, or
    anything with its signs) sets the sign bit of codes that rounded to zero;
    without it they are +0. A block whose scale is NaN has codes 0, as
    mx::QuantizeBlock writes them, whatever the signs. A codebook operand's codes
    are its own (signs are not read)."""
    if isinstance(op, (CodebookOperand, LoBcqOperand)):
        return op.codes.reshape(op.codes.shape[0], -1)[:, :op.cols].to(torch.uint8)
    spec = op.spec
    fixed = op.fixed.double().reshape(op.fixed.shape[0], -1)[:, :op.cols]
    magnitude = fixed.abs()
    negative = fixed < 0
    if signs is not None:
        nan = op.nan if isinstance(op, MxOperand) else torch.isnan(op.scale)
        width = BLOCK if isinstance(op, MxOperand) else NV_BLOCK
        live = ~nan.repeat_interleave(width, dim=1)[:, :op.cols]
        negative = negative | ((fixed == 0) & torch.signbit(signs.float()) & live)
    if spec.kind == "mx_int":
        k = torch.where(negative, -magnitude, magnitude).to(torch.int64)
        return (k & 0xFF).to(torch.uint8)
    p = spec.mantissa_bits
    # Subnormal codes are the fixed value itself; normal ones (1.m · 2^(E-1)) in
    # units: fixed = (2^p + m) · 2^(E - 1).
    safe = torch.where(magnitude > 0, magnitude, torch.ones_like(magnitude))
    top = _floor_log2(safe).to(torch.int64)  # leading bit of the integer
    field = torch.clamp(top - p + 1, min=0)
    mantissa = torch.where(field > 0, _ldexp(safe, -(field - 1)) - 2.0 ** p, magnitude)
    code = (field << p) | mantissa.to(torch.int64)
    code = torch.where(magnitude > 0, code, torch.zeros_like(code))
    code = code | (negative.to(torch.int64) << (spec.exponent_bits + p))
    return code.to(torch.uint8)


# --- the GEMM ------------------------------------------------------------------------------


def path_for(x: Operand, w: Operand) -> str:
    """mx::GemmPathFor: "mx_blocks", "nv_blocks", "int8" or "float"."""
    if isinstance(x, MxOperand) and isinstance(w, MxOperand):
        return "mx_blocks"
    if isinstance(x, NvOperand) and isinstance(w, NvOperand):
        return "nv_blocks"
    if isinstance(x, Int8Operand) and isinstance(w, Int8Operand):
        return "int8"
    return "float"


def _tile_bytes() -> int:
    return int(os.environ.get("MXSERVE_EMULATOR_TILE_BYTES", 256 << 20))


def linear(x: Operand, w: Operand, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Y = X·Wᵀ (+ bias) under the GEMM contract: x [M, K] and w [N, K] quantized
    along K; returns FP32 [M, N] on their device."""
    if x.cols != w.cols:
        raise ValueError(f"w: expected K = {x.cols} columns to match x, got {w.cols}")
    m, n = _rows(x), _rows(w)
    device = _device(x)
    if bias is not None:
        if bias.numel() != n:
            raise ValueError(f"bias: expected {n} values (one per row of w), got {bias.numel()}")
        bias = bias.reshape(n).float().to(device).contiguous()

    def start() -> torch.Tensor:
        """Y before any product: the bias in every row, or +0.0."""
        if bias is None:
            return torch.zeros(m, n, dtype=torch.float32, device=device)
        return bias.expand(m, n).clone()

    if m == 0 or n == 0:
        return start()
    path = path_for(x, w)
    kernels = _triton(_data(x))
    if path == "mx_blocks":
        split = kernels.mx_plan(x.spec, w.spec) if kernels is not None else None
        if split is not None:
            return kernels.mx_linear(x.fixed, _block_factors(x), w.fixed, _block_factors(w),
                                     bias, split)
        return _linear_mx(x, w, start())
    if path == "nv_blocks":
        return _linear_nv(x, w, bias)
    if path == "int8":
        return _linear_int8(x, w, bias)
    if _float_path(device) == "fast":
        return _linear_float_fast(dequantize(x), dequantize(w), start(), x.spec, w.spec)
    if kernels is not None:
        return kernels.fma_linear(dequantize(x), dequantize(w).t(), bias)
    return _linear_float(dequantize(x), dequantize(w), start(), x.spec, w.spec)


def _data(op: Operand) -> torch.Tensor:
    """The operand's main tensor (rows first)."""
    return op.fixed if isinstance(op, (MxOperand, NvOperand)) else \
        op.codes if isinstance(op, (Int8Operand, CodebookOperand, LoBcqOperand)) else op.values


def _rows(op: Operand) -> int:
    return _data(op).shape[0]


def _device(op: Operand) -> torch.device:
    return _data(op).device


def _linear_int8(x: Int8Operand, w: Int8Operand, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """float(dot)·sx·sw, then + bias: the integer dot exact in FP32 while 127²·K <
    2^24, else in FP64."""
    if 127.0 * 127.0 * x.cols < 2.0 ** 24:
        dot = x.codes @ w.codes.t()
    else:
        dot = (x.codes.double() @ w.codes.double().t()).float()
    v = dot * x.scale[:, None] * w.scale[None, :]
    return v if bias is None else bias + v


def _block_factors(op: MxOperand) -> torch.Tensor:
    """2^(e - F) per row and block in FP64, NaN where the scale is NaN (a NaN scale
    on either side makes the block NaN)."""
    factor = _pow2(op.exponent - op.spec.fraction_bits)
    return torch.where(op.nan, torch.full_like(factor, float("nan")), factor)


def _linear_mx(x: MxOperand, w: MxOperand, y: torch.Tensor) -> torch.Tensor:
    m, blocks, _ = x.fixed.shape
    n = w.fixed.shape[0]
    # The formats bound every block dot (no element exceeds max_fixed): the
    # arithmetic follows from them, with no pass over the data.
    bound = BLOCK * x.spec.max_fixed * w.spec.max_fixed
    exact = "fp32" if bound < 2.0 ** 24 else "fp64" if bound < 2.0 ** 53 else "limbs"
    fx, fw = _block_factors(x), _block_factors(w)
    xb = x.fixed.permute(1, 0, 2)            # [blocks, M, 32]
    wb = w.fixed.permute(1, 2, 0)            # [blocks, 32, N]
    per_block = m * n * (8 if exact == "fp32" else 24)
    group = max(1, min(blocks, _tile_bytes() // max(1, per_block)))
    for start in range(0, blocks, group):
        stop = min(blocks, start + group)
        xs, ws = xb[start:stop], wb[start:stop]
        if exact == "fp32":
            dots = torch.bmm(xs, ws).double()
        elif exact == "fp64":
            dots = torch.bmm(xs.double(), ws.double())
        else:
            dots = _limb_dots(xs.double(), ws.double())
        values = dots * fx[:, start:stop].t()[:, :, None] * fw[:, start:stop].t()[:, None, :]
        values = values.float()
        y = _sequential_sum(y, values)  # FP32, ascending blocks: the contract's order
    return y


def _linear_nv(x: NvOperand, w: NvOperand, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """mx's kNvBlocks: per 16-block the dot of elements in units of 2^-1 (integers
    below 2^12: exact in an FP32 matrix product), times 1/4 and both UE4M3 scales
    (each product exact in FP32), summed in FP32 in ascending block order from +0;
    then · fp32(ts_x · ts_w), then + bias."""
    m, blocks, _ = x.fixed.shape
    n = w.fixed.shape[0]
    y = torch.zeros(m, n, dtype=torch.float32, device=x.fixed.device)
    xb = x.fixed.permute(1, 0, 2)  # [blocks, M, 16]
    wb = w.fixed.permute(1, 2, 0)  # [blocks, 16, N]
    group = max(1, min(blocks, _tile_bytes() // max(1, m * n * 8)))
    for start in range(0, blocks, group):
        stop = min(blocks, start + group)
        dots = torch.bmm(xb[start:stop], wb[start:stop])
        values = dots * 0.25 * x.scale[:, start:stop].t()[:, :, None] * \
            w.scale[:, start:stop].t()[:, None, :]
        y = _sequential_sum(y, values)
    y = y * (x.tensor_scale[:, None] * w.tensor_scale[None, :])
    return y if bias is None else y + bias


def _sequential_sum(start: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """((start + terms[0]) + terms[1]) + ... in FP32, term by term (torch.cumsum
    would accumulate FP32 in FP64 on the CPU). On the CPU with numpy's in-place
    add, a fraction of torch's per-operation cost (and of numpy's accumulate)."""
    if not start.is_cuda:
        total = start.numpy().copy()
        with numpy.errstate(all="ignore"):  # Inf - Inf is NaN here as in IEEE
            for term in terms.numpy():
                numpy.add(total, term, out=total)
        return torch.from_numpy(total)
    for term in terms:
        start = start + term
    return start


def _limb_dots(xs: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """Exact block dots whose sums may pass 2^53 (E5M2 with E4M3 or E5M2), as FP64
    values rounded to odd — so one more rounding (to FP32, after an exact scaling)
    is a correct single rounding. Each operand splits into 16-bit limbs (x = h·2^16
    + l, exact); the four limb products stay below 2^37 (exact in FP64) and
    recombine in int64."""
    unit = 65536.0
    xh, wh = torch.trunc(xs / unit), torch.trunc(ws / unit)
    xl, wl = xs - xh * unit, ws - wh * unit
    hh = torch.bmm(xh, wh).to(torch.int64)
    mid = (torch.bmm(xh, wl) + torch.bmm(xl, wh)).to(torch.int64)
    ll = torch.bmm(xl, wl).to(torch.int64)
    low = mid * 65536 + ll                   # |low| < 2^55
    carry = torch.div(low, 1 << 32, rounding_mode="floor")
    high = hh + carry
    low = low - carry * (1 << 32)            # [0, 2^32)
    a = high.double() * 2.0 ** 32            # exact: |high| < 2^39
    b = low.double()                         # exact: < 2^32
    return _sum_round_to_odd(a, b)


def _sum_round_to_odd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b (finite FP64) rounded to odd: the nearest FP64 below or above the exact
    sum whose last significand bit is 1 when the sum is inexact. Rounding that to
    a format of 51 or fewer bits rounds the exact sum correctly."""
    s = a + b
    bv = s - a
    error = (a - (s - bv)) + (b - bv)        # TwoSum: s + error == a + b exactly
    bits = s.view(torch.int64)
    even = (bits & 1) == 0
    inexact = (error != 0) & torch.isfinite(s)
    # One step away from zero when the error has s's sign, else toward it.
    step = torch.where((error > 0) == (s > 0), torch.ones_like(bits), -torch.ones_like(bits))
    return torch.where(inexact & even, bits + step, bits).view(torch.float64)


def _linear_float(xv: torch.Tensor, wv: torch.Tensor, y: torch.Tensor, x_spec: FormatSpec,
                  w_spec: FormatSpec) -> torch.Tensor:
    """y = fma(x_k, w_k, y) in FP32 for k ascending (mx::ReferenceLinear's float path)."""
    if _products_exact_in_fp32(xv, wv, x_spec, w_spec):
        # Exact products: fma(x, w, y) == y + x·w, a multiply then an add per k.
        if not y.is_cuda:  # numpy's in-place ufuncs: a fraction of torch's per-op cost
            xn, wn = xv.numpy(), wv.t().contiguous().numpy()
            yn, product = y.numpy().copy(), numpy.empty(y.shape, dtype=numpy.float32)
            with numpy.errstate(all="ignore"):  # Inf - Inf is NaN here as in IEEE
                for k in range(xn.shape[1]):
                    numpy.multiply(xn[:, k:k + 1], wn[k:k + 1], out=product)
                    numpy.add(yn, product, out=yn)
            return torch.from_numpy(yn)
        wt = wv.t().contiguous()
        for k in range(xv.shape[1]):
            y = y + xv[:, k:k + 1] * wt[k:k + 1, :]
        return y
    xd, wd = xv.double(), wv.t().double().contiguous()
    for k in range(xv.shape[1]):
        product = xd[:, k:k + 1] * wd[k:k + 1, :]      # exact: 24 + 24 bits
        y = _sum_round_to_odd_special(product, y.double()).float()
    return y


def _float_path(device: torch.device) -> str:
    """"exact" (the daemon's fma chain, bit for bit) or "fast" (a tensor-core GEMM
    with FP32 accumulation: the contract's tolerance, not its bits), from
    MXSERVE_EMULATOR_FLOAT; default exact on the CPU, fast on CUDA."""
    mode = os.environ.get("MXSERVE_EMULATOR_FLOAT",
                          "fast" if device.type == "cuda" else "exact")
    if mode not in ("exact", "fast"):
        raise ValueError(f"MXSERVE_EMULATOR_FLOAT: expected 'exact' or 'fast', got {mode!r}")
    return mode


def _linear_float_fast(xv: torch.Tensor, wv: torch.Tensor, y: torch.Tensor, x_spec: FormatSpec,
                       w_spec: FormatSpec) -> torch.Tensor:
    """The float path as one GEMM: FP16 or BF16 operands (exact in their own type)
    on tensor cores with FP32 accumulation where torch offers it, else FP32 (TF32
    off). Within the contract's tolerance for float paths; not the daemon's bits."""
    same = x_spec.name if x_spec.name == w_spec.name else None
    low = {"FP16": torch.float16, "BF16": torch.bfloat16}.get(same)
    if low is not None and y.is_cuda:
        try:
            return y + torch.mm(xv.to(low), wv.to(low).t(), out_dtype=torch.float32)
        except TypeError:  # a torch without out_dtype
            pass
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return y + xv @ wv.t()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _sum_round_to_odd_special(p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """p + c rounded to odd where finite; IEEE (Inf, NaN) elsewhere."""
    s = p + c
    finite = torch.isfinite(s)
    if bool(finite.all()):
        return _sum_round_to_odd(p, c)
    safe_p = torch.where(finite, p, torch.zeros_like(p))
    safe_c = torch.where(finite, c, torch.zeros_like(c))
    return torch.where(finite, _sum_round_to_odd(safe_p, safe_c), s)


def _products_exact_in_fp32(xv: torch.Tensor, wv: torch.Tensor, x_spec: FormatSpec,
                            w_spec: FormatSpec) -> bool:
    """Whether every product x·w is exact in FP32, so that a multiply then an add
    is the fma: FP16 × FP16 always (22 significant bits, 2^-48 to 2^32); BF16 ×
    BF16 (16 bits) while no product falls below 2^-133 or reaches 2^128."""
    names = {x_spec.name, w_spec.name}
    if names == {"FP16"}:
        return True
    if names != {"BF16"}:
        return False
    ax, aw = xv.abs(), wv.abs()
    if not (torch.isfinite(ax).all() and torch.isfinite(aw).all()):
        return False
    nonzero_x, nonzero_w = ax[ax > 0], aw[aw > 0]
    if nonzero_x.numel() == 0 or nonzero_w.numel() == 0:
        return True  # every product is zero
    return (float(nonzero_x.max()) * float(nonzero_w.max()) < 2.0 ** 127 and
            float(nonzero_x.min()) * float(nonzero_w.min()) >= 2.0 ** -133)


# --- layers ----------------------------------------------------------------------------


def column_sums(dy: torch.Tensor) -> torch.Tensor:
    """Σ over rows of dY in FP32, rows ascending from +0.0 (mx::ColumnSums): the
    daemon's grad_bias."""
    dy = _as_float32(dy, "grad_output")
    kernels = _triton(dy)
    if kernels is not None:
        return kernels.column_sums(dy)
    return _sequential_sum(torch.zeros(dy.shape[1], dtype=torch.float32, device=dy.device), dy)


def grad_input(dy: torch.Tensor, weight: Union[torch.Tensor, Operand],
               fmt: Union[str, FormatSpec], rounding: str = "even", *,
               seed: Optional[int] = None, scale_rule: str = "floor") -> torch.Tensor:
    """dY [M, N] · W [N, K] → [M, K]: dY quantized along N (its rows), W along N
    (its columns) — the daemon's LayerBackward. `weight` may be W already
    quantized as Wᵀ (quantize(W.t(), fmt)); W's copy is always nearest even and
    floor, dY's takes `rounding` (and `seed`) and `scale_rule`."""
    wt = weight if not isinstance(weight, torch.Tensor) else quantize(weight.t(), fmt)
    return linear(quantize(dy, fmt, rounding, scale_rule, seed=seed,
                           stream=STREAMS["grad_output_rows"]), wt)


def grad_weight(dy: torch.Tensor, x: torch.Tensor, fmt: Union[str, FormatSpec],
                rounding: str = "even", *, seed: Optional[int] = None,
                scale_rule: str = "floor") -> torch.Tensor:
    """dYᵀ [N, M] · X [M, K] → [N, K]: both quantized along M (their columns),
    with `rounding` (and `seed`) and `scale_rule`, as the daemon does."""
    return linear(quantize(dy.t(), fmt, rounding, scale_rule, seed=seed,
                           stream=STREAMS["grad_output_columns"], transposed=True),
                  quantize(x.t(), fmt, rounding, scale_rule, seed=seed,
                           stream=STREAMS["input_columns"], transposed=True))
