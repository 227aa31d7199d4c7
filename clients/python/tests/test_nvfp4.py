"""NVFP4 end to end: the torch emulator (CPU, and CUDA where there is one) against
tests/golden/nvfp4.json (an exact rational model of the recipe, its own code),
mxctl's reference quantizer and GEMM, and the real daemon — Gemm, LayerForward and
LayerBackward on the cpu backend bit for bit, and the golden GEMMs on the cpu and
hls-sim (FPGA kernel) backends and through `mxctl gemm`."""

import json
import struct
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxserve  # noqa: E402
from mxserve.torch import emulator as em  # noqa: E402
from mxserve.types import LayerSpec  # noqa: E402

from conftest import Daemon, REPO, check_golden_generator  # noqa: E402
from test_emulator import assert_same_bits, hex_floats as floats, hostile  # noqa: E402

VECTORS = REPO / "tests" / "golden" / "nvfp4.json"
MXCTL = REPO / "build" / "bin" / "mxctl"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def golden():
    return json.loads(VECTORS.read_text())


def test_checked_in_vectors_are_what_the_generator_writes():
    check_golden_generator("make_nvfp4_vectors.py")


@pytest.mark.parametrize("device", DEVICES)
def test_emulator_quantizes_every_golden_case(device):
    for case in golden()["quantize"]:
        rows, cols = case["rows"], case["cols"]
        x = floats(case["values"]).reshape(rows, cols).to(device)
        given = floats([case["tensor_scale"]])[0].item() if case["given_tensor_scale"] else None
        op = em.quantize(x, "NVFP4", tensor_scale=given)
        assert em.nv_scale_bytes(op).cpu().reshape(-1).tolist() == case["scales"], case["id"]
        assert em.element_codes(op, x).cpu().reshape(-1).tolist() == case["codes"], case["id"]
        assert op.tensor_scale.cpu().view(torch.int32).tolist() == \
            [struct.unpack("<i", bytes.fromhex(case["tensor_scale"])[::-1])[0]] * rows, case["id"]


@pytest.mark.parametrize("device", DEVICES)
def test_emulator_gemm_gives_every_golden_case(device):
    for case in golden()["gemm"]:
        m, k, n = case["m"], case["k"], case["n"]
        a = floats(case["a"]).reshape(m, k).to(device)
        b = floats(case["b"]).reshape(k, n).to(device)
        bias = None if case["bias"] is None else floats(case["bias"]).to(device)
        got = em.linear(em.quantize(a, "NVFP4"), em.quantize(b.t(), "NVFP4"), bias)
        assert_same_bits(got.cpu(), floats(case["c"]).reshape(m, n), case["id"])


def test_mxctl_writes_the_golden_scales_and_codes(tmp_path):
    for case in golden()["quantize"]:
        if case["given_tensor_scale"] or case["rows"] != 1:
            continue  # mxctl quantizes a file as one tensor of one row
        values = floats(case["values"]).numpy()
        values.tofile(tmp_path / "in.f32")
        done = subprocess.run([str(MXCTL), "quantize", "--format", "nvfp4", "--input",
                               str(tmp_path / "in.f32"), "--output", str(tmp_path / "out.f32"),
                               "--scales", str(tmp_path / "s.u8"), "--codes",
                               str(tmp_path / "c.u8")], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert np.fromfile(tmp_path / "s.u8", np.uint8).tolist() == case["scales"], case["id"]
        assert np.fromfile(tmp_path / "c.u8", np.uint8).tolist() == case["codes"], case["id"]


@pytest.mark.parametrize("device", DEVICES)
def test_the_daemon_computes_nvfp4_with_the_emulators_bits(client, device):
    """The module's daemon (conftest.py: the cpu backend)."""
    a, b = hostile(6, 70, seed=41, specials=True), hostile(70, 33, seed=42, specials=True)
    result = client.gemm(a, b, "NVFP4", phase="rollout")
    assert result.info.format == "NVFP4" and result.info.kernel.endswith("/nv_i8")
    got = em.linear(em.quantize(a.to(device), "NVFP4"), em.quantize(b.t().to(device), "NVFP4"))
    assert_same_bits(got.cpu(), result.output, f"Gemm on {device}")

    n, k, m = 40, 70, 9
    g = torch.Generator().manual_seed(8)
    weight, bias = torch.randn(n, k, generator=g) * 0.1, torch.randn(n, generator=g)
    x, dy = hostile(m, k, seed=43, specials=False), hostile(m, n, seed=44, specials=False)
    name = f"nv-{device}"
    client.register_model(name, [LayerSpec("fc", n, k, True)])
    client.upload_weights(name, {"fc": (weight, bias)}, publish=True)
    wd, xd, dyd = weight.to(device), x.to(device), dy.to(device)
    forward = client.forward(name, "fc", x, format="NVFP4", phase="rollout")
    assert_same_bits(em.linear(em.quantize(xd, "NVFP4"), em.quantize(wd, "NVFP4"),
                               bias.to(device)).cpu(), forward.output, "forward")
    backward = client.backward(name, "fc", dy, x, format="NVFP4", phase="update")
    assert_same_bits(em.grad_input(dyd, wd, "NVFP4").cpu(), backward.grad_input, "grad_input")
    assert_same_bits(em.grad_weight(dyd, xd, "NVFP4").cpu(), backward.grad_weight, "grad_weight")
    # Stochastic rounding applies to NVFP4's elements too.
    sr = client.backward(name, "fc", dy, x, format="NVFP4", phase="update",
                             rounding="stochastic", seed=5)
    assert_same_bits(em.grad_weight(dyd, xd, "NVFP4", "stochastic", seed=5).cpu(),
                     sr.grad_weight, "stochastic grad_weight")
    client.delete_model(name)


def run_mxctl_gemm(tmp_path, a, b, server=None) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    a.numpy().tofile(tmp_path / "a.f32")
    b.numpy().tofile(tmp_path / "b.f32")
    args = [str(MXCTL), "gemm", "--format", "nvfp4", "--a", str(tmp_path / "a.f32"), "--b",
            str(tmp_path / "b.f32"), "--m", str(m), "--k", str(k), "--n", str(n), "--output",
            str(tmp_path / "c.f32")] + (["--server", server] if server else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return torch.from_numpy(np.fromfile(tmp_path / "c.f32", np.float32)).reshape(m, n)


@pytest.mark.parametrize("backend", ["cpu", "hls-sim"])
def test_every_golden_gemm_on_the_daemon_and_mxctl(tmp_path, backend):
    """The golden GEMMs through the daemon's Gemm (no bias) or a LayerForward of
    a layer holding B's transpose and the bias, and through `mxctl gemm`
    locally and --server: the cases' bits on the cpu backend and on hls-sim (the
    FPGA kernel's C++, its NVFP4 datapath)."""
    kernel = "hls/nv_blocks" if backend == "hls-sim" else "/nv_i8"
    d = Daemon("--backend", backend, "--workers", "1")
    try:
        with mxserve.Client(d.address, timeout=60) as c:
            c.wait_ready(timeout=10)
            for case in golden()["gemm"]:
                m, k, n = case["m"], case["k"], case["n"]
                a, b = floats(case["a"]).reshape(m, k), floats(case["b"]).reshape(k, n)
                want = floats(case["c"]).reshape(m, n)
                if case["bias"] is None:
                    result = c.gemm(a, b, "NVFP4", phase="rollout")
                    assert result.info.kernel.endswith(kernel), result.info.kernel
                    assert_same_bits(result.output, want, f"{case['id']} Gemm on {backend}")
                    assert_same_bits(run_mxctl_gemm(tmp_path, a, b), want,
                                     f"{case['id']} mxctl gemm")
                    assert_same_bits(run_mxctl_gemm(tmp_path, a, b, d.address), want,
                                     f"{case['id']} mxctl gemm --server ({backend})")
                else:
                    name = f"golden-{case['id']}"
                    c.register_model(name, [LayerSpec("fc", n, k, True)])
                    c.upload_weights(name, {"fc": (b.t().contiguous(), floats(case["bias"]))},
                                     publish=True)
                    result = c.forward(name, "fc", a, format="NVFP4", phase="rollout")
                    assert result.info.kernel.endswith(kernel), result.info.kernel
                    assert_same_bits(result.output, want, f"{case['id']} LayerForward on {backend}")
                    c.delete_model(name)
    finally:
        assert d.stop() == 0, "\n".join(d.log_lines[-20:])
