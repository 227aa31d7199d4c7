"""NF4 and bitsandbytes FP4 end to end: tests/golden/codebook.json (an exact
rational model of the recipe, its own code) against the torch emulator (CPU, and
CUDA where there is one), mxctl's reference quantizer and GEMM, and the real
daemon's Gemm on the cpu and hls-sim (FPGA kernel) backends."""

import json
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxserve  # noqa: E402
from mxserve.torch import emulator as em  # noqa: E402

from conftest import Daemon, REPO, check_golden_generator  # noqa: E402
from test_emulator import assert_same_bits, hex_floats as floats  # noqa: E402

VECTORS = REPO / "tests" / "golden" / "codebook.json"
MXCTL = REPO / "build" / "bin" / "mxctl"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def golden():
    return json.loads(VECTORS.read_text())


def test_checked_in_vectors_are_what_the_generator_writes():
    check_golden_generator("make_codebook_vectors.py")


@pytest.mark.parametrize("device", DEVICES)
def test_emulator_quantizes_every_golden_case(device):
    for case in golden()["quantize"]:
        rows, cols = case["rows"], case["cols"]
        x = floats(case["values"]).reshape(rows, cols).to(device)
        op = em.quantize(x, case["format"])
        assert em.element_codes(op).cpu().reshape(-1).tolist() == case["codes"], case["id"]
        assert_same_bits(op.absmax.cpu().reshape(-1), floats(case["absmax"]), case["id"])
        # The rounding modes do not apply (no seed needed either).
        again = em.quantize(x, case["format"], "stochastic")
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


def test_mxctl_writes_the_golden_codes_and_absmax(tmp_path):
    for case in golden()["quantize"]:
        if case["rows"] != 1:
            continue  # mxctl quantizes a file as one row
        floats(case["values"]).numpy().tofile(tmp_path / "in.f32")
        done = subprocess.run([str(MXCTL), "quantize", "--format", case["format"], "--input",
                               str(tmp_path / "in.f32"), "--output", str(tmp_path / "out.f32"),
                               "--scales", str(tmp_path / "s.bin"), "--codes",
                               str(tmp_path / "c.u8")], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert np.fromfile(tmp_path / "c.u8", np.uint8).tolist() == case["codes"], case["id"]
        absmax = torch.from_numpy(np.fromfile(tmp_path / "s.bin", np.float32))
        assert_same_bits(absmax, floats(case["absmax"]), case["id"])


def run_mxctl_gemm(tmp_path, case, server=None) -> torch.Tensor:
    m, k, n = case["m"], case["k"], case["n"]
    floats(case["a"]).numpy().tofile(tmp_path / "a.f32")
    floats(case["b"]).numpy().tofile(tmp_path / "b.f32")
    args = [str(MXCTL), "gemm", "--format", case["format_a"], "--format-b", case["format_b"],
            "--a", str(tmp_path / "a.f32"), "--b", str(tmp_path / "b.f32"), "--m", str(m),
            "--k", str(k), "--n", str(n), "--output", str(tmp_path / "c.f32")] + \
        (["--server", server] if server else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return torch.from_numpy(np.fromfile(tmp_path / "c.f32", np.float32)).reshape(m, n)


@pytest.mark.parametrize("backend", ["cpu", "hls-sim"])
def test_every_golden_gemm_on_the_daemon_and_mxctl(tmp_path, backend):
    d = Daemon("--backend", backend, "--workers", "1")
    try:
        with mxserve.Client(d.address, timeout=60) as c:
            c.wait_ready(timeout=10)
            for case in golden()["gemm"]:
                if case["bias"] is not None:
                    continue  # a Gemm has no bias (the kernel tests take those)
                m, k, n = case["m"], case["k"], case["n"]
                want = floats(case["c"]).reshape(m, n)
                a, b = floats(case["a"]).reshape(m, k), floats(case["b"]).reshape(k, n)
                result = c.gemm(a, b, case["format_a"], case["format_b"], phase="rollout")
                assert result.info.kernel.endswith("f32" if backend == "cpu" else "hls/float")
                assert_same_bits(result.output, want, f"{case['id']} Gemm on {backend}")
                assert_same_bits(run_mxctl_gemm(tmp_path, case), want, f"{case['id']} mxctl")
                assert_same_bits(run_mxctl_gemm(tmp_path, case, d.address), want,
                                 f"{case['id']} mxctl --server ({backend})")
                # A policy asking for stochastic rounding: a codebook needs no seed.
                sr = c.gemm(a, b, case["format_a"], case["format_b"], phase="update",
                            rounding="stochastic")
                assert_same_bits(sr.output, want, f"{case['id']} stochastic, no seed")
    finally:
        assert d.stop() == 0, "\n".join(d.log_lines[-20:])
