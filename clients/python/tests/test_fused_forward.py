"""Compute.LayersForward (issue 37): layers that take one input in one call, each
output the bits its own LayerForward gives; and mxserve.torch's fuse=True, which
sends a block's q, k and v (gate and up) that way."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxserve  # noqa: E402
from mxserve.rlhf.models import KVCache, ModelConfig, build_model  # noqa: E402
from mxserve.torch import offload  # noqa: E402
from mxserve.v1 import compute_pb2  # noqa: E402

STOCHASTIC_MX = {"name": "py-fused-stochastic", "description": "MXFP8, stochastic in rollout",
                 "defaults": {"rollout": "MXFP8_E4M3", "reward": "MXFP6_E3M2",
                              "update": "FP16"},
                 "roundings": {"rollout": "stochastic"}}


def register(client, name):
    rng = np.random.default_rng(4)
    layers = {"q": (64, 48, True), "k": (32, 48, False), "v": (32, 48, True), "o": (48, 64, False)}
    client.register_model(name, [(n, out, k, bias) for n, (out, k, bias) in layers.items()])
    weights = {}
    for n, (out, k, bias) in layers.items():
        w = rng.standard_normal((out, k)).astype(np.float32)
        weights[n] = (w, rng.standard_normal(out).astype(np.float32)) if bias else w
    client.upload_weights(name, weights, publish=True)


def test_each_output_is_its_own_layer_forwards_bits(client, model_name):
    register(client, model_name)
    client.put_policy(STOCHASTIC_MX)
    client.set_active_policy(model_name, STOCHASTIC_MX["name"])
    x = np.random.default_rng(5).standard_normal((5, 48)).astype(np.float32)
    for phase in ("rollout", "reward", "update"):
        seeds = [11, 12, 13]
        fused = client.forward_many(model_name, ["q", "k", "v"], x, phase=phase, seeds=seeds)
        for layer, seed, result in zip(("q", "k", "v"), seeds, fused):
            alone = client.forward(model_name, layer, x, phase=phase, seed=seed)
            assert np.array_equal(result.output.view(np.uint32), alone.output.view(np.uint32)), \
                (phase, layer)
            assert result.info.format == alone.info.format
    # An explicit format holds for every layer.
    fused = client.forward_many(model_name, ["k", "q"], x, format="INT8", phase="reward")
    assert [r.info.format for r in fused] == ["INT8", "INT8"]
    assert [r.output.shape for r in fused] == [(5, 32), (5, 64)]


def test_bad_requests_name_the_field_and_the_layer(client, model_name):
    register(client, model_name)
    x = np.ones((2, 48), np.float32)

    def fails(code, text, *args, **kwargs):
        with pytest.raises(mxserve.MxserveError) as error:
            client.forward_many(model_name, *args, phase="rollout", **kwargs)
        assert error.value.code.name == code, error.value
        assert text in error.value.message, error.value.message

    fails("INVALID_ARGUMENT", "layers: expected 1 to 16 layers, got 0", [], x)
    fails("INVALID_ARGUMENT", "layers: expected 1 to 16 layers, got 17", ["q"] * 17, x)
    fails("INVALID_ARGUMENT", "seeds: expected none or one per layer (2), got 1", ["q", "k"], x,
          seeds=[1])
    fails("NOT_FOUND", "layers[1]: layer: model", ["q", "nope"], x)
    fails("INVALID_ARGUMENT", "layers[1]: input", ["q", "o"], x)  # o takes 64 columns
    request = compute_pb2.LayersForwardRequest(
        request=client._forward_request(model_name, "q", x, None, "rollout", 0, None),
        layers=["k"])
    with pytest.raises(mxserve.MxserveError) as error:
        client._call("LayersForward", client._compute.LayersForward, request, None)
    assert "request.layer: expected empty" in error.value.message
    # Still serving.
    assert len(client.forward_many(model_name, ["q", "v"], x, phase="rollout")) == 2


TINY = dict(arch="qwen2", vocab_size=40, hidden_size=32, num_layers=2, num_heads=4,
            num_kv_heads=2, intermediate_size=48, max_positions=64, norm_eps=1e-6,
            tie_word_embeddings=True, eos_token_id=1)


def test_a_decode_step_fuses_siblings_and_keeps_the_bits(client, model_name):
    calls = {"LayerForward": 0, "LayersForward": 0}
    originals = {rpc: getattr(client._compute, rpc) for rpc in calls}

    def counted(rpc):
        def call(request, **kwargs):
            calls[rpc] += 1
            return originals[rpc](request, **kwargs)
        return call

    outputs = {}
    try:
        for rpc in calls:
            setattr(client._compute, rpc, counted(rpc))
        for fuse in (False, True):
            torch.manual_seed(0)
            model = build_model(ModelConfig(**TINY)).eval()
            prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
            with torch.no_grad():
                cache = model(prompt, use_cache=True).cache
            session = offload(model, client, name=f"{model_name}-{fuse}", policy="D", fuse=fuse)
            try:
                before = dict(calls)
                with client.phase("rollout"), torch.no_grad():
                    logits = model(torch.tensor([[13], [14]]), cache=cache).logits
                outputs[fuse] = (logits, {k: calls[k] - before[k] for k in calls})
                if fuse:
                    assert set(session.fused_groups) == {
                        f"model.layers.{i}.{part}" for i in range(2)
                        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                     "mlp.gate_proj", "mlp.up_proj")}
                assert session.totals["rollout"].requests == 15  # every layer answered
            finally:
                session.restore()
    finally:
        for rpc, original in originals.items():
            setattr(client._compute, rpc, original)
    plain, fused = outputs[False], outputs[True]
    assert torch.equal(plain[0], fused[0])
    assert plain[1] == {"LayerForward": 15, "LayersForward": 0}
    # Per block: q/k/v one call, gate/up one, o and down their own; then lm_head.
    assert fused[1] == {"LayerForward": 2 * 2 + 1, "LayersForward": 2 * 2}


class CrossAttention(torch.nn.Module):
    """q from the decoder's input, k and v from another tensor: the siblings take
    different inputs, so fusing them would be wrong."""

    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(16, 16)
        self.k_proj = torch.nn.Linear(16, 16)
        self.v_proj = torch.nn.Linear(16, 16)

    def forward(self, x, memory):
        return self.q_proj(x) + self.k_proj(memory) * self.v_proj(memory)


def test_siblings_on_different_inputs_are_not_served_from_the_fused_call(client, model_name):
    torch.manual_seed(3)
    model = torch.nn.Sequential(CrossAttention())
    session = offload(model, client, name=model_name, format="FP32")
    try:
        x, memory = torch.randn(2, 16), torch.randn(2, 16)
        with client.phase("rollout"), torch.no_grad():
            first = model[0](x, memory)
            second = model[0](x, memory)  # no longer fused: one miss is enough
        with session.local() as plain, torch.no_grad():
            expected = plain[0](x, memory)
        assert torch.allclose(first, expected, rtol=1e-6, atol=1e-6)
        assert torch.equal(first, second)
        assert session._unfused == {("0.q_proj", "0.k_proj", "0.v_proj")}
    finally:
        session.restore()


class InPlace(torch.nn.Module):
    """The siblings' one input, modified in place between them."""

    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(16, 16)
        self.up_proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        gate = self.gate_proj(x)
        x.mul_(2)
        return gate * self.up_proj(x)


def test_an_input_modified_in_place_is_not_served_stale(client, model_name):
    torch.manual_seed(5)
    model = torch.nn.Sequential(InPlace())
    session = offload(model, client, name=model_name, format="FP32")
    try:
        x = torch.randn(2, 16)
        with client.phase("rollout"), torch.no_grad():
            got = model(x.clone())
        with session.local() as plain, torch.no_grad():
            expected = plain(x.clone())
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)
    finally:
        session.restore()


def test_a_fused_call_refuses_outputs_that_would_not_fit_one_answer(daemon, model_name):
    with mxserve.Client(daemon.address) as big:
        register(big, model_name)
        rows = (64 << 20) // (4 * 128) + 1  # q + k + v: 128 columns of FP32 per row
        x = np.zeros((rows, 48), np.float32)
        with pytest.raises(mxserve.MxserveError) as error:
            big.forward_many(model_name, ["q", "k", "v"], x, phase="rollout", format="FP32")
        assert error.value.code.name == "RESOURCE_EXHAUSTED"
        assert "layers: their outputs" in error.value.message


def test_bf16_outputs_are_the_fp32_ones_rounded_to_nearest_even(client, model_name):
    register(client, model_name)
    x = torch.randn(7, 48).to(torch.bfloat16)
    for fmt in ("FP32", "MXFP8_E4M3"):
        wide = client.forward(model_name, "q", x, phase="rollout", format=fmt).output
        narrow = client.forward(model_name, "q", x, phase="rollout", format=fmt,
                                output_dtype="bf16")
        assert narrow.output.dtype == torch.float32  # widened exactly on arrival
        assert torch.equal(narrow.output.to(torch.bfloat16), wide.to(torch.bfloat16)), fmt
        assert torch.equal(narrow.output, narrow.output.to(torch.bfloat16).float())
    fused = client.forward_many(model_name, ["q", "k"], x, phase="rollout", format="FP32",
                                output_dtype="bf16")
    alone = client.forward(model_name, "q", x, phase="rollout", format="FP32",
                           output_dtype="bf16").output
    assert torch.equal(fused[0].output, alone)
    # Half the bytes come back.
    before = client.bytes_received["LayerForward"]
    client.forward(model_name, "q", x, phase="rollout", format="FP32", output_dtype="bf16")
    bf16_bytes = client.bytes_received["LayerForward"] - before
    before = client.bytes_received["LayerForward"]
    client.forward(model_name, "q", x, phase="rollout", format="FP32")
    fp32_bytes = client.bytes_received["LayerForward"] - before
    assert fp32_bytes - bf16_bytes == 7 * 64 * 2
    request = client._forward_request(model_name, "q", x, "FP32", "rollout", 0, None)
    request.output_dtype = 3  # DTYPE_FP16
    with pytest.raises(mxserve.MxserveError, match="output_dtype: expected DTYPE_FP32 or "
                                                   "DTYPE_BF16, got DTYPE_FP16"):
        client._call("LayerForward", client._compute.LayerForward, request, None)
    with pytest.raises(ValueError, match="output_dtype: expected None, 'fp32' or 'bf16'"):
        client.forward(model_name, "q", x, phase="rollout", output_dtype="fp16")


def test_a_bf16_model_gets_bf16_outputs_with_the_same_bits(client, model_name, monkeypatch):
    from mxserve.torch import offloading

    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY)).eval().to(torch.bfloat16)
    ids = torch.tensor([[5, 6, 7, 8]])
    session = offload(model, client, name=model_name, policy="D")
    try:
        before = client.bytes_received["LayersForward"] + client.bytes_received["LayerForward"]
        with client.phase("rollout"), torch.no_grad():
            narrow = model(ids).logits
        received = (client.bytes_received["LayersForward"] +
                    client.bytes_received["LayerForward"] - before)
        # 4 tokens: every layer's output in BF16 (2 bytes), plus shapes and infos.
        outputs = sum(4 * layer.out_features * 2 for layer in session.layers.values())
        assert outputs < received < outputs + 15 * 400
        monkeypatch.setattr(offloading, "_output_dtype", lambda x: None)  # FP32 on the wire
        with client.phase("rollout"), torch.no_grad():
            wide = model(ids).logits
        assert narrow.dtype == torch.bfloat16
        assert torch.equal(narrow, wide)
    finally:
        session.restore()
