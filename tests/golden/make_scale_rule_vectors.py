#!/usr/bin/env python3
"""Golden vectors for the four MX block-scale rules: floor, no_saturation, ceil, rceil.

An independent implementation, in exact rational arithmetic (fractions.Fraction) and
the Python standard library only: it shares no code with mx/ or the torch emulator.
Elements are rounded by searching a table of every element value decoded from the
format's bit layout (not by shifting significands as mx/element.cc does), and FP32
values are read and written from their bit patterns with struct.

    make_scale_rule_vectors.py                 write tests/golden/scale_rules.json
    make_scale_rule_vectors.py --out F         write F instead
    make_scale_rule_vectors.py --check         regenerate in memory; exit 1 if the
                                               checked-in file differs
    make_scale_rule_vectors.py --check-shared [DIR]
                                               run the floor rule over the quantize
                                               vectors of ../shared/golden/mx (or DIR)
                                               and report every mismatch; exit 1 if any

The rules (amax = the block's largest magnitude, an FP32 value; emax and max_normal
the element format's; e the unbiased shared exponent, scale 2^e, byte e + 127):

- floor (OCP MX v1.0): e = floor(log2(amax)) - emax.
- no_saturation: the floor e, plus one where amax / 2^e rounded to the element format
  without clamping (with the case's rounding) exceeds max_normal, and e < 127.
- ceil: e = ceil(log2(amax)) - emax.
- rceil: q = amax / max_normal rounded to FP32 (nearest even, subnormals kept, 0
  when it underflows); e = ceil(log2(q)), or -127 where q == 0.

For every rule an all-zero block gives e = -127, e is clamped to [-127, 127], and a
block holding NaN or +-Inf gets scale byte 0xFF and 32 codes 0. Elements are v / 2^e
exactly, rounded to the element format (ties to even, or away from zero for rounding
"away"), magnitudes past max_normal clamped to it.

Element codes follow mx::QuantizeBlock: FP elements are sign | exponent | mantissa
with the sign bit copied from the input, so -0.0 and a negative value that rounds to
zero give the negative-zero code (0x80 for FP8, 0x20 for FP6, 0x8 for FP4); MXINT8 is
the two's-complement byte of k (value k/64, |k| <= 127), whose zero has no sign; the
codes of a NaN/Inf block are all 0 whatever the signs of its values. The shared set
(../shared/golden/mx) derives its codes from dequantized outputs and may differ in the
sign of a zero code only (its README, item 6), so --check-shared compares zero codes
without their sign.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import pathlib
import random
import struct
import sys
from fractions import Fraction

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "golden" / "scale_rules.json"
DEFAULT_SHARED = REPO.parent / "shared" / "golden" / "mx"

BLOCK = 32
RULES = ("floor", "no_saturation", "ceil", "rceil")
ROUNDINGS = ("even", "away")
E_MIN, E_MAX = -127, 127
NAN_SCALE = 0xFF


def pow2(k: int) -> Fraction:
    return Fraction(2 ** k) if k >= 0 else Fraction(1, 2 ** -k)


def floor_log2(x: Fraction) -> int:
    """floor(log2 x) for x > 0, exactly."""
    k = x.numerator.bit_length() - x.denominator.bit_length()
    # 2^(k-1) < x < 2^(k+1): one comparison settles it.
    return k if x >= pow2(k) else k - 1


def ceil_log2(x: Fraction) -> int:
    k = floor_log2(x)
    return k if x == pow2(k) else k + 1


# --- FP32 ----------------------------------------------------------------------------------


def f32_parts(bits: int):
    """(negative, kind, magnitude): kind "finite", "inf" or "nan"; magnitude a Fraction
    for finite values."""
    negative = bool(bits >> 31)
    field = (bits >> 23) & 0xFF
    fraction = bits & 0x7FFFFF
    if field == 0xFF:
        return negative, ("inf" if fraction == 0 else "nan"), None
    if field == 0:
        return negative, "finite", fraction * pow2(-149)
    return negative, "finite", (0x800000 | fraction) * pow2(field - 150)


def f32_bits(x: Fraction) -> int:
    """The bits of the FP32 value x, which must be exactly representable."""
    negative = x < 0
    m = abs(x)
    if m == 0:
        return 0x80000000 if negative else 0
    k = floor_log2(m)
    if k < -126:
        significand, field = m / pow2(-149), 0
        assert significand.denominator == 1 and significand < 2 ** 23, x
        bits = int(significand)
    else:
        significand = m / pow2(k - 23)
        assert significand.denominator == 1 and k <= 127, x
        bits = ((k + 127) << 23) | (int(significand) - 2 ** 23)
    return bits | (0x80000000 if negative else 0)


def round_to_f32(x: Fraction) -> Fraction:
    """x > 0 rounded to FP32, nearest even, subnormals kept (0 below half of 2^-149).
    No overflow handling: the callers stay far below 2^128."""
    step = pow2(max(floor_log2(x), -126) - 23)
    n = x / step
    q = n.numerator // n.denominator
    r = n - q
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and q % 2 == 1):
        q += 1
    return q * step


def hex32(bits: int) -> str:
    return f"0x{bits:08x}"


# --- element formats ---------------------------------------------------------------------


class Format:
    """An MX element format as the OCP MX v1.0 spec describes it, and the table of all
    its non-negative finite values with their codes (decoded from the bit layout)."""

    def __init__(self, name, kind, bits, exponent_bits, mantissa_bits, bias, emax, max_normal,
                 specials):
        self.name, self.kind, self.bits = name, kind, bits
        self.exponent_bits, self.mantissa_bits, self.bias = exponent_bits, mantissa_bits, bias
        self.emax, self.max_normal, self.specials = emax, Fraction(max_normal), specials
        table = []  # (value, magnitude code)
        if kind == "int":
            table = [(Fraction(k, 64), k) for k in range(128)]
        else:
            p = mantissa_bits
            for code in range(2 ** (bits - 1)):
                field, mantissa = code >> p, code & (2 ** p - 1)
                if specials == "e4m3" and code == 2 ** (bits - 1) - 1:
                    continue  # S.1111.111 is NaN
                if specials == "ieee" and field == 2 ** exponent_bits - 1:
                    continue  # Inf and NaN
                if field == 0:
                    value = mantissa * pow2(1 - bias - p)
                else:
                    value = (2 ** p + mantissa) * pow2(field - bias - p)
                table.append((value, code))
        table.sort()
        self.values = [v for v, _ in table]
        self.codes = [c for _, c in table]
        self.code_of = dict(table)
        self.value_of = {c: v for v, c in table}
        assert self.values[-1] == self.max_normal, (name, self.values[-1])
        assert floor_log2(self.max_normal) == emax, name
        self.max_code = self.codes[-1]
        # The grid step at the top: the next value "without clamping" would be
        # max_normal + top_step, with the significand parity opposite to max_normal's.
        self.top_step = self.values[-1] - self.values[-2]

    def round_magnitude(self, x: Fraction, away: bool) -> int:
        """The magnitude code nearest x >= 0 (ties to even code or away from zero),
        clamped to max_normal."""
        if x >= self.max_normal:
            return self.max_code
        i = bisect.bisect_right(self.values, x)  # values[i-1] <= x < values[i]
        lo, hi = self.values[i - 1], self.values[i]
        if x == lo:
            return self.codes[i - 1]
        below, above = x - lo, hi - x
        if below != above:
            return self.codes[i - 1] if below < above else self.codes[i]
        if away:
            return self.codes[i]
        return self.codes[i - 1] if self.codes[i - 1] % 2 == 0 else self.codes[i]

    def rounds_past_max(self, x: Fraction, away: bool) -> bool:
        """Whether x >= 0 rounded to the format's grid with no clamping would exceed
        max_normal: above the midpoint to the next grid value, or on it when the tie
        goes up (away, or that value's significand is the even one)."""
        if x <= self.max_normal:
            return False
        midpoint = self.max_normal + self.top_step / 2
        if x != midpoint:
            return x > midpoint
        return away or self.max_code % 2 == 1

    def encode(self, negative: bool, magnitude: Fraction, exponent: int, away: bool) -> int:
        """The code of (-1)^negative · magnitude / 2^exponent."""
        m = self.round_magnitude(magnitude / pow2(exponent), away)
        if self.kind == "int":
            return (-m) & 0xFF if negative else m
        return m | (int(negative) << (self.bits - 1))

    def decode(self, code: int) -> Fraction:
        """The value of a (finite) element code, without the block scale."""
        if self.kind == "int":
            return Fraction(code - 256 if code >= 128 else code, 64)
        sign = code >> (self.bits - 1)
        value = self.value_of[code & (2 ** (self.bits - 1) - 1)]
        return -value if sign else value

    def zero_sign_free(self, code: int) -> int:
        """A zero code with its sign cleared (the shared set's README, item 6)."""
        if self.kind == "int":
            return code
        return 0 if code & (2 ** (self.bits - 1) - 1) == 0 else code


FORMATS = [
    Format("MXFP8_E4M3", "float", 8, 4, 3, 7, 8, 448, "e4m3"),
    Format("MXFP8_E5M2", "float", 8, 5, 2, 15, 15, 57344, "ieee"),
    Format("MXFP6_E3M2", "float", 6, 3, 2, 3, 4, 28, "none"),
    Format("MXFP6_E2M3", "float", 6, 2, 3, 1, 2, Fraction(15, 2), "none"),
    Format("MXFP4_E2M1", "float", 4, 2, 1, 1, 2, 6, "none"),
    Format("MXINT8", "int", 8, 0, 0, 0, 0, Fraction(127, 64), "none"),
]
FORMAT_BY_NAME = {f.name: f for f in FORMATS}


# --- the block quantizer ---------------------------------------------------------------


def shared_exponent(fmt: Format, rule: str, away: bool, amax: Fraction) -> int:
    if amax == 0:
        return E_MIN
    if rule in ("floor", "no_saturation"):
        e = floor_log2(amax) - fmt.emax
    elif rule == "ceil":
        e = ceil_log2(amax) - fmt.emax
    elif rule == "rceil":
        q = round_to_f32(amax / fmt.max_normal)
        e = E_MIN if q == 0 else ceil_log2(q)
    else:
        raise ValueError(f"unknown rule {rule!r}")
    e = min(max(e, E_MIN), E_MAX)
    if rule == "no_saturation" and e < E_MAX and fmt.rounds_past_max(amax / pow2(e), away):
        e += 1
    return e


def quantize_block(fmt: Format, rule: str, rounding: str, values: list[int]):
    """(scale byte, codes) of up to 32 FP32 bit patterns (a short block as if padded
    with +0; one code per value given)."""
    away = rounding == "away"
    parts = [f32_parts(b) for b in values]
    if any(kind != "finite" for _, kind, _ in parts):
        return NAN_SCALE, [0] * len(values)
    amax = max((m for _, _, m in parts), default=Fraction(0))
    e = shared_exponent(fmt, rule, away, amax)
    codes = [fmt.encode(negative, m, e, away) for negative, _, m in parts]
    return e - E_MIN, codes


# --- the blocks ------------------------------------------------------------------------------


def next_up(bits: int) -> int:
    """The next FP32 away from zero (same sign)."""
    return bits + 1


def next_down(bits: int) -> int:
    """The next FP32 toward zero (same sign); bits must not be a zero."""
    assert bits & 0x7FFFFFFF
    return bits - 1


def below(rng: random.Random, amax_bits: int, count: int, binades: int = 12) -> list[int]:
    """`count` FP32 values of random sign whose magnitudes lie within `binades`
    binades below the magnitude amax_bits (strictly below it): non-negative FP32
    bit patterns order as their values."""
    top = amax_bits & 0x7FFFFFFF
    span = min(top, binades << 23)
    out = []
    for _ in range(count):
        m = top - 1 - rng.getrandbits(32) % span if span else 0
        out.append(m | (rng.getrandbits(1) << 31))
    return out


def place(rng: random.Random, amax_bits: int, others: list[int], negative_max: bool = False):
    """A block of 32: the others, with the block maximum put at a position the rng
    picks (negative when negative_max)."""
    block = list(others[:BLOCK - 1])
    assert len(block) == BLOCK - 1
    block.insert(rng.getrandbits(5), amax_bits | (0x80000000 if negative_max else 0))
    return block


def element_midpoints(fmt: Format, scale: Fraction) -> list[Fraction]:
    """Midpoints between adjacent non-negative element values (the subnormal range
    and half of the smallest step included), times scale."""
    v = fmt.values
    return [(v[i] + v[i + 1]) / 2 * scale for i in range(len(v) - 1)]


def pick(items: list, count: int) -> list:
    """`count` items spread evenly over the list, its first and last included (the
    list repeated where it is shorter)."""
    if len(items) <= count:
        return [items[i % len(items)] for i in range(count)]
    return [items[(i * (len(items) - 1)) // (count - 1)] for i in range(count)]


def blocks_for(fmt: Format) -> list[tuple[str, list[int]]]:
    """(label, 32 FP32 bit patterns) for every edge of every rule, for one format."""
    rng = random.Random(f"mx-scale-rules/{fmt.name}")
    m, emax = fmt.max_normal, fmt.emax
    b = f32_bits
    out: list[tuple[str, list[int]]] = []

    def add(label, amax_bits, others=None, negative_max=False, binades=12):
        if others is None:
            others = below(rng, amax_bits, BLOCK - 1, binades)
        out.append((label, place(rng, amax_bits, others, negative_max)))

    # Powers of two: floor and ceil agree; just below, ceil is floor + 1 and a
    # floating-point log2 would round up; just above, ceil is floor + 1.
    add("amax_pow2", b(Fraction(1)))
    add("amax_pow2_negative", b(pow2(20)), negative_max=True)
    add("amax_pow2_next_down", next_down(b(pow2(5))))
    add("amax_pow2_next_up", next_up(b(pow2(-3))))
    # max_normal · 2^3: floor's scaled amax is exactly max normal; rceil's q is 8.
    top = b(m * 8)
    add("amax_max_normal_x8", top)
    add("amax_max_normal_x8_next_up", next_up(top))
    add("amax_max_normal_x8_next_down", next_down(top))
    # Between max normal and the next grid value (times 2^-2): floor saturates there;
    # no_saturation bumps past the midpoint, and on it when the tie goes up.
    mid = b((m + fmt.top_step / 2) / 4)
    add("amax_saturating_midpoint", mid)
    add("amax_saturating_midpoint_next_down", next_down(mid))
    add("amax_saturating_midpoint_next_up", next_up(mid), negative_max=True)
    # The top of the binade: every rule but floor takes the next exponent.
    add("amax_binade_top", next_down(b(pow2(emax + 1 - 6))))
    # Values that all saturate under floor: max normal .. 2^(emax+1), times 2^9.
    sat = [b(round_to_f32((m + (pow2(emax + 1) - m) * Fraction(i, 40)) * pow2(9)))
           for i in range(BLOCK - 1)]
    sat = [s | (0x80000000 if i % 3 == 1 else 0) for i, s in enumerate(sat)]
    add("saturation_range", next_down(b(pow2(emax + 10))), others=sat)
    # Element ties: amax = 2^(emax+s) pins e = s under every rule (rceil's
    # q = 2^(emax+s)/max_normal lies in (2^(s-1), 2^s)); the others are exact midpoints
    # between element values, both signs, and the same moved one FP32 ulp.
    for s in (-20, 7):
        mids = [b(x) for x in pick(element_midpoints(fmt, pow2(s)), BLOCK - 1)]
        mids = [x | (0x80000000 if i % 2 else 0) for i, x in enumerate(mids)]
        add(f"element_ties_s{s}", b(pow2(emax + s)), others=mids)
    mids = [b(x) for x in pick(element_midpoints(fmt, pow2(-3)), BLOCK - 1)]
    near = [next_up(x) if i % 2 else next_down(x) for i, x in enumerate(mids)]
    near = [x | (0x80000000 if i % 4 >= 2 else 0) for i, x in enumerate(near)]
    add("element_near_ties", b(pow2(emax - 3)), others=near)
    # Mixed signs with values that round to zero (and -0.0): -0 codes.
    tiny = [0x80000000, 0x00000000, b(pow2(-40)), b(-pow2(-40)), b(-pow2(-100)), 0x80000001]
    half_min = fmt.values[1] / 2  # half the smallest element step (a tie at floor's e = 0)
    tiny += [b(half_min), b(-half_min), next_down(b(half_min)) | 0x80000000, next_up(b(half_min))]
    add("round_to_zero_mixed", b(Fraction(3, 2) * pow2(emax)),
        others=tiny + below(rng, b(Fraction(3, 2) * pow2(emax)), BLOCK - 1 - len(tiny), 20))
    # FP32 subnormal block maxima: floor clamps at -127; rceil's q may underflow to 0.
    add("fp32_subnormal", 0x00012345, binades=8)
    add("fp32_subnormal_min", 0x00000001,
        others=[0x00000001, 0x80000001, 0x00000000, 0x80000000] * 7 + [0x80000001] * 3)
    add("fp32_min_normal", b(pow2(-126)), negative_max=True)
    # rceil at the bottom: q = max_normal·2^-127 / max_normal is exactly 2^-127; one
    # FP32 step above it, q rounds back down onto 2^-127 (grid 2^-149) for every
    # format whose max normal is >= 2, so e stays -127 while ceil(log2(exact ratio))
    # would be -126.
    low = b(m * pow2(-127))
    add("rceil_ratio_pow2_bottom", low)
    add("rceil_ratio_rounds_down_bottom", next_up(low))
    add("rceil_ratio_pow2_next_up", next_up(b(m * pow2(-60))))
    # The top of the E8M0 range: ceil and rceil reach 128 (clamped to 127) for MXINT8.
    add("amax_f32_max", 0x7F7FFFFF, binades=40)
    add("amax_2^127", b(pow2(127)), negative_max=True)
    add("amax_1.5x2^127", b(Fraction(3, 2) * pow2(127)), binades=3)
    # Zeros.
    out.append(("zeros", [0] * BLOCK))
    out.append(("signed_zeros", [0x80000000 if i % 3 else 0 for i in range(BLOCK)]))
    # NaN and Inf blocks: scale 0xFF and codes 0, whatever the signs.
    nan_block = [b(Fraction(-(i + 1), 8)) for i in range(BLOCK)]
    nan_block[9] = 0x7FC00000
    out.append(("nan", nan_block))
    neg_nan = below(rng, b(Fraction(100)), BLOCK)
    neg_nan[0], neg_nan[31] = 0xFFC00001, 0x7F800001  # -qNaN with payload, sNaN
    out.append(("nan_negative_and_signaling", neg_nan))
    inf_block = [0x80000000] + below(rng, b(Fraction(1000)), BLOCK - 1)
    inf_block[17] = 0x7F800000
    out.append(("inf", inf_block))
    ninf = below(rng, b(pow2(-130)), BLOCK)
    ninf[4] = 0xFF800000
    out.append(("negative_inf", ninf))
    # Random blocks: amax anywhere from FP32 subnormals to 2^127, the others spread
    # over up to 40 binades below it.
    for i in range(4):
        field = rng.getrandbits(8) % 255
        amax = (field << 23) | rng.getrandbits(23)
        add(f"random_{i}", amax, negative_max=bool(rng.getrandbits(1)), binades=10 + 10 * i)
    return out


def make_cases() -> list[dict]:
    cases = []
    for fmt in FORMATS:
        blocks = blocks_for(fmt)
        for rule in RULES:
            for rounding in ROUNDINGS:
                for label, values in blocks:
                    scale, codes = quantize_block(fmt, rule, rounding, values)
                    cases.append({"format": fmt.name, "rule": rule, "rounding": rounding,
                                  "block": label, "values": [hex32(v) for v in values],
                                  "scale": scale, "codes": codes})
    return cases


DESCRIPTION = (
    "MX block quantization under the four scale rules (floor, no_saturation, ceil, "
    "rceil), both roundings (even: ties to even; away: ties away from zero), every MX "
    "format. Written by tests/golden/make_scale_rule_vectors.py, an exact rational "
    "model independent of mx/ (see its docstring for the rules). Each case is one "
    "block of 32 FP32 values (bit patterns), its E8M0 scale byte (e + 127; 255 for a "
    "block holding NaN or Inf) and its 32 element codes as mx::QuantizeBlock writes "
    "them: FP sign|exponent|mantissa with the input's sign bit (so -0.0 and negative "
    "values that round to zero give the negative-zero code), MXINT8 the "
    "two's-complement byte of k (value k/64, |k| <= 127), all 0 in a NaN/Inf block. "
    "'block' names the edge the block was built to hit.")


def render(cases: list[dict]) -> str:
    """The JSON text: one case per line, deterministic."""
    lines = ["{", f'  "description": {json.dumps(DESCRIPTION)},', '  "cases": [']
    for i, case in enumerate(cases):
        sep = "," if i + 1 < len(cases) else ""
        lines.append("    " + json.dumps(case, separators=(",", ":")) + sep)
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


# --- the shared golden set --------------------------------------------------------------------


def check_shared(directory: pathlib.Path) -> int:
    """Runs the floor rule (rounding even) over every quantize case of the shared
    golden set; returns the number of mismatches, each printed."""
    manifest = directory / "manifest.json"
    if not manifest.exists():
        print(f"check-shared: no golden vectors at {directory}", file=sys.stderr)
        return -1
    cases = [c for c in json.loads(manifest.read_text())["cases"] if c["op"] == "quantize"]
    mismatches = blocks = 0

    def read(f):
        data = (directory / f["path"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise SystemExit(f"check-shared: {f['path']}: sha256 differs from the manifest")
        if f["dtype"].startswith("float32"):
            return list(struct.unpack(f"<{len(data) // 4}I", data))
        return list(data)

    for case in cases:
        fmt = FORMAT_BY_NAME[case["format"]]
        files = case["files"]
        x, out = read(files["input"]), read(files["output"])
        scales, codes = read(files["scales_e8m0"]), read(files["element_codes"])
        for start in range(0, len(x), BLOCK):
            block = x[start:start + BLOCK]
            blocks += 1
            scale, got = quantize_block(fmt, "floor", case["rounding"], block)
            where = f"{case['id']} block {start // BLOCK}"
            if scale != scales[start // BLOCK]:
                mismatches += 1
                print(f"{where}: scale {scale}, shared {scales[start // BLOCK]}")
                continue
            for i, code in enumerate(got):
                want = codes[start + i]
                value = fmt.decode(code) * pow2(scale + E_MIN)
                negative, kind, magnitude = f32_parts(out[start + i])
                shared_value = -magnitude if negative else magnitude
                if (fmt.zero_sign_free(code) != fmt.zero_sign_free(want) or kind != "finite"
                        or value != shared_value):
                    mismatches += 1
                    print(f"{where} element {i} (input {hex32(block[i])}): code {code:#04x} "
                          f"value {value}, shared code {want:#04x} output {hex32(out[start + i])}")
    print(f"check-shared: {len(cases)} quantize cases, {blocks} blocks, floor rule: "
          f"{mismatches} mismatches")
    return mismatches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help=f"where to write the vectors (default {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory; exit 1 if --out differs")
    parser.add_argument("--check-shared", nargs="?", type=pathlib.Path, const=DEFAULT_SHARED,
                        metavar="DIR", help="check the floor rule against the shared golden "
                        f"quantize vectors (default {DEFAULT_SHARED}); exit 1 on any mismatch, "
                        "2 when they are missing")
    args = parser.parse_args(argv)
    status = 0
    if args.check_shared is not None:
        found = check_shared(args.check_shared)
        if found < 0:
            return 2
        status |= found > 0
    if args.check or args.check_shared is None:
        text = render(make_cases())
        if args.check:
            current = args.out.read_text() if args.out.exists() else None
            if current != text:
                print(f"check: {args.out} differs from what make_scale_rule_vectors.py writes; "
                      "rerun it to regenerate", file=sys.stderr)
                status |= 1
            else:
                print(f"check: {args.out} is up to date")
        else:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
            print(f"wrote {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
