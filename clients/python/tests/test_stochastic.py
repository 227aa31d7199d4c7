"""Seeded stochastic rounding, one set of bits everywhere: the emulator (CPU, and
CUDA where there is one) against the real daemon's cpu and hls-sim backends for
Gemm, LayerForward and LayerBackward (weight_rows slices included), the same
seed giving the same bits and another seed others, a policy that rounds the
update phase stochastically, and the errors when the seed is missing."""

import grpc
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxserve  # noqa: E402
from mxserve.torch import emulator as em  # noqa: E402
from mxserve.types import LayerSpec  # noqa: E402

from conftest import Daemon  # noqa: E402
from test_emulator import assert_same_bits, hostile  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FORMATS = ["MXFP4_E2M1", "MXFP6_E3M2", "MXFP8_E4M3", "MXFP8_E5M2", "MXINT8", "INT8", "NVFP4"]


def test_the_generators_known_answers():
    """The answers tests/mx/stochastic_test.cc pins for mx::StochasticBits."""
    index = torch.tensor([0, 1, (1 << 40) + 7, 999999])
    assert em.stochastic_bits(0, 0, index[:2]).tolist() == [0x0EAA7511, 0xF3AA8044]
    assert em.stochastic_bits(1, 0, index[:1]).tolist() == [0x62181B8D]
    assert em.stochastic_bits(0, 1, index[:1]).tolist() == [0x7D2B5EA8]
    assert em.stochastic_bits(0x123456789ABCDEF0, 3, index[2:3]).tolist() == [0x605C3FD3]
    assert em.stochastic_bits(42, 5, index[3:]).tolist() == [0x99222857]


@pytest.mark.parametrize("device", DEVICES)
def test_emulator_is_unbiased_and_keyed(device):
    """Over 2000 seeds each element's mean is within 5 standard errors of the
    value (nearest even is not, for most); one seed repeats, another differs."""
    x = torch.tensor([[1.0 + 2.0 ** -10, 2.7, -0.37, 5.1] * 8], device=device)
    seeds = 2000
    total = torch.zeros_like(x, dtype=torch.float64)
    for s in range(seeds):
        total += em.dequantize(em.quantize(x, "MXFP4", "stochastic", seed=s)).double()
    mean = total / seeds
    # MXFP4 with amax 5.1 (scale 1): steps 0.5 below 2, 1 below 4, 2 above.
    step = torch.tensor([0.5, 1.0, 0.5, 2.0] * 8, dtype=torch.float64, device=device)
    p = ((x.double().abs() % step) / step).clamp(1e-3, 1 - 1e-3)
    bound = 5 * step * torch.sqrt(p * (1 - p) / seeds)
    assert bool(((mean - x.double()).abs() <= bound).all()), (mean - x.double(), bound)
    nearest = em.dequantize(em.quantize(x, "MXFP4")).double()
    assert int(((nearest - x.double()).abs() > bound).sum()) >= 24
    one = em.element_codes(em.quantize(x, "MXFP4", "stochastic", seed=9))
    assert torch.equal(one, em.element_codes(em.quantize(x, "MXFP4", "stochastic", seed=9)))
    assert not torch.equal(one, em.element_codes(em.quantize(x, "MXFP4", "stochastic",
                                                             seed=10)))


def test_emulator_refuses_stochastic_without_a_seed():
    with pytest.raises(ValueError, match="seed: required"):
        em.quantize(torch.ones(1, 4), "MXFP4", "stochastic")


@pytest.fixture(scope="module", params=["cpu", "hls-sim"])
def backend_client(request):
    d = Daemon("--backend", request.param, "--workers", "2")
    with mxserve.Client(d.address, timeout=120) as c:
        c.wait_ready(timeout=10)
        c.backend = request.param
        yield c
    assert d.stop() == 0, "\n".join(d.log_lines[-20:])


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_matches_the_daemon_on_every_backend(backend_client, device):
    a, b = hostile(5, 70, seed=31, specials=True), hostile(70, 6, seed=32, specials=True)
    for fmt in FORMATS:
        result = backend_client.gemm(a, b, fmt, phase="update", rounding="stochastic",
                                     seed=2024)
        assert result.info.backend == backend_client.backend
        qa = em.quantize(a.to(device), fmt, "stochastic", seed=2024, stream=em.STREAMS["gemm_a"])
        qb = em.quantize(b.t().to(device), fmt, "stochastic", seed=2024,
                         stream=em.STREAMS["gemm_b"], transposed=True)
        assert_same_bits(em.linear(qa, qb).cpu(), result.output, f"{fmt} on {device}")
    even = backend_client.gemm(a, b, "MXFP4", phase="update")
    again = backend_client.gemm(a, b, "MXFP4", phase="update", rounding="stochastic", seed=2024)
    other = backend_client.gemm(a, b, "MXFP4", phase="update", rounding="stochastic", seed=2025)
    assert np.array_equal(result_bits(again), result_bits(
        backend_client.gemm(a, b, "MXFP4", phase="update", rounding="stochastic", seed=2024)))
    assert not np.array_equal(result_bits(again), result_bits(other))
    assert not np.array_equal(result_bits(again), result_bits(even))


def result_bits(result) -> np.ndarray:
    return np.asarray(result.output, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_calls_match_the_daemon_slices_included(backend_client, device):
    n, k, m = 40, 70, 9
    g = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(n, k, generator=g) * 0.1, torch.randn(n, generator=g)
    x, dy = hostile(m, k, seed=33, specials=False), hostile(m, n, seed=34, specials=False)
    name = f"sr-{device}"
    backend_client.register_model(name, [LayerSpec("fc", n, k, True)])
    backend_client.upload_weights(name, {"fc": (weight, bias)}, publish=True)
    xd, dyd = x.to(device), dy.to(device)
    for fmt in ("MXFP4_E2M1", "MXFP8_E4M3", "INT8", "NVFP4"):
        forward = backend_client.forward(name, "fc", x, format=fmt, phase="rollout",
                                         rounding="stochastic", seed=7)
        want = em.linear(em.quantize(xd, fmt, "stochastic", seed=7,
                                     stream=em.STREAMS["forward_input"]),
                         em.quantize(weight.to(device), fmt), bias.to(device))
        assert_same_bits(want.cpu(), forward.output, f"{fmt} forward on {device}")
        backward = backend_client.backward(name, "fc", dy, x, format=fmt, phase="update",
                                           rounding="stochastic", seed=8)
        assert_same_bits(em.grad_input(dyd, weight.to(device), fmt, "stochastic", seed=8).cpu(),
                         backward.grad_input, f"{fmt} grad_input on {device}")
        grad_weight = em.grad_weight(dyd, xd, fmt, "stochastic", seed=8).cpu()
        assert_same_bits(grad_weight, backward.grad_weight, f"{fmt} grad_weight on {device}")
        # Rows [10, 25) of grad_weight alone: the unsplit call's bits.
        part = backend_client.backward(name, "fc", dy[:, 10:25].contiguous(), x, format=fmt,
                                       phase="update", rounding="stochastic", seed=8,
                                       weight_rows=(10, 25))
        assert_same_bits(grad_weight[10:25], part.grad_weight, f"{fmt} slice")
    backend_client.delete_model(name)


def test_a_policy_rounds_the_update_phase_and_a_seed_is_then_required(backend_client):
    if backend_client.backend != "cpu":
        pytest.skip("policy resolution is the daemon's, whatever the backend")
    n, k, m = 16, 64, 4
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(6))
    x, dy = hostile(m, k, seed=35, specials=False), hostile(m, n, seed=36, specials=False)
    backend_client.put_policy({"name": "sr-update", "defaults": {
        "rollout": "MXFP4", "reward": "MXFP4", "update": "MXFP4"},
        "roundings": {"update": "stochastic"}})
    assert backend_client.get_policy("sr-update").document["roundings"] == {
        "update": "stochastic"}
    backend_client.register_model("sr-policy", [LayerSpec("fc", n, k, False)],
                                  policy="sr-update")
    backend_client.upload_weights("sr-policy", {"fc": weight}, publish=True)
    with pytest.raises(mxserve.MxserveError) as missing:
        backend_client.backward("sr-policy", "fc", dy, x, phase="update")
    assert missing.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "seed: required where the rounding is stochastic (the active policy's for phase " \
           "update)" in missing.value.message
    by_policy = backend_client.backward("sr-policy", "fc", dy, x, phase="update", seed=3)
    explicit = backend_client.backward("sr-policy", "fc", dy, x, phase="update",
                                       rounding="stochastic", seed=3)
    assert_same_bits(explicit.grad_weight, by_policy.grad_weight, "policy = explicit")
    # The rollout phase keeps nearest even: no seed needed, the deterministic bits.
    rollout = backend_client.forward("sr-policy", "fc", x, phase="rollout")
    assert_same_bits(em.linear(em.quantize(x, "MXFP4"), em.quantize(weight, "MXFP4")),
                     rollout.output, "rollout")
    backend_client.delete_model("sr-policy")


def test_gemm_without_a_seed_names_the_field(backend_client):
    a, b = torch.ones(2, 32), torch.ones(32, 2)
    with pytest.raises(mxserve.MxserveError) as missing:
        backend_client.gemm(a, b, "MXFP4", phase="update", rounding="stochastic")
    assert missing.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert missing.value.message.startswith(
        "seed: required where the rounding is stochastic (the request's rounding)")
    with pytest.raises(ValueError, match=r"seed: expected an integer in \[0, 2\^64\)"):
        backend_client.gemm(a, b, "MXFP4", rounding="stochastic", seed=-1)
    # The daemon kept serving.
    assert backend_client.gemm(a, b, "MXFP4", phase="update").output.shape == (2, 2)


def test_a_stochastic_policy_needs_no_seed_where_nothing_rounds(backend_client):
    """FP16 operands are converted to nearest even whatever the rounding: a policy
    that rounds the update stochastically asks no seed of an FP16 update layer."""
    if backend_client.backend != "cpu":
        pytest.skip("policy resolution is the daemon's, whatever the backend")
    n, k, m = 8, 32, 2
    backend_client.put_policy({"name": "sr-fp16-update", "defaults": {
        "rollout": "MXFP4", "reward": "MXFP4", "update": "FP16"},
        "roundings": {"update": "stochastic"}})
    backend_client.register_model("sr-fp16", [LayerSpec("fc", n, k, False)],
                                  policy="sr-fp16-update")
    backend_client.upload_weights("sr-fp16", {"fc": torch.ones(n, k)}, publish=True)
    result = backend_client.backward("sr-fp16", "fc", torch.ones(m, n), torch.ones(m, k),
                                     phase="update")
    assert result.info.format == "FP16"
    backend_client.delete_model("sr-fp16")
