"""The four MX scale rules (floor, no_saturation, ceil, rceil) in the torch emulator,
against tests/golden/scale_rules.json: vectors written by
tests/golden/make_scale_rule_vectors.py, an exact rational model that shares no code
with mx/ or the emulator. Also: the checked-in file is what the generator writes, the
generator's floor rule reproduces ../shared/golden/mx, its floor and no_saturation
vectors are what mxctl's reference quantizer writes, and a few answers worked out by
hand pin what each rule means."""

import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from mxserve.torch import emulator as em  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
GENERATOR = REPO / "tests" / "golden" / "make_scale_rule_vectors.py"
VECTORS = REPO / "tests" / "golden" / "scale_rules.json"
SHARED = REPO.parent / "shared" / "golden" / "mx"

MX = ["MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3", "MXFP4_E2M1", "MXINT8"]
RULES = ["floor", "no_saturation", "ceil", "rceil"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _generator(*args):
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True,
                          text=True, timeout=300)


def test_checked_in_vectors_are_what_the_generator_writes():
    done = _generator("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_generator_floor_rule_reproduces_the_shared_golden_set():
    if not (SHARED / "manifest.json").exists():
        pytest.skip(f"shared golden vectors not found at {SHARED}")
    done = _generator("--check-shared", str(SHARED))
    assert done.returncode == 0, done.stdout + done.stderr
    assert ": 0 mismatches" in done.stdout, done.stdout


def _cases():
    return json.loads(VECTORS.read_text())["cases"]


def test_vectors_cover_every_format_rule_and_rounding():
    cases = _cases()
    counts = {}
    for c in cases:
        key = (c["format"], c["rule"], c["rounding"])
        counts[key] = counts.get(key, 0) + 1
        assert len(c["values"]) == 32 and len(c["codes"]) == 32
    assert set(counts) == {(f, r, d) for f in MX for r in RULES for d in ("even", "away")}
    assert len(set(counts.values())) == 1  # the same blocks for every combination


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", RULES)
def test_emulator_reproduces_every_vector(rule, device):
    groups = {}
    for c in _cases():
        if c["rule"] == rule:
            groups.setdefault((c["format"], c["rounding"]), []).append(c)
    for (fmt, rounding), cases in groups.items():
        bits = torch.tensor([[int(v, 16) for v in c["values"]] for c in cases], dtype=torch.int64)
        # int32 bit patterns viewed as FP32 (int64 first: 0xFFC00001 does not fit int32).
        x = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(torch.float32)
        x = x.to(device)
        q = em.quantize(x, fmt, rounding, rule)
        scales = em.scale_bytes(q).cpu().reshape(-1).tolist()
        codes = em.element_codes(q, x).cpu().tolist()
        for i, c in enumerate(cases):
            where = f"{fmt} {rule} {rounding} block {c['block']!r}"
            assert scales[i] == c["scale"], f"{where}: scale byte {scales[i]}, want {c['scale']}"
            assert codes[i] == c["codes"], f"{where}: codes {codes[i]}, want {c['codes']}"


def test_every_rule_matches_mxctl(tmp_path):
    """Every rule through mxctl's reference quantizer (mx::QuantizeBlock): the
    generator and the C++ library agree byte for byte."""
    mxctl = os.environ.get("MXCTL", str(REPO / "build" / "bin" / "mxctl"))
    if not pathlib.Path(mxctl).exists():
        pytest.skip(f"mxctl not built at {mxctl}")
    groups = {}
    for c in _cases():
        groups.setdefault((c["format"], c["rule"], c["rounding"]), []).append(c)
    assert len(groups) == 6 * 4 * 2
    for (fmt, rule, rounding), cases in groups.items():
        values = [int(v, 16) for c in cases for v in c["values"]]
        (tmp_path / "in.f32").write_bytes(struct.pack(f"<{len(values)}I", *values))
        subprocess.run([mxctl, "quantize", "--format", fmt, "--rounding", rounding,
                        "--scale-rule", rule,
                        "--input", str(tmp_path / "in.f32"), "--output", str(tmp_path / "o.f32"),
                        "--scales", str(tmp_path / "s.u8"), "--codes", str(tmp_path / "c.u8")],
                       check=True, capture_output=True, timeout=60)
        scales, codes = (tmp_path / "s.u8").read_bytes(), (tmp_path / "c.u8").read_bytes()
        for i, c in enumerate(cases):
            where = f"{fmt} {rule} {rounding} block {c['block']!r}"
            assert scales[i] == c["scale"], f"{where}: mxctl scale {scales[i]}"
            assert list(codes[32 * i:32 * i + 32]) == c["codes"], f"{where}: mxctl codes"


# --- answers worked out by hand -------------------------------------------------------------
#
# MXFP8_E4M3: emax 8, max normal 448. MXFP4_E2M1: emax 2, max normal 6, values 0, 0.5, 1,
# 1.5, 2, 3, 4, 6. MXINT8: emax 0, max normal 127/64, values k/64.
KNOWN = [
    # format, block maximum (the block's other values are 0), rule, rounding,
    #   shared exponent e, the maximum's dequantized value
    # amax 1.5: floor(log2 1.5) = 0, so floor e = 0 - 8 = -8 (1.5·2^8 = 384 is exact:
    # no_saturation keeps it); ceil(log2 1.5) = 1, e = -7; rceil: q = 1.5/448 =
    # 0.00335 = 2^-8.22, e = -8.
    ("MXFP8_E4M3", 1.5, "floor", "even", -8, 1.5),
    ("MXFP8_E4M3", 1.5, "no_saturation", "even", -8, 1.5),
    ("MXFP8_E4M3", 1.5, "ceil", "even", -7, 1.5),
    ("MXFP8_E4M3", 1.5, "rceil", "even", -8, 1.5),
    # amax 1.0, a power of two: floor = ceil = 0 - 8 = -8; rceil: q = 1/448 = 0.00223 =
    # 2^-8.81, e = -8.
    ("MXFP8_E4M3", 1.0, "floor", "even", -8, 1.0),
    ("MXFP8_E4M3", 1.0, "ceil", "even", -8, 1.0),
    ("MXFP8_E4M3", 1.0, "rceil", "even", -8, 1.0),
    # amax 448 = max normal: floor e = 8 - 8 = 0; ceil(log2 448 = 8.81) = 9, e = 1
    # (448/2 = 224, exact); rceil: q = 448/448 = 1, e = 0.
    ("MXFP8_E4M3", 448.0, "floor", "even", 0, 448.0),
    ("MXFP8_E4M3", 448.0, "ceil", "even", 1, 448.0),
    ("MXFP8_E4M3", 448.0, "rceil", "even", 0, 448.0),
    # MXFP4 amax 5: floor e = 2 - 2 = 0, and 5 is the tie between 4 and 6: even gives
    # 4 (mantissa 0), away 6. ceil(log2 5) = 3, e = 1: 5/2 = 2.5 ties between 2 and 3,
    # even 2 (·2 = 4.0), away 3 (6.0). rceil: q = 5/6, ceil(log2 0.83) = 0, e = 0.
    ("MXFP4_E2M1", 5.0, "floor", "even", 0, 4.0),
    ("MXFP4_E2M1", 5.0, "floor", "away", 0, 6.0),
    ("MXFP4_E2M1", 5.0, "ceil", "even", 1, 4.0),
    ("MXFP4_E2M1", 5.0, "ceil", "away", 1, 6.0),
    ("MXFP4_E2M1", 5.0, "rceil", "even", 0, 4.0),
    # MXFP4 amax 7: floor e = 0, 7 is clamped to 6. Unclamped, 7 ties between 6
    # (mantissa 1) and the next grid value 8 (mantissa 0): even goes to 8, past max
    # normal, so no_saturation takes e = 1, where 7/2 = 3.5 ties between 3 and 4 and
    # goes to 4 (mantissa 0): 4·2 = 8.0. ceil(log2 7) = 3, e = 1; rceil: q = 7/6,
    # ceil(log2 1.17) = 1, e = 1: the same 8.0.
    ("MXFP4_E2M1", 7.0, "floor", "even", 0, 6.0),
    ("MXFP4_E2M1", 7.0, "no_saturation", "even", 1, 8.0),
    ("MXFP4_E2M1", 7.0, "ceil", "even", 1, 8.0),
    ("MXFP4_E2M1", 7.0, "rceil", "even", 1, 8.0),
    # MXFP4 amax 6.5: floor e = 0 clamps 6.5 to 6; unclamped it rounds to 6 (below the
    # midpoint 7), so no_saturation keeps e = 0. ceil and rceil (q = 6.5/6): e = 1,
    # 6.5/2 = 3.25 → 3 (6.0).
    ("MXFP4_E2M1", 6.5, "no_saturation", "even", 0, 6.0),
    ("MXFP4_E2M1", 6.5, "rceil", "even", 1, 6.0),
    # MXINT8 amax 1.0: floor = ceil = 0; rceil: q = 64/127 = 0.504, ceil(log2) = 0.
    ("MXINT8", 1.0, "floor", "even", 0, 1.0),
    ("MXINT8", 1.0, "ceil", "even", 0, 1.0),
    ("MXINT8", 1.0, "rceil", "even", 0, 1.0),
    # MXINT8 amax 127/64 = max normal: floor 0, ceil 1 (k = 63.5 → 64 even: 2.0 = 64·2/64;
    # away also 64), rceil: q = 1 exactly, e = 0.
    ("MXINT8", 127 / 64, "floor", "even", 0, 127 / 64),
    ("MXINT8", 127 / 64, "ceil", "even", 1, 2.0),
    ("MXINT8", 127 / 64, "rceil", "even", 0, 127 / 64),
    # MXINT8 amax 127.5/64: floor e = 0, k = 127.5 ties to 128 (even), clamped to 127;
    # past max normal, so no_saturation takes e = 1 (k = 63.75 → 64: 2.0); rceil: q =
    # 127.5/127 > 1, e = 1.
    ("MXINT8", 127.5 / 64, "floor", "even", 0, 127 / 64),
    ("MXINT8", 127.5 / 64, "no_saturation", "even", 1, 2.0),
    ("MXINT8", 127.5 / 64, "rceil", "even", 1, 2.0),
]


@pytest.mark.parametrize("fmt,amax,rule,rounding,exponent,value", KNOWN)
def test_known_answer(fmt, amax, rule, rounding, exponent, value):
    x = torch.zeros(1, 32)
    x[0, 3] = amax
    q = em.quantize(x, fmt, rounding, rule)
    assert em.scale_bytes(q).item() == exponent + 127
    assert em.dequantize(q)[0, 3].item() == value
    assert em.dequantize(q)[0, 0].item() == 0.0


def test_all_zero_and_nan_blocks_under_every_rule():
    x = torch.zeros(3, 32)
    x[1, :] = -torch.arange(32.0)
    x[1, 5] = float("nan")  # the NaN scale, and codes 0 whatever the signs
    x[2, 0] = 2.0 ** -149    # rceil: q = 2^-149/448 rounds to 0, e = -127
    for rule in RULES:
        q = em.quantize(x, "MXFP8_E4M3", scale_rule=rule)
        assert em.scale_bytes(q).reshape(-1).tolist() == [0, 255, 0], rule
        assert em.element_codes(q, x)[1].tolist() == [0] * 32, rule


def test_unknown_rule_names_the_four():
    with pytest.raises(ValueError, match="'floor', 'no_saturation', 'ceil', 'rceil'"):
        em.quantize(torch.zeros(1, 32), "MXFP4", scale_rule="round")


@pytest.mark.parametrize("backend", ["cpu", "hls-sim"])
def test_every_rule_on_the_daemon(backend):
    """Every vector through the daemon's Gemm (cpu, and hls-sim: the FPGA kernel's
    C++): A = the golden blocks under the rule and rounding, B = the 32 x 32
    identity in FP32, so C is A as the daemon quantized it — the golden scales
    and codes decoded (the emulator's dequantization, held to them above) —
    wherever a block's values are finite."""
    import mxserve
    from conftest import Daemon
    from test_emulator import assert_same_bits

    d = Daemon("--backend", backend, "--workers", "1")
    try:
        with mxserve.Client(d.address, timeout=60) as client:
            client.wait_ready(timeout=10)
            groups = {}
            for c in _cases():
                groups.setdefault((c["format"], c["rule"], c["rounding"]), []).append(c)
            identity = torch.eye(32)
            for (fmt, rule, rounding), cases in groups.items():
                bits = torch.tensor([[int(v, 16) for v in c["values"]] for c in cases],
                                    dtype=torch.int64)
                x = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32) \
                    .view(torch.float32)
                got = client.gemm(x, identity, fmt, "FP32", phase="rollout", rounding=rounding,
                                  scale_rule=rule)
                want = em.dequantize(em.quantize(x, fmt, rounding, rule))
                # A block with an Inf or NaN element (a NaN block; no_saturation's
                # overflow) spreads it over its whole row (Inf·0 = NaN); the rest
                # are x·1 plus zeros from +0, so a -0 element comes back +0.
                finite = torch.isfinite(want).all(dim=1)
                assert not torch.isfinite(got.output[~finite]).any()
                assert_same_bits(got.output[finite], want[finite],
                                 f"{fmt} {rule} {rounding} on {backend}", zero_sign=False)
    finally:
        assert d.stop() == 0, "\n".join(d.log_lines[-20:])
