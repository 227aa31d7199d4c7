#!/usr/bin/env python3
"""Golden vectors for LO-BCQ (block-clustered quantization): the LO_BCQ format's
quantization (codes, selectors and FP32 scales), the quantizer at other
geometries with other codebooks, and LO_BCQ GEMMs (the float path).

An independent model in exact rational arithmetic (fractions.Fraction) and Python
integers, sharing no code with mx/ or the torch emulator; its FP32 rounding is
the NVFP4 generator's (make_nvfp4_vectors.py, the test tree's own). The one
thing taken from the package is data: the format's frozen codebooks
(mxserve.torch.emulator's table, written by mxserve.torch.lobcq.default_codebooks),
copied into the file so that mx/lobcq.cc's copy is checked against it.
The recipe (mx/lobcq.h):

- per array of `array_len` values along K (a short last one padded): an array
  holding NaN or Inf has scale NaN, selectors and codes 0; else
  s = fp32(amax / 31);
- grid: y = fp32(x / s) clamped to [-32, 32], t = round-half-even(256 · y); every
  t is 0 where s is 0;
- a block of `block_len` takes the codebook j with the least
  Σ_i min_k (t_i − 256·C[j][k])² over its real values (the lowest j on ties), a
  value the entry k of it nearest t (the lowest k on ties); selectors of blocks
  wholly past K are 0, padding codes 0 (dropped here);
- value: fp32(C[j][k] · s) (a NaN scale gives NaN); GEMM: y = fp32(x·w + y) over
  k ascending from +0.0 or the bias (the fma chain).

    make_lobcq_vectors.py            write tests/golden/lobcq.json
    make_lobcq_vectors.py --check    exit 1 if the checked-in file differs
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import re
import sys
from fractions import Fraction

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_codebook_vectors import float_path_gemm  # noqa: E402
from make_nvfp4_vectors import bits_of, f32, float_of, hexes  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "golden" / "lobcq.json"
ENTRY_MAX, GRID = 31, 256
W4A4 = {"block_len": 8, "array_len": 64, "codebooks": 16}


def default_codebooks():
    """The frozen set, read as text from the emulator's source (no torch import)."""
    source = (REPO / "clients" / "python" / "mxserve" / "torch" / "emulator.py").read_text()
    table = source.split("_LOBCQ_DEFAULT = (", 1)[1].split("\n)\n", 1)[0]
    books = [[int(v) for v in row.split(",") if v.strip()]
             for row in re.findall(r"^\s*\(([-0-9, ]+)\),", table, re.M)]
    assert len(books) == 16 and all(len(b) == 16 for b in books), "the table's shape"
    return books


def quantize_array(values, books, geometry):
    """(codes, selectors, scale as float) of one array (at most array_len values)."""
    block_len = geometry["block_len"]
    blocks = geometry["array_len"] // block_len
    if any(not math.isfinite(v) for v in values):
        return [0] * len(values), [0] * blocks, float("nan")
    amax = max(abs(v) for v in values)
    s = f32(Fraction(amax) / ENTRY_MAX)
    t = []
    for v in values:
        if s == 0:
            t.append(0)
            continue
        y = Fraction(f32(Fraction(v) / Fraction(s)))
        y = min(max(y, Fraction(-32)), Fraction(32))
        t.append(round(y * GRID))  # Fraction rounds half to even
    codes, selectors = [0] * len(values), [0] * blocks

    def nearest(book, ti):
        errors = [(ti - GRID * e) ** 2 for e in book]
        best = min(errors)
        return errors.index(best), best  # the lowest index on ties

    for b in range(blocks):
        part = range(b * block_len, min((b + 1) * block_len, len(values)))
        if not part:
            continue
        sums = [sum(nearest(book, t[i])[1] for i in part) for book in books]
        j = sums.index(min(sums))
        selectors[b] = j
        for i in part:
            codes[i] = nearest(books[j], t[i])[0]
    return codes, selectors, s


def quantize(values, rows, cols, books, geometry):
    codes, selectors, scales = [], [], []
    n = geometry["array_len"]
    for r in range(rows):
        row = values[r * cols:(r + 1) * cols]
        for start in range(0, cols, n):
            c, sel, s = quantize_array(row[start:start + n], books, geometry)
            codes += c
            selectors += sel
            scales.append(s)
    return codes, selectors, scales


def dequantize(codes, selectors, scales, rows, cols, books, geometry):
    n, block_len = geometry["array_len"], geometry["block_len"]
    arrays, blocks = -(-cols // n), n // block_len
    out = []
    for r in range(rows):
        for c in range(cols):
            s = scales[r * arrays + c // n]
            j = selectors[(r * arrays + c // n) * blocks + (c % n) // block_len]
            entry = books[j][codes[r * cols + c]]
            if math.isnan(s):
                out.append(float("nan"))
            elif entry == 0 or s == 0:  # the sign of the zero product
                out.append(-0.0 if (entry < 0) != (math.copysign(1, s) < 0) else 0.0)
            else:
                out.append(f32(entry * Fraction(s)))
    return out


def values_of(fmt, values, rows, cols, books):
    if fmt == "FP32":
        return list(values)
    assert fmt == "LO_BCQ"
    return dequantize(*quantize(values, rows, cols, books, W4A4), rows, cols, books, W4A4)


def gemm(fa, fb, a, b, m, k, n, bias, books):
    return float_path_gemm(lambda v: values_of(fa, v, m, k, books),
                           lambda v: values_of(fb, v, n, k, books), a, b, m, k, n, bias)


def quantize_cases(books):
    rng = random.Random(37)
    cases = []

    def case(case_id, rows, cols, values, geometry=W4A4, own_books=None):
        used = books if own_books is None else own_books
        codes, selectors, scales = quantize(values, rows, cols, used, geometry)
        cases.append({"id": case_id, "geometry": geometry, "codebooks": own_books,
                      "rows": rows, "cols": cols, "values": hexes(values), "codes": codes,
                      "selectors": selectors, "scales": hexes(scales)})

    def gauss(n, sigma=1.0):
        return [float_of(bits_of(rng.gauss(0, sigma))) for _ in range(n)]

    case("gaussian-ragged", 3, 70, gauss(3 * 70))
    # amax 31: s = 1 and t = 256·x. Every entry of every codebook, the midpoints
    # between neighbours (ties go to the lower index), half-grid values (rint's
    # ties to even), the grid's ends.
    points = []
    for book in books:
        for lo, hi in zip(book, book[1:]):
            points += [float(lo), (lo + hi) / 2.0]
    points += [0.5 / GRID, 1.5 / GRID, -2.5 / GRID, -31.0, 30.99, 0.0, -0.0]
    ties = []
    for start in range(0, len(points), 63):  # 31 leads every array: s = 1 in each
        ties += [31.0] + points[start:start + 63]
    case("ties", 1, len(ties), ties)
    wide = [float_of(bits_of(rng.choice((-1, 1)) * 2.0 ** rng.uniform(-30, 30)))
            for _ in range(128)]
    case("wide-range", 2, 64, wide)
    special = gauss(5 * 64)
    special[5] = float("nan")                               # array 0: NaN
    special[64 + 9] = float("-inf")                         # array 1: -Inf
    special[128:192] = [0.0] * 64                           # array 2: all zero
    special[128 + 3] = -0.0
    special[192:256] = [float_of(bits_of(v * 2.0 ** -140)) for v in special[192:256]]  # y > 31
    special[256:320] = [0.0] * 64                           # array 4: s underflows to 0
    special[256 + 7], special[256 + 40] = 2.0 ** -148, -2.0 ** -149
    case("special-arrays", 1, 5 * 64, special)
    # amax = 46·2^-149: s = fp32(46/31 · 2^-149) rounds to 2^-149, so y = k for
    # k·2^-149 and y = 46 is clamped to 32. These blocks pick another codebook
    # with the clamp at 32 than with none or with a clamp at 31 (found by search).
    tiny = [k * 2.0 ** -149 for k in (46, 27, -13, -26, 18, 26, -17, -22,
                                      46, 22, 1, -27, 26, -22, 26, 13)]
    case("clamped", 1, len(tiny), tiny)
    # Other geometries, other codebooks: the quantizer's parameters.
    for geometry in ({"block_len": 4, "array_len": 32, "codebooks": 4},
                     {"block_len": 2, "array_len": 16, "codebooks": 8},
                     {"block_len": 16, "array_len": 128, "codebooks": 2}):
        own = [sorted(rng.randint(-ENTRY_MAX, ENTRY_MAX) for _ in range(16))
               for _ in range(geometry["codebooks"])]
        tag = "lb{block_len}-la{array_len}-nc{codebooks}".format(**geometry)
        case(f"{tag}-laplace", 2, 2 * geometry["array_len"] + 3,
             [float_of(bits_of(rng.choice((-1, 1)) * rng.expovariate(1.0)))
              for _ in range(2 * (2 * geometry["array_len"] + 3))], geometry, own)
    return cases


def gemm_cases(books):
    rng = random.Random(38)
    cases = []
    for case_id, fa, fb, m, k, n, with_bias in (("lobcq", "LO_BCQ", "LO_BCQ", 3, 70, 4, True),
                                                ("lobcq-fp32", "LO_BCQ", "FP32", 2, 130, 2, False)):
        a = [float_of(bits_of(rng.gauss(0, 1))) for _ in range(m * k)]
        b = [float_of(bits_of(rng.gauss(0, 0.2))) for _ in range(k * n)]
        bias = [float_of(bits_of(rng.gauss(0, 1))) for _ in range(n)] if with_bias else None
        cases.append({"id": case_id, "format_a": fa, "format_b": fb, "m": m, "k": k, "n": n,
                      "a": hexes(a), "b": hexes(b), "bias": None if bias is None else hexes(bias),
                      "c": hexes(gemm(fa, fb, a, b, m, k, n, bias, books))})
    return cases


def document() -> str:
    books = default_codebooks()
    return json.dumps({"generator": "tests/golden/make_lobcq_vectors.py",
                       "default_codebooks": books, "quantize": quantize_cases(books),
                       "gemm": gemm_cases(books)}, indent=1) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = document()
    if args.check:
        if args.out.read_text() != text:
            print(f"{args.out} differs from what the generator writes", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
