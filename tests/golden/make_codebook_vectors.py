#!/usr/bin/env python3
"""Golden vectors for the codebook formats (NF4 and bitsandbytes' FP4): blockwise
quantization with an FP32 absmax per block of 64, and their GEMM (the float path).

An independent model in exact rational arithmetic (fractions.Fraction), sharing no
code with mx/ or the torch emulator; its FP32 rounding helpers are the NVFP4
generator's (make_nvfp4_vectors.py, the test tree's own). The recipe (mx/codebook.h):

- tables: NF4's values as bitsandbytes publishes them (decimal strings, each
  rounded to FP32), sorted, code = index; FP4's magnitudes, bitsandbytes'
  decimal constants for {0, 1/192, 2/3, 1, 1/3, 1/2, 1/6, 1/4}, under codes 0..7,
  negatives under 8..15 (code 8 is -0);
- thresholds: NF4 fp32 of the exact midpoint of neighbouring (sorted) values;
  FP4 bitsandbytes' decimal literals, each rounded to FP32. A normalized value n
  above a threshold goes up (NF4: code = how many thresholds lie below n; FP4:
  the same over |n|, sign bit from n < 0);
- per block of 64 (a short last block padded with the code of 0): a block with
  NaN or Inf gets absmax NaN and the codes of 0, an all-zero block absmax 0 and
  the codes of 0; else absmax = max |v|, r = fp32(1 / absmax), n = fp32(v · r),
  or fp32(v / absmax) where r overflows;
- value: fp32(table[code] · absmax); GEMM: y = fp32(x·w + y) over k ascending
  from +0.0 or the bias (one rounding per step: the fma chain).

    make_codebook_vectors.py            write tests/golden/codebook.json
    make_codebook_vectors.py --check    exit 1 if the checked-in file differs
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import sys
from fractions import Fraction

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_nvfp4_vectors import bits_of, f32, float_of, hexes  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "golden" / "codebook.json"
BLOCK = 64
NF4_DECIMALS = ("-1.0", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453",
                "-0.28444138169288635", "-0.18477343022823334", "-0.09105003625154495", "0.0",
                "0.07958029955625534", "0.16093020141124725", "0.24611230194568634",
                "0.33791524171829224", "0.44070982933044434", "0.5626170039176941",
                "0.7229568362236023", "1.0")
FP4_DECIMALS = ("0.0", "5.208333333e-03", "0.66666667", "1.0", "0.33333333", "0.5",
                "0.16666667", "0.25")
FP4_THRESHOLDS = ("0.00260417", "0.0859375", "0.20833333", "0.29166667", "0.4166667",
                  "0.583333", "0.8333333")


def table(fmt: str):
    """The 16 FP32 values by code, as Fractions."""
    if fmt == "NF4":
        return [Fraction(f32(Fraction(d))) for d in NF4_DECIMALS]
    magnitudes = [Fraction(f32(Fraction(d))) for d in FP4_DECIMALS]
    return magnitudes + [-m for m in magnitudes]  # code 8's -0: see dequantize


def thresholds(values):
    return [Fraction(f32((a + b) / 2)) for a, b in zip(values, values[1:])]


def code_of(fmt: str, n: Fraction, negative: bool) -> int:
    t = table(fmt)
    if fmt == "NF4":
        return sum(1 for thr in thresholds(t) if n > thr)
    ascending = sorted(range(8), key=lambda c: t[c])
    fp4_thresholds = [Fraction(f32(Fraction(d))) for d in FP4_THRESHOLDS]
    index = sum(1 for thr in fp4_thresholds if abs(n) > thr)
    return ascending[index] | (8 if negative else 0)


def zero_code(fmt: str) -> int:
    return 7 if fmt == "NF4" else 0


def quantize_block(fmt: str, values):
    """(codes, absmax as float) of one block of floats."""
    if any(not math.isfinite(v) for v in values):
        return [zero_code(fmt)] * len(values), float("nan")
    absmax = max(abs(v) for v in values)
    if absmax == 0:
        return [zero_code(fmt)] * len(values), 0.0
    reciprocal = f32(1 / Fraction(absmax))
    codes = []
    for v in values:
        if math.isfinite(reciprocal):
            n = f32(Fraction(v) * Fraction(reciprocal))
        else:
            n = f32(Fraction(v) / Fraction(absmax))
        # n < 0 as FP32 compares it: a value rounding to zero is -0.0, not below 0.
        codes.append(code_of(fmt, Fraction(n), n < 0))
    return codes, absmax


def quantize(fmt: str, matrix, rows: int, cols: int):
    """Codes (rows × cols, padding dropped) and absmax (rows × blocks)."""
    codes, absmax = [], []
    for r in range(rows):
        row = matrix[r * cols:(r + 1) * cols]
        for start in range(0, cols, BLOCK):
            c, a = quantize_block(fmt, row[start:start + BLOCK])
            codes += c
            absmax.append(a)
    return codes, absmax


def dequantize(fmt: str, codes, absmax, rows: int, cols: int):
    t, blocks = table(fmt), -(-cols // BLOCK)
    out = []
    for r in range(rows):
        for c in range(cols):
            a, code = absmax[r * blocks + c // BLOCK], codes[r * cols + c]
            if math.isnan(a):
                out.append(float("nan"))
            elif t[code] == 0:  # zero times absmax >= 0: FP4's code 8 is -0
                out.append(-0.0 if fmt == "BNB_FP4" and code == 8 else 0.0)
            else:
                out.append(f32(t[code] * Fraction(a)))
    return out


def fma(x: float, w: float, y: float) -> float:
    if not (math.isfinite(x) and math.isfinite(w) and math.isfinite(y)):
        return x * w + y  # IEEE's non-finite answer (NaN or the infinity)
    exact = Fraction(x) * Fraction(w) + Fraction(y)
    if exact == 0:  # fma's zero: -0 only when the product and y are both -0 (or -0 + -0)
        product_negative = (math.copysign(1, x) * math.copysign(1, w)) < 0
        return -0.0 if (product_negative and math.copysign(1, y) < 0) else 0.0
    return f32(exact)


def gemm(fa: str, fb: str, a, b, m: int, k: int, n: int, bias):
    """C = A·B: A quantized by rows to fa, B by columns to fb, the fma chain."""
    return float_path_gemm(lambda v: dequantize(fa, *quantize(fa, v, m, k), m, k),
                           lambda v: dequantize(fb, *quantize(fb, v, n, k), n, k),
                           a, b, m, k, n, bias)


def float_path_gemm(values_a, values_b, a, b, m: int, k: int, n: int, bias):
    """The float path: A (m × k, row-major) and B (k × n) each turned into the
    values they stand for along K (values_a(a), values_b(Bᵀ as n rows of k)),
    then y = fp32(x·w + y) over k ascending from +0.0 or the bias."""
    qa = values_a(a)
    qb = values_b([b[i * n + j] for j in range(n) for i in range(k)])
    c = []
    for i in range(m):
        for j in range(n):
            y = 0.0 if bias is None else bias[j]
            for t in range(k):
                y = fma(qa[i * k + t], qb[j * k + t], y)
            c.append(y)
    return c


def quantize_cases():
    rng = random.Random(35)
    cases = []

    def case(case_id, fmt, rows, cols, values):
        codes, absmax = quantize(fmt, values, rows, cols)
        cases.append({"id": case_id, "format": fmt, "rows": rows, "cols": cols,
                      "values": hexes(values), "codes": codes, "absmax": hexes(absmax)})

    for fmt in ("NF4", "BNB_FP4"):
        t = table(fmt)
        ordered = sorted(set(t))
        thr = thresholds(ordered) if fmt == "NF4" else \
            [Fraction(f32(Fraction(d))) for d in FP4_THRESHOLDS]
        # Every table value, every threshold and its FP32 neighbours, with 1.0 in the
        # block so that absmax is 1 and n is the value itself.
        edge = [1.0] + [float(v) for v in ordered]
        for x in thr:
            bits = bits_of(float(x))
            edge += [float(x), float_of(bits + 1), float_of(bits - 1) if x != 0 else -float(x)]
        edge += [-v for v in edge[1:]] + [-0.0]
        edge = (edge + [0.0] * BLOCK)[:BLOCK * (len(edge) // BLOCK + 1)]
        case(f"{fmt}-thresholds", fmt, 1, len(edge), edge)
        normal = [rng.gauss(0, 1) for _ in range(3 * 70)]
        case(f"{fmt}-gaussian-ragged", fmt, 3, 70, [float_of(bits_of(v)) for v in normal])
        wide = [float_of(bits_of(rng.choice((-1, 1)) * 2.0 ** rng.uniform(-30, 30)))
                for _ in range(128)]
        case(f"{fmt}-wide-range", fmt, 2, 64, wide)
        special = [float_of(bits_of(rng.gauss(0, 1))) for _ in range(4 * BLOCK)]
        special[5] = float("nan")                         # block 0: NaN
        special[BLOCK + 9] = float("-inf")                # block 1: -Inf
        special[2 * BLOCK:3 * BLOCK] = [0.0] * BLOCK      # block 2: all zero
        special[2 * BLOCK + 3] = -0.0
        special[3 * BLOCK:4 * BLOCK] = [v * 2.0 ** -140 for v in special[3 * BLOCK:4 * BLOCK]]
        special = [float_of(bits_of(v)) for v in special]  # block 3: absmax subnormal
        case(f"{fmt}-special-blocks", fmt, 1, 4 * BLOCK, special)
    return cases


def gemm_cases():
    rng = random.Random(36)
    cases = []
    for case_id, fa, fb, m, k, n, with_bias in (("nf4", "NF4", "NF4", 3, 70, 4, True),
                                                ("fp4", "BNB_FP4", "BNB_FP4", 2, 64, 3, False),
                                                ("mixed", "NF4", "BNB_FP4", 2, 130, 2, True)):
        a = [float_of(bits_of(rng.gauss(0, 1))) for _ in range(m * k)]
        b = [float_of(bits_of(rng.gauss(0, 0.2))) for _ in range(k * n)]
        bias = [float_of(bits_of(rng.gauss(0, 1))) for _ in range(n)] if with_bias else None
        cases.append({"id": case_id, "format_a": fa, "format_b": fb, "m": m, "k": k, "n": n,
                      "a": hexes(a), "b": hexes(b), "bias": None if bias is None else hexes(bias),
                      "c": hexes(gemm(fa, fb, a, b, m, k, n, bias))})
    return cases


def document() -> str:
    return json.dumps({"generator": "tests/golden/make_codebook_vectors.py",
                       "quantize": quantize_cases(), "gemm": gemm_cases()}, indent=1) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = document()
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs from what the generator writes'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
