"""mxserve.torch.offload against a real daemon: numerics, gradients, versions, restore."""

import os
import pathlib
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mxserve  # noqa: E402
from mxserve.torch import OffloadedLinear, offload  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
MXCTL = os.environ.get("MXCTL", str(REPO / "build" / "bin" / "mxctl"))

# Update runs in MXFP8 so the backward pass is quantized too.
MX_UPDATE_POLICY = {"name": "py-mx-update", "description": "MX formats in every phase",
                    "defaults": {"rollout": "MXFP4", "reward": "MXFP6_E3M2",
                                 "update": "MXFP8_E4M3"}}

# Relative Frobenius error of a layer output that a format can explain on Gaussian
# data (measured: MXFP4 ~0.10, MXFP6 ~0.03, MXFP8 ~0.03, FP16 ~3e-4), with headroom.
FORMAT_ERROR = {"MXFP4_E2M1": 0.25, "MXFP6_E3M2": 0.08, "MXFP6_E2M3": 0.08,
                "MXFP8_E4M3": 0.08, "MXFP8_E5M2": 0.15, "MXINT8": 0.02, "INT8": 0.02,
                "FP16": 2e-3, "BF16": 1e-2, "FP32": 1e-5}


def mlp():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 96, bias=False), nn.GELU(),
                         nn.Linear(96, 16))


def rel_error(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def quantize_rows(matrix: np.ndarray, fmt: str, tmp_path) -> np.ndarray:
    """Each row quantized along its length, by mxctl (the mx/ reference quantizer);
    rows are padded to whole 32-element blocks with zeros, which change no scale."""
    if fmt == "FP16":
        return matrix.astype(np.float16).astype(np.float64)
    rows, cols = matrix.shape
    padded = np.zeros((rows, -(-cols // 32) * 32), np.float32)
    padded[:, :cols] = matrix
    src, dst = tmp_path / "in.f32", tmp_path / "out.f32"
    padded.tofile(src)
    subprocess.run([MXCTL, "quantize", "--format", fmt, "--input", str(src), "--output",
                    str(dst)], check=True, capture_output=True)
    return np.fromfile(dst, np.float32).reshape(padded.shape)[:, :cols].astype(np.float64)


def test_every_linear_is_registered_under_its_module_name(client, model_name):
    model = mlp()
    params_before = [id(p) for p in model.parameters()]
    session = offload(model, client, name=model_name, policy="B-balanced")
    info = client.describe_model(model_name)
    assert [(l.spec.name, l.spec.out_features, l.spec.in_features, l.spec.bias)
            for l in info.layers] == [("0", 96, 64, True), ("2", 96, 96, False),
                                      ("4", 16, 96, True)]
    assert info.policy == "B-balanced" and info.weight_version == 1
    assert session.weight_version == 1
    assert all(isinstance(model[i], OffloadedLinear) for i in (0, 2, 4))
    assert [id(p) for p in model.parameters()] == params_before  # optimizers see no change
    session.restore()
    assert all(type(model[i]) is nn.Linear for i in (0, 2, 4))
    with pytest.raises(mxserve.MxserveError):
        client.describe_model(model_name)


def test_outputs_follow_the_policy_and_stay_within_the_formats_error(client, model_name):
    model = mlp()
    x = torch.randn(8, 64)
    with torch.no_grad():
        reference = model(x)
    with offload(model, client, name=model_name) as session, torch.no_grad():
        table = client.resolve_policy(model_name).table()
        for phase in mxserve.PHASES:
            with client.phase(phase):
                y = model(x)
            infos = session.last_infos()
            assert {n: i.format for n, i in infos.items()} == \
                {n: table[(phase, n)] for n in ("0", "2", "4")}
            worst = max(FORMAT_ERROR[i.format] for i in infos.values())
            assert y.dtype == torch.float32 and y.shape == (8, 16)
            assert rel_error(y, reference) < 2 * worst, (phase, infos)
    with torch.no_grad():  # back to local modules: exactly the original arithmetic again
        assert torch.equal(model(x), reference)


def test_offloading_adds_no_numerical_change_of_its_own(client, model_name):
    """A layer's output equals, bit for bit, Compute.Gemm on the same operands."""
    model = mlp()
    captured = {}
    with offload(model, client, name=model_name, policy="C-aggressive") as session:
        model[2].register_forward_hook(lambda m, inp, out: captured.update(x=inp[0], y=out))
        for phase in mxserve.PHASES:
            with client.phase(phase), torch.no_grad():
                model(torch.randn(5, 64))
            info = session.layers["2"].last_info
            gemm = client.gemm(captured["x"], model[2].weight.detach().t().contiguous(),
                               info.format, info.weight_format, phase=phase)
            assert captured["y"].numpy().tobytes() == gemm.output.numpy().tobytes(), phase
            assert info.weight_version == session.weight_version


def test_batched_and_half_precision_inputs(client, model_name):
    model = mlp()
    x = torch.randn(2, 3, 64)
    with offload(model, client, name=model_name, format="FP32"), torch.no_grad():
        with client.phase("reward"):
            y = model(x)
            y_half = model(x.to(torch.bfloat16))
    with torch.no_grad():
        reference = model(x)
    assert y.shape == (2, 3, 16)
    assert rel_error(y, reference) < 1e-5
    assert y_half.dtype == torch.bfloat16 and rel_error(y_half.float(), reference) < 0.05


@pytest.mark.parametrize("fmt", ["MXFP8_E4M3", "FP16"])
def test_gradients_match_a_local_computation_on_the_quantized_operands(client, model_name,
                                                                      tmp_path, fmt):
    torch.manual_seed(5)
    layer = nn.Linear(70, 45)  # neither dimension a multiple of 32
    model = nn.Sequential(layer)
    x = torch.randn(37, 70, requires_grad=True)
    dy = torch.randn(37, 45)
    with offload(model, client, name=model_name, format=fmt):
        with client.phase("update"):
            (model(x) * dy).sum().backward()  # so dL/dy = dy
        info = model[0].last_backward_info
    assert (info.format, info.weight_format) == (fmt, fmt)

    w, d, xv = layer.weight.detach().numpy(), dy.numpy(), x.detach().numpy()
    # grad_input = dY·W: dY blocked along out_features, W quantized along out_features.
    expected_dx = quantize_rows(d, fmt, tmp_path) @ quantize_rows(w.T.copy(), fmt, tmp_path).T
    # grad_weight = dYᵀ·X: both blocked along M.
    expected_dw = quantize_rows(d.T.copy(), fmt, tmp_path) @ \
        quantize_rows(xv.T.copy(), fmt, tmp_path).T
    for remote, expected, exact in ((x.grad, expected_dx, d @ w),
                                    (layer.weight.grad, expected_dw, d.T @ xv)):
        scale = np.abs(expected).max()
        # FP32 sums of exact block dots: a few FP32 roundings off the FP64 product.
        np.testing.assert_allclose(remote.numpy(), expected, rtol=1e-5, atol=1e-5 * scale)
        # ... while the unquantized gradient is measurably elsewhere.
        assert np.abs(exact - expected).max() > 10 * 1e-5 * scale
    np.testing.assert_allclose(layer.bias.grad.numpy(), d.sum(0), rtol=1e-5, atol=1e-5)


def test_local_grad_weight_is_plain_fp32(client, model_name):
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(40, 24))
    x = torch.randn(9, 40)
    dy = torch.randn(9, 24)
    with offload(model, client, name=model_name, grad_weight="local", format="MXFP4"):
        with client.phase("update"):
            (model(x) * dy).sum().backward()
    assert torch.equal(model[0].weight.grad, dy.t() @ x)
    assert torch.equal(model[0].bias.grad, dy.sum(0))


def test_backward_runs_in_the_run_and_phase_of_its_forward(client, model_name):
    # loss.backward() outside the scopes still books under the forward's run: an
    # experiment's energy includes its backward passes.
    model = mlp()
    x = torch.randn(4, 64)
    with offload(model, client, name=model_name):
        with client.run("offload-test/run-1"), client.phase("update"):
            y = model(x)
        assert client.current_run is None
        with client.run("offload-test/elsewhere"):
            y.sum().backward()
    update = client.energy_report(run="offload-test/run-1").by_phase("fpga_model")["update"]
    assert update.requests == 6  # three forwards, three backwards (grad_weight remote)
    assert client.energy_report(run="offload-test/elsewhere").entries == ()
    assert all(p.grad is not None for p in model.parameters())


def test_training_works_unchanged_and_sync_weights_publishes(client, model_name):
    model = mlp()
    client.put_policy(MX_UPDATE_POLICY)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, target = torch.randn(32, 64), torch.randn(32, 16)
    session = offload(model, client, name=model_name, policy="py-mx-update")
    losses = []
    for step in range(4):
        with client.phase("update"):
            loss = nn.functional.mse_loss(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert session.changed_layers() == ["0", "2", "4"]
        assert session.sync_weights() == step + 2
        assert client.describe_model(model_name).weight_version == step + 2
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    with client.phase("rollout"), torch.no_grad():
        before = model(x)
        assert session.sync_weights() == 5  # nothing changed: no new version
        model[4].bias.add_(1.0)
        assert session.changed_layers() == ["4"]
        assert session.sync_weights() == 6
        after = model(x)
    assert model[4].last_info.weight_version == 6
    torch.testing.assert_close(after, before + 1.0, rtol=1e-4, atol=1e-4)
    session.restore()
    client.delete_policy("py-mx-update")


class Conv1D(nn.Module):
    """The shape of transformers.pytorch_utils.Conv1D (GPT-2): W stored [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).reshape(
            *x.shape[:-1], self.nf)


def test_gpt2_style_conv1d_layers_are_offloaded_too(client, model_name):
    torch.manual_seed(8)
    block = nn.ModuleDict({"c_attn": Conv1D(48, 32), "c_proj": nn.Linear(48, 32)})
    x = torch.randn(4, 32, requires_grad=True)
    expected = block["c_proj"](block["c_attn"](x))
    expected.sum().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    for p in block.parameters():
        p.grad = None
    with offload(block, client, name=model_name, format="FP32"):
        assert client.describe_model(model_name).layers[0].spec == \
            mxserve.LayerSpec("c_attn", 48, 32, True)
        with client.phase("update"):
            y = block["c_proj"](block["c_attn"](x))
        y.sum().backward()
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip([p.grad for p in block.parameters()], grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_bad_arguments(client, model_name):
    with pytest.raises(ValueError, match="grad_weight"):
        offload(mlp(), client, name=model_name, grad_weight="gpu")
    with pytest.raises(ValueError, match="no nn.Linear"):
        offload(nn.Sequential(nn.ReLU()), client, name=model_name)
    model = mlp()
    with offload(model, client, name=model_name):
        with pytest.raises(mxserve.MxserveError) as error:
            offload(mlp(), client, name=model_name)
        assert error.value.code.name == "ALREADY_EXISTS"
        with pytest.raises(ValueError, match="input has 10 features"):
            model(torch.randn(2, 10))
        with pytest.raises(mxserve.MxserveError, match="phase"):
            model(torch.randn(2, 64))  # no phase scope
        replaced = offload(mlp(), client, name=model_name, replace=True)
        assert replaced.weight_version == 1


def test_a_policy_that_rounds_the_update_stochastically_gets_a_seed_per_call(client, model_name):
    """The session sends every call a seed from its own and the call's number: a
    policy's stochastic update rounding works, the same session seed repeats the
    gradients bit for bit, and another gives others."""
    client.put_policy({"name": "py-sr-update", "defaults": {
        "rollout": "MXFP4", "reward": "MXFP4", "update": "MXFP4"},
        "roundings": {"update": "stochastic"}})
    torch.manual_seed(6)
    x, dy = torch.randn(12, 64), torch.randn(12, 16)

    def grads(seed, name):
        model = mlp()
        with offload(model, client, name=name, policy="py-sr-update", seed=seed):
            with client.phase("update"):
                (model(x) * dy).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    first = grads(1, model_name)
    again = grads(1, model_name + "-again")
    other = grads(2, model_name + "-other")
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
