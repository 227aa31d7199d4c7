"""mxserve.torch.emulator against the daemon's numerics, bit for bit: ../shared/golden/mx,
mxctl's reference quantizer and GEMM (both roundings, both scale rules), and the
real daemon (cpu backend) over gRPC for every format pair, ragged K, subnormal and
extreme scales, NaN/Inf blocks, and a layer's forward, grad_input, grad_weight and
grad_bias."""

import itertools
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mxserve import _wire  # noqa: E402
from mxserve.torch import emulator as em  # noqa: E402
from mxserve.types import LayerSpec  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
GOLDEN = REPO.parent / "shared" / "golden" / "mx"
MXCTL = os.environ.get("MXCTL", str(REPO / "build" / "bin" / "mxctl"))

MX = ["MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3", "MXFP4_E2M1", "MXINT8"]
ALL = MX + ["INT8", "BF16", "FP16", "FP32"]


def bits(t: torch.Tensor, zero_sign: bool = True) -> np.ndarray:
    """FP32 bits, every NaN the same (payloads are not part of the contract), and
    without `zero_sign` every zero +0."""
    a = t.detach().cpu().float().contiguous().numpy().copy()
    a[np.isnan(a)] = np.float32("nan")
    if not zero_sign:
        a[a == 0] = 0.0
    return a.view(np.uint32)


def hex_floats(hexes) -> torch.Tensor:
    """FP32 values from the golden files' 8-digit hex bit patterns."""
    bits = torch.tensor([int(h, 16) for h in hexes], dtype=torch.int64)
    return torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(torch.float32)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str,
                     zero_sign: bool = True) -> None:
    g, w = bits(got, zero_sign), bits(want, zero_sign)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    differ = np.nonzero(g.reshape(-1) != w.reshape(-1))[0]
    if differ.size:
        i = differ[0]
        gv, wv = got.reshape(-1)[i].item(), want.reshape(-1)[i].item()
        pytest.fail(f"{what}: {differ.size} of {g.size} values differ; first at {i}: "
                    f"{gv!r} ({g.reshape(-1)[i]:#010x}) != {wv!r} ({w.reshape(-1)[i]:#010x})")


def assert_matches_contract(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor,
                            w: torch.Tensor, fmt: str, what: str,
                            bias: torch.Tensor = None) -> None:
    """The emulator's bits (`want`), except BF16 x BF16: the daemon runs it on pair
    instructions on AVX-512/AMX CPUs (mx/README.md, "BF16 on pair instructions"),
    held like every float path to FP64 within K 2^-24 (sum|x w| + |bias|), x
    (M x K) and w (N x K) rounded to BF16; a non-finite output keeps its bits."""
    if fmt != "BF16":
        assert_same_bits(got, want, what)
        return
    xd, wd = x.bfloat16().double(), w.bfloat16().double()
    b = bias.double() if bias is not None else torch.zeros(wd.shape[0], dtype=torch.float64)
    exact = xd @ wd.t() + b
    bound = xd.shape[1] * 2.0 ** -24 * (xd.abs() @ wd.abs().t() + b.abs())
    finite = torch.isfinite(want)
    assert_same_bits(got[~finite], want[~finite], what + " (non-finite outputs)")
    error = (got.double() - exact).abs()
    outside = finite & ~(error <= bound)
    if bool(outside.any()):
        i = tuple(int(v) for v in outside.nonzero()[0])
        pytest.fail(f"{what}: {int(outside.sum())} outputs outside the float bound; first "
                    f"{i}: {got[i].item()!r}, FP64 {exact[i].item()!r} ± {bound[i].item()!r}, "
                    f"emulator {want[i].item()!r}")


def hostile(rows: int, cols: int, seed: int, specials: bool = True) -> torch.Tensor:
    """Gaussian blocks whose magnitudes range from FP32 subnormals to 2^125, with
    zero, -0, NaN and Inf blocks when `specials`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    blocks = -(-cols // 32)
    exponent = torch.randint(-40, 40, (rows, blocks), generator=g).double()
    exponent[0, 0] = -140.0   # FP32 subnormals
    exponent[-1, -1] = 120.0  # products overflow
    if rows > 2 and blocks > 1:
        exponent[1, 1] = -75.0  # block results among FP32 subnormals when multiplied
    scale = torch.pow(2.0, exponent).repeat_interleave(32, dim=1)[:, :cols]
    x = (x * scale).float()
    if specials and rows > 3 and cols > 5:
        x[2, :min(cols, 32)] = 0.0
        x[2, 1] = -0.0
        x[3, 5] = float("nan")
        x[rows - 1, 0] = float("inf")
    return x


# --- golden vectors -----------------------------------------------------------------------


def _golden():
    manifest = GOLDEN / "manifest.json"
    if not manifest.exists():
        pytest.skip(f"golden vectors not found at {GOLDEN}")
    return json.loads(manifest.read_text())["cases"]


def _load(f):
    dtype = np.float32 if f["dtype"].startswith("float32") else np.uint8
    return np.fromfile(GOLDEN / f["path"], dtype=dtype).reshape(f["shape"])


def _zero_sign_free(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Codes with the sign of zero cleared (golden README: compare zeros without it)."""
    width = em.format_spec(fmt).bits
    magnitude = codes & ((1 << (width - 1)) - 1)
    return np.where(magnitude == 0, 0, codes)


def test_golden_quantize_bit_for_bit():
    cases = [c for c in _golden() if c["op"] == "quantize"]
    assert len(cases) == 12
    for case in cases:
        x = torch.from_numpy(_load(case["files"]["input"])).reshape(1, -1)
        q = em.quantize(x, case["format"], case["rounding"])
        assert_same_bits(em.dequantize(q).reshape(-1),
                         torch.from_numpy(_load(case["files"]["output"])), case["id"],
                         zero_sign=False)  # golden README: compare zeros without their sign
        np.testing.assert_array_equal(em.scale_bytes(q).numpy().reshape(-1),
                                      _load(case["files"]["scales_e8m0"]), err_msg=case["id"])
        np.testing.assert_array_equal(
            _zero_sign_free(em.element_codes(q, x).numpy().reshape(-1), case["format"]),
            _zero_sign_free(_load(case["files"]["element_codes"]), case["format"]),
            err_msg=case["id"])


def test_golden_matmul_operands_and_result():
    cases = [c for c in _golden() if c["op"] == "matmul"]
    assert len(cases) == 12
    for case in cases:
        a = torch.from_numpy(_load(case["files"]["A"]))
        b = torch.from_numpy(_load(case["files"]["B"]))
        qa, qb = em.quantize(a, case["format"]), em.quantize(b.t(), case["format"])
        assert_same_bits(em.dequantize(qa), torch.from_numpy(_load(case["files"]["A_dequantized"])),
                         case["id"] + " A", zero_sign=False)
        assert_same_bits(em.dequantize(qb).t(),
                         torch.from_numpy(_load(case["files"]["B_dequantized"])), case["id"] + " B",
                         zero_sign=False)
        # The contract rounds per block, the golden C64 once: |C - C64| <= K·2^-23·(|A|·|B|).
        c = em.linear(qa, qb).double()
        c64 = torch.from_numpy(_load(case["files"]["C_from_float64"])).double()
        bound = case["K"] * 2.0 ** -23 * (em.dequantize(qa).double().abs()
                                          @ em.dequantize(qb).double().abs().t())
        assert bool(((c - c64).abs() <= bound).all()), case["id"]


# --- mxctl's reference (scale rules, roundings) ---------------------------------------------


def _mxctl(*args):
    if not pathlib.Path(MXCTL).exists():
        pytest.skip(f"mxctl not built at {MXCTL}")
    subprocess.run([MXCTL, *args], check=True, capture_output=True, timeout=60)


@pytest.mark.parametrize("rounding,rule", [("even", "floor"), ("away", "floor"),
                                           ("even", "nosat"), ("away", "nosat")])
def test_quantizer_matches_mxctl_reference(tmp_path, rounding, rule):
    x = hostile(3, 100, seed=5)  # ragged: 32, 32, 32, 4
    # Values that round past max normal under the floor rule: no_saturation bumps.
    x[0, 32:64] = torch.linspace(-1.0, 1.99, 32) * 2.0 ** 9
    x.numpy().tofile(tmp_path / "in.f32")
    for fmt in MX + ["INT8", "BF16", "FP16"]:
        _mxctl("quantize", "--format", fmt, "--rounding", rounding, "--scale-rule", rule,
               "--input", str(tmp_path / "in.f32"), "--output", str(tmp_path / "out.f32"),
               *(["--scales", str(tmp_path / "s.u8"), "--codes", str(tmp_path / "c.u8")]
                 if fmt in MX else []))
        flat = x.reshape(1, -1)  # mxctl blocks the file as one row
        q = em.quantize(flat, fmt, rounding, "no_saturation" if rule == "nosat" else "floor")
        want = torch.from_numpy(np.fromfile(tmp_path / "out.f32", dtype=np.float32))
        assert_same_bits(em.dequantize(q).reshape(-1), want, f"{fmt} {rounding} {rule}",
                         zero_sign=False)
        if fmt in MX:
            np.testing.assert_array_equal(em.scale_bytes(q).numpy().reshape(-1),
                                          np.fromfile(tmp_path / "s.u8", dtype=np.uint8))
            np.testing.assert_array_equal(
                em.element_codes(q, flat).numpy().reshape(-1),
                np.fromfile(tmp_path / "c.u8", dtype=np.uint8), err_msg=f"{fmt} codes")


def test_no_saturation_known_answer():
    # amax 470 in E4M3 (steps of 32 above 256): the floor rule's scale 2^0 rounds it
    # to 480, past max normal, so it is clamped to 448; the no-saturation rule takes
    # scale 2^1, and 235 rounds to 240 (steps of 16): 480, unclamped.
    x = torch.zeros(1, 32)
    x[0, 0] = 470.0
    floor = em.quantize(x, "MXFP8_E4M3")
    nosat = em.quantize(x, "MXFP8_E4M3", scale_rule="no_saturation")
    assert em.scale_bytes(floor).item() == 127 and em.dequantize(floor)[0, 0].item() == 448.0
    assert em.scale_bytes(nosat).item() == 128 and em.dequantize(nosat)[0, 0].item() == 480.0
    # 462 rounds to 448 under the floor rule: no bump.
    x[0, 0] = 462.0
    assert em.scale_bytes(em.quantize(x, "MXFP8_E4M3", scale_rule="no_saturation")).item() == 127
    # MXINT8 amax 127.5/64: k = 127.5 ties to 128, past 127, so the block takes scale
    # 2^1 (k = 63.75 rounds to 64: 2.0), as mxctl --scale-rule nosat does.
    x[0, 0] = 127.5 / 64
    nosat = em.quantize(x, "MXINT8", scale_rule="no_saturation")
    assert em.scale_bytes(nosat).item() == 128 and em.dequantize(nosat)[0, 0].item() == 2.0


def test_nan_block_codes_are_zero_whatever_the_signs():
    # mx::QuantizeBlock writes 32 codes 0 for a block holding NaN or Inf; the signs
    # of its values (a negative NaN included) do not reach the codes.
    x = -torch.arange(1.0, 65.0).reshape(1, 64)
    x[0, 3] = float("nan")
    x[0, 40] = -float("inf")
    for fmt in MX:
        q = em.quantize(x, fmt)
        assert em.scale_bytes(q).reshape(-1).tolist() == [255, 255]
        assert em.element_codes(q, x).reshape(-1).tolist() == [0] * 64, fmt


def test_gemm_matches_mxctl_reference_both_rules(tmp_path):
    a, b = hostile(5, 70, seed=11, specials=False), hostile(70, 6, seed=12, specials=False)
    a.numpy().tofile(tmp_path / "a.f32")
    b.numpy().tofile(tmp_path / "b.f32")
    for fmt, rule, rounding in itertools.product(["MXFP4_E2M1", "MXFP8_E5M2", "MXINT8"],
                                                 ["floor", "nosat"], ["even", "away"]):
        _mxctl("gemm", "--format", fmt, "--format-b", "MXFP8_E4M3", "--rounding", rounding,
               "--scale-rule", rule, "--a", str(tmp_path / "a.f32"), "--b",
               str(tmp_path / "b.f32"), "--m", "5", "--k", "70", "--n", "6", "--output",
               str(tmp_path / "c.f32"))
        r = "no_saturation" if rule == "nosat" else "floor"
        got = em.linear(em.quantize(a, fmt, rounding, r),
                        em.quantize(b.t(), "MXFP8_E4M3", rounding, r))
        want = torch.from_numpy(np.fromfile(tmp_path / "c.f32", dtype=np.float32)).reshape(5, 6)
        assert_same_bits(got, want, f"{fmt} x MXFP8_E4M3 {rounding} {rule}")


# --- the daemon ------------------------------------------------------------------------------


def test_every_format_pair_matches_the_daemon(client):
    """Compute.Gemm (A per row, B per column) against the emulator: all 36 MX pairs,
    INT8, the float formats and mixed kinds, K ragged, extreme scales, NaN/Inf."""
    a, b = hostile(6, 70, seed=1), hostile(70, 5, seed=2).t().contiguous().t()
    pairs = list(itertools.product(MX, MX)) + [("INT8", "INT8"), ("BF16", "BF16"),
                                              ("FP16", "FP16"), ("FP32", "FP32"),
                                              ("MXFP4_E2M1", "BF16"), ("INT8", "FP16")]
    for (fa, fb), rounding in itertools.product(pairs, ["even", "away"]):
        if rounding == "away" and (fa, fb) not in (("MXFP4_E2M1", "MXFP8_E5M2"),
                                                   ("MXINT8", "MXINT8"), ("INT8", "INT8"),
                                                   ("MXFP6_E3M2", "MXFP6_E2M3")):
            continue  # the other pairs do not round differently from these
        result = client.gemm(a, b, fa, fb, phase="rollout", rounding=rounding)
        want = em.linear(em.quantize(a, fa, rounding), em.quantize(b.t(), fb, rounding))
        assert_matches_contract(result.output, want, a, b.t(),
                                fa if fa == fb else "mixed", f"{fa} x {fb} ({rounding})")


def test_wide_e5m2_pairs_match_the_daemon(client):
    """E5M2 blocks spanning 2^-16 to 2^15 in units: block dots past 2^53, the
    emulator's limb path (the daemon's +exact_wide)."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(4, 96, generator=g) * torch.pow(2.0, torch.randint(-16, 16, (4, 96),
                                                                        generator=g).float())
    b = torch.randn(96, 3, generator=g) * torch.pow(2.0, torch.randint(-16, 16, (96, 3),
                                                                        generator=g).float())
    qa, qb = em.quantize(a, "MXFP8_E5M2"), em.quantize(b.t(), "MXFP8_E5M2")
    assert 32 * float(qa.fixed.abs().max()) * float(qb.fixed.abs().max()) >= 2.0 ** 53
    for fb in ("MXFP8_E5M2", "MXFP8_E4M3"):
        result = client.gemm(a, b, "MXFP8_E5M2", fb, phase="update")
        assert_same_bits(em.linear(qa, em.quantize(b.t(), fb)), result.output, f"E5M2 x {fb}")


@pytest.mark.parametrize("fmt", ALL)
def test_layer_forward_and_backward_match_the_daemon(client, model_name, fmt):
    """LayerForward and LayerBackward (grad_input, grad_weight, grad_bias) on a
    registered layer: the emulator's bits, in every format (BF16: the float bound)."""
    n, k, m = 40, 70, 9
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(n, k, generator=g) * 0.1
    weight[3, :32] *= 2.0 ** -60  # a tiny block among ordinary ones
    bias = torch.randn(n, generator=g)
    x = hostile(m, k, seed=8, specials=False)
    dy = hostile(m, n, seed=9, specials=False)
    client.register_model(model_name, [LayerSpec("fc", n, k, True)])
    client.upload_weights(model_name, {"fc": (weight, bias)}, publish=True)
    forward = client.forward(model_name, "fc", x, format=fmt, phase="update")
    assert forward.info.format == _wire.format_name(_wire.format_to_wire(fmt))
    assert_matches_contract(forward.output,
                            em.linear(em.quantize(x, fmt), em.quantize(weight, fmt), bias),
                            x, weight, fmt, f"{fmt} forward", bias)
    backward = client.backward(model_name, "fc", dy, x, format=fmt, phase="update")
    assert_matches_contract(backward.grad_input, em.grad_input(dy, weight, fmt), dy, weight.t(),
                            fmt, f"{fmt} grad_input")
    assert_matches_contract(backward.grad_weight, em.grad_weight(dy, x, fmt), dy.t(), x.t(),
                            fmt, f"{fmt} grad_weight")
    assert_same_bits(em.column_sums(dy), backward.grad_bias, f"{fmt} grad_bias")
    client.delete_model(model_name)


def test_bf16_and_fp16_inputs_widen_exactly(client):
    a = hostile(4, 64, seed=3, specials=False)
    b = hostile(64, 4, seed=4, specials=False)
    for dtype in (torch.bfloat16, torch.float16):
        a16, b16 = (a * 2.0 ** -60).to(dtype), b.to(dtype)  # keep FP16 in range
        result = client.gemm(a16.float(), b16.float(), "MXFP6_E2M3", phase="reward")
        assert_same_bits(em.linear(em.quantize(a16, "MXFP6_E2M3"),
                                   em.quantize(b16.t(), "MXFP6_E2M3")),
                         result.output, f"{dtype} input")


# --- the emulator's own properties -------------------------------------------------------------


def test_tiling_does_not_change_bits(monkeypatch):
    a, b = hostile(7, 200, seed=21, specials=False), hostile(9, 200, seed=22, specials=False)
    for fmt in ("MXFP4_E2M1", "MXFP8_E4M3", "MXFP8_E5M2"):
        whole = em.linear(em.quantize(a, fmt), em.quantize(b, fmt))
        monkeypatch.setenv("MXSERVE_EMULATOR_TILE_BYTES", "1")  # one block at a time
        assert_same_bits(em.linear(em.quantize(a, fmt), em.quantize(b, fmt)), whole, fmt)
        monkeypatch.delenv("MXSERVE_EMULATOR_TILE_BYTES")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="format: unknown format 'MXFP5'"):
        em.quantize(torch.zeros(1, 32), "MXFP5")
    with pytest.raises(ValueError, match="rounding: expected one of"):
        em.quantize(torch.zeros(1, 32), "MXFP4", rounding="up")
    with pytest.raises(ValueError, match="scale_rule: expected one of"):
        em.quantize(torch.zeros(1, 32), "MXFP4", scale_rule="round")
    with pytest.raises(TypeError, match="x: expected a float32, float16 or bfloat16"):
        em.quantize(torch.zeros(1, 32, dtype=torch.int32), "MXFP4")
    with pytest.raises(ValueError, match=r"x: expected a 2-D tensor \[rows, K\]"):
        em.quantize(torch.zeros(32), "MXFP4")
    with pytest.raises(ValueError, match="w: expected K = 32 columns to match x, got 64"):
        em.linear(em.quantize(torch.zeros(1, 32), "MXFP4"), em.quantize(torch.zeros(1, 64), "MXFP4"))
    with pytest.raises(ValueError, match=r"bias: expected 2 values \(one per row of w\), got 3"):
        em.linear(em.quantize(torch.zeros(1, 32), "INT8"), em.quantize(torch.zeros(2, 32), "INT8"),
                  torch.zeros(3))
