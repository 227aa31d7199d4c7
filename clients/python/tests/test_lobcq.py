"""LO-BCQ end to end: tests/golden/lobcq.json (an exact rational model of the
recipe, its own code) against the torch emulator (CPU, and CUDA where there is
one) at every geometry, mxctl's reference quantizer and GEMM, the real daemon's
Gemm on the cpu backend and its refusal on hls-sim; and the codebook
calibration (mxserve.torch.lobcq)."""

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import grpc  # noqa: E402

import mxserve  # noqa: E402
from mxserve import energy_model  # noqa: E402
from mxserve.torch import emulator as em  # noqa: E402
from mxserve.torch import lobcq  # noqa: E402

from conftest import Daemon, REPO, check_golden_generator  # noqa: E402
from test_codebook import run_mxctl_gemm  # noqa: E402
from test_profile import register_small  # noqa: E402
from test_emulator import assert_same_bits, hex_floats as floats  # noqa: E402

VECTORS = REPO / "tests" / "golden" / "lobcq.json"
MXCTL = REPO / "build" / "bin" / "mxctl"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def golden():
    return json.loads(VECTORS.read_text())


def geometry_of(case):
    return em.LoBcqGeometry(**case["geometry"])


def test_checked_in_vectors_are_what_the_generator_writes():
    check_golden_generator("make_lobcq_vectors.py")


def test_the_frozen_codebooks_are_the_golden_ones():
    assert em.lobcq_codebooks().tolist() == golden()["default_codebooks"]


@pytest.mark.parametrize("device", DEVICES)
def test_emulator_quantizes_every_golden_case_at_its_geometry(device):
    for case in golden()["quantize"]:
        rows, cols = case["rows"], case["cols"]
        g = geometry_of(case)
        x = floats(case["values"]).reshape(rows, cols).to(device)
        op = em.quantize_lobcq(x, case["codebooks"], g)
        assert em.element_codes(op).cpu().reshape(-1).tolist() == case["codes"], case["id"]
        assert op.selectors.cpu().reshape(-1).tolist() == case["selectors"], case["id"]
        assert_same_bits(op.scale.cpu().reshape(-1), floats(case["scales"]), case["id"])
        if case["codebooks"] is None and g == em.LOBCQ_W4A4:
            # The format: quantize() by name, whatever the rounding (no seed needed).
            again = em.quantize(x, "LO_BCQ", "stochastic")
            assert torch.equal(em.element_codes(again), em.element_codes(op)), case["id"]


@pytest.mark.parametrize("device", DEVICES)
def test_emulator_gemm_gives_every_golden_case(device):
    for case in golden()["gemm"]:
        m, k, n = case["m"], case["k"], case["n"]
        a = floats(case["a"]).reshape(m, k).to(device)
        b = floats(case["b"]).reshape(k, n).to(device)
        bias = None if case["bias"] is None else floats(case["bias"]).to(device)
        got = em.linear(em.quantize(a, case["format_a"]), em.quantize(b.t(), case["format_b"]),
                        bias)
        assert_same_bits(got.cpu(), floats(case["c"]).reshape(m, n), case["id"])


def test_mxctl_writes_the_golden_codes_selectors_and_scales(tmp_path):
    checked = 0
    for case in golden()["quantize"]:
        if case["rows"] != 1 or case["codebooks"] is not None:
            continue  # mxctl quantizes a file as one row, in the format's frozen set
        checked += 1
        floats(case["values"]).numpy().tofile(tmp_path / "in.f32")
        done = subprocess.run([str(MXCTL), "quantize", "--format", "LO_BCQ", "--input",
                               str(tmp_path / "in.f32"), "--output", str(tmp_path / "out.f32"),
                               "--scales", str(tmp_path / "s.bin"), "--codes",
                               str(tmp_path / "c.u8")], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert np.fromfile(tmp_path / "c.u8", np.uint8).tolist() == case["codes"], case["id"]
        # Per array: the FP32 scale, then 8 selector nibbles (low first).
        raw = np.fromfile(tmp_path / "s.bin", np.uint8).reshape(-1, 8)
        scales = torch.from_numpy(raw[:, :4].copy().view(np.float32).reshape(-1))
        assert_same_bits(scales, floats(case["scales"]), case["id"])
        nibbles = np.stack([raw[:, 4:] & 15, raw[:, 4:] >> 4], axis=2).reshape(-1)
        assert nibbles.tolist() == case["selectors"], case["id"]
        # The dequantized output: fp32(entry · scale).
        want = em.dequantize(em.quantize(floats(case["values"])[None, :], "LO_BCQ"))
        got = torch.from_numpy(np.fromfile(tmp_path / "out.f32", np.float32))
        assert_same_bits(got, want.reshape(-1), case["id"])
    assert checked >= 2


def test_every_golden_gemm_on_the_cpu_daemon_and_mxctl(tmp_path):
    d = Daemon("--backend", "cpu", "--workers", "1")
    try:
        with mxserve.Client(d.address, timeout=60) as c:
            c.wait_ready(timeout=10)
            checked = 0
            for case in golden()["gemm"]:
                if case["bias"] is not None:
                    continue  # a Gemm has no bias (the kernel tests take those)
                checked += 1
                m, k, n = case["m"], case["k"], case["n"]
                want = floats(case["c"]).reshape(m, n)
                a, b = floats(case["a"]).reshape(m, k), floats(case["b"]).reshape(k, n)
                result = c.gemm(a, b, case["format_a"], case["format_b"], phase="rollout")
                assert result.info.kernel.endswith("f32")
                assert_same_bits(result.output, want, f"{case['id']} Gemm")
                assert_same_bits(run_mxctl_gemm(tmp_path, case), want, f"{case['id']} mxctl")
                assert_same_bits(run_mxctl_gemm(tmp_path, case, d.address), want,
                                 f"{case['id']} mxctl --server")
                sr = c.gemm(a, b, case["format_a"], case["format_b"], phase="update",
                            rounding="stochastic")
                assert_same_bits(sr.output, want, f"{case['id']} stochastic, no seed")
            assert checked >= 1
    finally:
        assert d.stop() == 0, "\n".join(d.log_lines[-20:])


def test_hls_sim_refuses_lo_bcq_by_name_and_keeps_serving():
    d = Daemon("--backend", "hls-sim", "--workers", "1")
    try:
        with mxserve.Client(d.address, timeout=60) as c:
            c.wait_ready(timeout=10)
            a, b = torch.randn(2, 64), torch.randn(64, 3)
            with pytest.raises(mxserve.MxserveError) as refused:
                c.gemm(a, b, "LO_BCQ", phase="rollout")
            assert refused.value.code == grpc.StatusCode.UNIMPLEMENTED
            assert refused.value.message.startswith(
                "format: LO_BCQ is not in the FPGA kernel (--backend hls-sim)")
            assert "--backend cpu and the torch emulator compute it exactly" in \
                refused.value.message
            assert c.gemm(a, b, "NF4", phase="rollout").output.shape == (2, 3)
            # Its profiles offer only what it serves: a policy generated from
            # them is one this daemon can run.
            register_small(c, "lobcq-hls")
            try:
                profile = c.profile("lobcq-hls")
                assert "LO_BCQ" not in profile.formats and "NF4" in profile.formats
                assert len(profile.formats) == len(em._SPECS) - 2  # all but FP32, LO_BCQ
            finally:
                c.delete_model("lobcq-hls")
    finally:
        assert d.stop() == 0, "\n".join(d.log_lines[-20:])


# --- calibration -----------------------------------------------------------------------


def laplace(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(rows, cols, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def test_calibration_descends_is_reproducible_and_beats_the_frozen_set_on_its_data():
    g = em.LoBcqGeometry(block_len=8, array_len=64, codebooks=4)
    x = laplace(64, 256, seed=3)
    books, report = lobcq.calibrate([x], g, iterations=12, seed=5)
    assert books.shape == (4, 16) and books.dtype == torch.int64
    assert int(books.abs().max()) <= 31
    assert report.blocks == 64 * 256 // 8 and 1 <= report.rounds <= 12
    # Each round clusters and designs optimally on the integer grid: the error
    # never rises.
    assert all(b <= a for a, b in zip(report.mse, report.mse[1:])), report.mse
    again, _ = lobcq.calibrate([x], g, iterations=12, seed=5)
    assert torch.equal(books, again)
    # Quantizing with the calibrated books: the quantizer's own error on x's
    # grid is the calibration's last (best) figure.
    t, _ = em.lobcq_grid(x, g.array_len)
    blocks = t.reshape(-1, g.block_len)
    assert lobcq.quantization_mse(blocks, books, g.block_len) == pytest.approx(min(report.mse))
    # Four codebooks fitted to this layer against the first four of the frozen set.
    frozen = em.lobcq_codebooks()[:4]
    assert lobcq.quantization_mse(blocks, books, 8) < lobcq.quantization_mse(blocks, frozen, 8)
    # And the calibrated books quantize and dequantize through the emulator.
    op = em.quantize_lobcq(x, books, g)
    err = (em.dequantize(op) - x).pow(2).mean()
    assert 0 < float(err) < float(x.pow(2).mean()) / 50


def test_the_frozen_set_is_what_calibration_gives():
    """python -m mxserve.torch.lobcq --check: the tables are the documented
    calibration's output (about half a minute on two cores)."""
    done = subprocess.run([sys.executable, "-m", "mxserve.torch.lobcq", "--check"],
                          capture_output=True, text=True, timeout=600,
                          cwd=REPO / "clients" / "python")
    assert done.returncode == 0, done.stdout + done.stderr


def test_calibration_and_quantizer_refuse_bad_input_by_field():
    with pytest.raises(ValueError, match=r"^block_len: expected 1 to 64, got 0$"):
        em.LoBcqGeometry(block_len=0)
    with pytest.raises(ValueError, match=r"^array_len: expected a multiple of block_len \(8\)"):
        em.LoBcqGeometry(array_len=60)
    with pytest.raises(ValueError, match=r"^codebooks: expected 1 to 16, got 17$"):
        em.LoBcqGeometry(codebooks=17)
    with pytest.raises(ValueError, match=r"^codebooks: expected shape \(4, 16\), got \(16, 16\)$"):
        em.quantize_lobcq(torch.ones(1, 64), em.lobcq_codebooks(), em.LoBcqGeometry(codebooks=4))
    with pytest.raises(ValueError, match=r"^codebooks: entries are INT6, expected -31 to 31"):
        em.quantize_lobcq(torch.ones(1, 64), torch.full((16, 16), 40))
    with pytest.raises(ValueError, match=r"^codebooks: the default set has 16 codebooks"):
        em.lobcq_codebooks(None, em.LoBcqGeometry(codebooks=4))
    with pytest.raises(ValueError, match=r"^samples: no whole finite non-zero array of 64"):
        lobcq.calibrate([torch.zeros(4, 128), torch.ones(3, 10)])
    with pytest.raises(ValueError, match=r"^samples\[0\]: expected a 1-D or 2-D tensor, got 3-D$"):
        lobcq.calibrate([torch.ones(2, 2, 64)])
    with pytest.raises(ValueError, match=r"^iterations: expected at least 1, got 0$"):
        lobcq.calibrate([torch.ones(1, 64)], iterations=0)


def test_energy_model_counts_lo_bcq_scales_and_selectors():
    # 3 rows of 130: 3 arrays of 64 per row, 32 bytes of codes and 8 of scale and
    # selectors each.
    assert energy_model.packed_bytes("LO_BCQ", 3, 130) == 3 * 3 * (32 + 8)
    assert em.LOBCQ_W4A4.bits_per_element == 4.0 + 4 / 8 + 32 / 64
