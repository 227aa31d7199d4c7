#!/usr/bin/env python3
"""Golden vectors for NVFP4: quantization (E2M1 elements in blocks of 16, UE4M3 block
scales, an FP32 per-tensor scale) and the NVFP4 × NVFP4 GEMM contract.

An independent implementation in exact rational arithmetic (fractions.Fraction) and
the Python standard library only: it shares no code with mx/ or the torch emulator.
Every FP32 operation of the recipe is an exact rational result rounded here to the
nearest FP32 (ties to even, subnormals kept, overflow to infinity); elements and
scales are rounded by searching tables of every value their bit layouts decode to.

    make_nvfp4_vectors.py            write tests/golden/nvfp4.json
    make_nvfp4_vectors.py --out F    write F instead
    make_nvfp4_vectors.py --check    regenerate in memory; exit 1 if the checked-in
                                     file differs

The recipe (torchao's NVFP4Tensor with a per-tensor scale; mx/quantize.h), fp32(...)
one IEEE FP32 operation:

- tensor scale ts = fp32(amax / 2688), amax the largest finite |v| of the whole
  operand (2688 = 448 · 6); 1 where that is not a normal FP32 number. A case may
  instead give ts ("tensor_scale" in the case).
- per block of 16 (a short last block padded with zeros): a block holding NaN or
  +-Inf gets scale byte 0x7F and 16 codes 0. Otherwise s = fp32(fp32(amax_b / 6) /
  ts), clamped to [2^-6, 448], rounded to UE4M3 (nearest, ties to the even code):
  the scale byte, value S. Each element: fp32(v / fp32(ts · S)), clamped to +-6,
  rounded to E2M1 (ties to the even code), the sign bit copied from the input (so
  -0.0 and negative values that round to zero give code 0x8).
- GEMM (A by rows, B by columns, both NVFP4): per block the exact dot of the element
  values times both block scales (exact in FP32), added in FP32 from +0.0 in
  ascending block order (NaN where either block scale is NaN); then
  c = fp32(sum · fp32(ts_a · ts_b)), then fp32(c + bias) when there is a bias.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import struct
import sys
from fractions import Fraction

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "golden" / "nvfp4.json"
BLOCK = 16
INF = float("inf")


def bits_of(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def float_of(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def f32(value: Fraction) -> float:
    """The FP32 value nearest `value` (ties to even), subnormals kept, overflow Inf."""
    if value == 0:
        return 0.0
    sign = -1.0 if value < 0 else 1.0
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    # floor(log2 magnitude) = exponent; the step: 24 significant bits, at least 2^-149.
    step = Fraction(2) ** max(exponent - 23, -149)
    q, remainder = divmod(magnitude, step)
    if remainder * 2 > step or (remainder * 2 == step and q % 2 == 1):
        q += 1
    result = q * step
    if result >= Fraction(2) ** 128:
        return sign * INF
    return sign * float(result)  # exact: result is an FP32 value


def fdiv(a: float, b: float) -> float:
    return f32(Fraction(a) / Fraction(b))


def fmul(a: float, b: float) -> float:
    return f32(Fraction(a) * Fraction(b))


def fadd(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return f32(Fraction(a) + Fraction(b))


# E2M1: code c (0..7) decodes to these magnitudes; E4M3 (positive, finite): every
# code below 0x7F, decoded from its fields.
E2M1 = [Fraction(v) for v in ("0", "1/2", "1", "3/2", "2", "3", "4", "6")]


def e4m3_value(code: int) -> Fraction:
    exponent, mantissa = code >> 3, code & 7
    if exponent == 0:
        return Fraction(mantissa, 8) * Fraction(2) ** -6
    return (1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7)


E4M3 = [(e4m3_value(c), c) for c in range(0x7F)]


def nearest(table, value: Fraction) -> int:
    """The code of the entry nearest `value` in a [(value, code)] table sorted by
    value; between two, the even code."""
    best = None
    for v, code in table:
        distance = abs(v - value)
        if best is None or distance < best[0] or (distance == best[0] and code % 2 == 0):
            best = (distance, code)
    return best[1]


E2M1_TABLE = [(v, c) for c, v in enumerate(E2M1)]


def tensor_scale(values) -> float:
    finite = [abs(v) for v in values if math.isfinite(v)]
    amax = max(finite, default=0.0)
    ts = fdiv(amax, 2688.0)
    return ts if ts >= 2.0 ** -126 and math.isfinite(ts) else 1.0


def quantize_block(values, ts: float):
    """(scale byte, 16 codes) of up to 16 values."""
    values = list(values) + [0.0] * (BLOCK - len(values))
    if any(not math.isfinite(v) for v in values):
        return 0x7F, [0] * BLOCK
    amax = max(abs(v) for v in values)
    s = fdiv(fdiv(amax, 6.0), ts)
    s = min(max(s, 2.0 ** -6), 448.0)
    byte = nearest(E4M3, Fraction(s))
    total = fmul(ts, float(e4m3_value(byte)))
    codes = []
    for v in values:
        q = fdiv(v, total)
        q = min(max(q, -6.0), 6.0)
        code = nearest(E2M1_TABLE, abs(Fraction(q)))
        codes.append(code | (8 if math.copysign(1.0, v) < 0 else 0))
    return byte, codes


def quantize(matrix, rows: int, cols: int, ts=None):
    """ts, [rows][blocks] scale bytes, [rows][cols] codes of a row-major matrix."""
    if ts is None:
        ts = tensor_scale(matrix)
    scales, codes = [], []
    for r in range(rows):
        row = matrix[r * cols:(r + 1) * cols]
        row_scales, row_codes = [], []
        for b in range(0, cols, BLOCK):
            byte, block_codes = quantize_block(row[b:b + BLOCK], ts)
            row_scales.append(byte)
            row_codes.extend(block_codes)
        scales.append(row_scales)
        codes.append(row_codes[:cols])
    return ts, scales, codes


def element(code: int) -> Fraction:
    return -E2M1[code & 7] if code & 8 else E2M1[code & 7]


def gemm(a, b, m: int, k: int, n: int, bias):
    ts_a, scales_a, codes_a = quantize(a, m, k)
    b_columns = [b[i * n + j] for j in range(n) for i in range(k)]  # N rows of K
    ts_b, scales_b, codes_b = quantize(b_columns, n, k)
    c = []
    for i in range(m):
        for j in range(n):
            total = 0.0
            for blk in range(len(scales_a[i])):
                sa, sb = scales_a[i][blk], scales_b[j][blk]
                if sa == 0x7F or sb == 0x7F:
                    total = math.nan
                    continue
                dot = sum(element(codes_a[i][t]) * element(codes_b[j][t])
                          for t in range(blk * BLOCK, min(k, (blk + 1) * BLOCK)))
                block = dot * e4m3_value(sa) * e4m3_value(sb)
                assert f32(block) == block, "a block result is exact in FP32"
                total = fadd(total, float(block))
            v = total if math.isnan(total) else fmul(total, fmul(ts_a, ts_b))
            if bias is not None:
                v = fadd(v, bias[j])
            c.append(v)
    return c


def hexes(values):
    return [f"{bits_of(v):08x}" for v in values]


def random_values(rng: random.Random, count: int, spread: int):
    out = []
    for _ in range(count):
        v = rng.gauss(0.0, 1.0) * 2.0 ** rng.randint(-spread, spread)
        out.append(float_of(bits_of(v)))  # to FP32
    return out


def quantize_cases():
    rng = random.Random(20261126)
    cases = []

    def add(name, values, rows, cols, ts=None):
        got_ts, scales, codes = quantize(values, rows, cols, ts)
        case = {"id": name, "rows": rows, "cols": cols, "values": hexes(values),
                "tensor_scale": f"{bits_of(got_ts):08x}", "given_tensor_scale": ts is not None,
                "scales": [x for row in scales for x in row],
                "codes": [x for row in codes for x in row]}
        cases.append(case)

    add("random_rows", random_values(rng, 4 * 64, 3), 4, 64)
    add("wide_spread", random_values(rng, 3 * 48, 20), 3, 48)
    add("ragged_k", random_values(rng, 2 * 37, 2), 2, 37)
    # One huge block and tiny ones: the tiny blocks' scales clamp at 2^-6.
    v = random_values(rng, 64, 0)
    v[0] = 1.0e4
    for i in range(32, 48):
        v[i] *= 1e-7
    add("scale_floor_clamp", v, 1, 64)
    # Ties of E2M1 under ts = 1 and block scale 1 (amax 6): 2.5 -> 2, 3.5 -> 4, 5 -> 4,
    # 0.25 -> 0, 0.75 -> 1 (even codes), negatives and -0.0 with their sign.
    ties = [6.0, 2.5, 3.5, 5.0, 0.25, 0.75, 1.25, 1.75, -2.5, -5.0, -0.25, -0.0, 0.1, -0.1,
            4.9, -6.0]
    add("e2m1_ties", ties, 1, 16, ts=1.0)
    # UE4M3 rounding of the scale itself: amax / 6 between two UE4M3 values.
    add("e4m3_scale_ties", [6.0 * (1 + 1 / 16), 1.0] + [0.0] * 14 + [6.0 * 1.1875] + [0.5] * 15,
        1, 32, ts=1.0)
    # Specials: NaN and Inf blocks, an all-zero block, FP32 subnormals.
    sp = random_values(rng, 4 * 32, 1)
    sp[3] = math.nan
    sp[32 + 20] = INF
    sp[64 + 5] = -INF
    for i in range(96, 112):
        sp[i] = 0.0
    sp[112] = float_of(0x00000005)
    sp[113] = -float_of(0x007FFFFF)
    add("specials", sp, 4, 32)
    add("all_zero", [0.0] * 32, 1, 32)
    add("tiny_tensor", [float_of(0x00000003), -float_of(0x00000001)] + [0.0] * 14, 1, 16)
    return cases


def gemm_cases():
    rng = random.Random(34)
    cases = []
    for name, m, k, n, spread, with_bias in (("small", 3, 32, 5, 2, True),
                                              ("ragged", 2, 45, 7, 4, False),
                                              ("wide", 4, 64, 3, 12, True)):
        a, b = random_values(rng, m * k, spread), random_values(rng, k * n, spread)
        bias = random_values(rng, n, 1) if with_bias else None
        if name == "wide":
            a[5] = math.nan  # row 0, block 0: NaN outputs for that row
        c = gemm(a, b, m, k, n, bias)
        cases.append({"id": name, "m": m, "k": k, "n": n, "a": hexes(a), "b": hexes(b),
                      "bias": hexes(bias) if bias is not None else None, "c": hexes(c)})
    return cases


def document() -> str:
    return json.dumps({"generator": "tests/golden/make_nvfp4_vectors.py",
                       "quantize": quantize_cases(), "gemm": gemm_cases()}, indent=1) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = document()
    if args.check:
        same = pathlib.Path(args.out).read_text() == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from the generator'}")
        return 0 if same else 1
    pathlib.Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
