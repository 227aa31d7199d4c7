"""The optimizer where the GEMMs are (issue 37) against a real daemon: gradients
accumulated by LayerBackward, Models.StepOptimizer bit for bit torch's AdamW,
DownloadWeights, what a publish warms, and a PPO run through it."""

import math
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mxserve  # noqa: E402
from mxserve.rlhf import trainer as rlhf  # noqa: E402
from mxserve.rlhf.models import ModelConfig, build_model  # noqa: E402
from mxserve.torch import RemoteAdamW, offload  # noqa: E402
from mxserve.v1 import common_pb2, models_pb2  # noqa: E402

FP32_EVERYWHERE = {"name": "py-fp32-everywhere", "description": "FP32 in every phase",
                   "defaults": {"rollout": "FP32", "reward": "FP32", "update": "FP32"}}


def net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(40, 72), nn.LayerNorm(72), nn.GELU(),
                         nn.Linear(72, 72, bias=False), nn.GELU(), nn.Linear(72, 24))


def int_bits(tensor):
    return tensor.detach().contiguous().view(torch.int32)


def backward_twice(client, model, x, target):
    """Two micro-batches into one gradient, in the update phase: the daemon adds
    them as torch does."""
    with client.phase("update"):
        for half in (slice(0, 1), slice(1, 2)):
            loss = ((model(x[half]) - target[half]) ** 2).mean()
            loss.backward()


def test_remote_adamw_is_torchs_adamw_bit_for_bit(client, model_name):
    hyper = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    remote_model, twin_model = net(1), net(1)
    remote = offload(remote_model, client, name=model_name, format="FP32",
                     optimizer=RemoteAdamW(**hyper, max_grad_norm=0.5))
    # The twin gets the daemon's gradients back (the same FP32 GEMMs) and steps
    # them with torch's own AdamW, clipped by the daemon's coefficient.
    twin = offload(twin_model, client, name=model_name + "-twin", format="FP32")
    try:
        assert remote.remote_stepped == {"0", "3", "5"}
        local_opt = remote.optimizer.local_optimizer(remote)
        assert {id(p) for p in local_opt.param_groups[0]["params"]} == \
            {id(remote_model[1].weight), id(remote_model[1].bias)}
        twin_opt = torch.optim.AdamW(twin_model.parameters(), **hyper)
        torch.manual_seed(5)
        clipped = 0
        for step in range(3):
            x, target = torch.randn(2, 6, 40), torch.randn(2, 6, 24)
            for model, opt in ((remote_model, local_opt), (twin_model, twin_opt)):
                opt.zero_grad(set_to_none=True)
                backward_twice(client, model, x, target)
            assert remote_model[0].weight.grad is None  # it stayed on the daemon
            result = remote.step(local_opt)
            assert result.weight_version == step + 2
            assert set(result.grad_sq_norms) == {"0", "3", "5"}
            # torch's total norm (FP32, per tensor) agrees to FP32 reordering.
            total = nn.utils.clip_grad_norm_(twin_model.parameters(), math.inf)
            assert result.total_grad_norm == pytest.approx(float(total), rel=1e-6)
            twin_sq = {n: sum(float(p.grad.double().pow(2).sum())
                              for p in twin.layers[n].parameters()) for n in ("0", "3", "5")}
            for layer, sq in result.grad_sq_norms.items():
                assert sq == pytest.approx(twin_sq[layer], rel=1e-12), layer
            coefficient = result.clip_coefficient
            expected = min(1.0, 0.5 / (float(total) + 1e-6))
            assert coefficient == pytest.approx(expected, rel=1e-6)
            clipped += coefficient < 1.0
            with torch.no_grad():
                for p in twin_model.parameters():
                    p.grad.mul_(coefficient)
            twin_opt.step()
            twin.sync_weights()
        assert clipped > 0  # the clipping path ran
        assert remote.weights_stale
        assert remote.fetch_weights() == 4
        assert not remote.weights_stale
        for (name, a), b in zip(remote_model.named_parameters(), twin_model.parameters()):
            assert torch.equal(int_bits(a), int_bits(b)), name
    finally:
        remote.restore()
        twin.restore()


def test_no_weight_crosses_the_wire_during_ppo_epochs(client, model_name):
    model = net(2)
    session = offload(model, client, name=model_name, format="FP32",
                      optimizer=RemoteAdamW(lr=1e-3, max_grad_norm=1.0))
    responses = []
    backward = client._compute.LayerBackward

    def watched(request, **kwargs):
        response = backward(request, **kwargs)
        responses.append(response)
        return response

    client._compute.LayerBackward = watched
    try:
        local_opt = session.optimizer.local_optimizer(session)
        sent, received = dict(client.bytes_sent), dict(client.bytes_received)
        torch.manual_seed(6)
        for _ in range(4):  # a PPO update's minibatches
            local_opt.zero_grad(set_to_none=True)
            backward_twice(client, model, torch.randn(2, 6, 40), torch.randn(2, 6, 24))
            session.step(local_opt)
        moved = {rpc: client.bytes_sent[rpc] - sent.get(rpc, 0) +
                 client.bytes_received[rpc] - received.get(rpc, 0)
                 for rpc in set(client.bytes_sent) | set(client.bytes_received)}
        assert moved.get("UploadWeights", 0) == 0
        assert moved.get("DownloadWeights", 0) == 0
        assert len(responses) == 4 * 2 * 3  # steps × micro-batches × layers
        assert all(len(r.grad_weight.data) == 0 and len(r.grad_bias.data) == 0
                   for r in responses)
        assert moved["StepOptimizer"] < 4 * 200  # norms and a version, no tensor
        weight_bytes = sum(p.numel() * 4 for n in session.remote_stepped
                           for p in session.layers[n].parameters())
        # What came back is grad_input (activations) and the call's info, no more.
        assert sum(r.ByteSize() for r in responses) < \
            sum(len(r.grad_input.data) + 300 for r in responses)
        # The contrast: fetching the weights moves them.
        session.fetch_weights()
        assert client.bytes_received["DownloadWeights"] > weight_bytes
    finally:
        client._compute.LayerBackward = backward
        session.restore()


TINY = dict(arch="qwen2", vocab_size=24, hidden_size=32, num_layers=2, num_heads=4,
            num_kv_heads=2, intermediate_size=48, max_positions=64, norm_eps=1e-6,
            tie_word_embeddings=True, eos_token_id=1)
PROMPTS = [[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2], [14, 2]]


def ppo_run(client, optimizer, prefix):
    torch.manual_seed(0)
    policy = build_model(ModelConfig(**TINY)).eval()
    torch.manual_seed(2)
    reward = rlhf.RewardModel(build_model(ModelConfig(**TINY)).eval())
    config = rlhf.PPOConfig(batch_size=4, response_length=4, learning_rate=1e-3,
                            num_mini_batches=2, max_grad_norm=0.5)
    trainer = rlhf.PPOTrainer(client, policy, reward, config, eos_id=1, pad_id=0, seed=0,
                              policy=FP32_EVERYWHERE["name"], name_prefix=prefix,
                              optimizer=optimizer)
    try:
        if optimizer == "remote":  # the tied LM head stays local; the rest is the daemon's
            session = trainer.sessions["policy"]
            assert "lm.lm_head" not in session.remote_stepped
            assert len(session.remote_stepped) == len(session.layers) - 1
        metrics = [trainer.step(PROMPTS) for _ in range(2)]
        return metrics, [p.detach().clone() for p in trainer.policy_copy().parameters()]
    finally:
        trainer.close()


def test_a_ppo_run_with_the_remote_optimizer_matches_the_local_one(client, model_name):
    client.put_policy(FP32_EVERYWHERE)
    local, local_params = ppo_run(client, "local", model_name + "-local")
    remote, remote_params = ppo_run(client, "remote", model_name + "-remote")
    # FP32 arithmetic on both sides; the one difference is the global gradient
    # norm, summed in FP64 on the daemon and per tensor in FP32 by torch, which
    # can move the clipping coefficient by an ulp or two. Measured: identical or
    # within 1e-6 relative. The tolerance: 1e-5 relative (1e-7 absolute).
    for step, (a, b) in enumerate(zip(local, remote)):
        for key in ("loss/policy_avg", "loss/value_avg", "objective/kl", "policy/approxkl_avg"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (step, key)
    for a, b in zip(local_params, remote_params):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert not any(m.name.startswith(model_name) for m in client.list_models())


def test_step_and_download_reject_bad_input_and_the_daemon_keeps_serving(client, model_name):
    model = net(3)
    session = offload(model, client, name=model_name, format="FP32",
                      optimizer=RemoteAdamW(lr=1e-3))
    try:
        def fails(code, text, call, *args, **kwargs):
            with pytest.raises(mxserve.MxserveError) as error:
                call(*args, **kwargs)
            assert error.value.code.name == code, error.value
            assert text in error.value.message, error.value.message

        # Nothing accumulated: nothing stepped, no new version, the local side's
        # clipping still worked out.
        idle = client.step_optimizer(model_name, lr=1e-3, max_grad_norm=1.0,
                                     other_grad_sq_norm=4.0)
        assert (idle.weight_version, idle.grad_sq_norms, idle.total_grad_norm) == (1, {}, 2.0)
        assert idle.clip_coefficient == pytest.approx(1 / (2 + 1e-6), rel=1e-7)
        fails("NOT_FOUND", "no-such-model", client.step_optimizer, "no-such-model", lr=1e-3)
        fails("INVALID_ARGUMENT", "adamw.lr: expected a finite value >= 0, got -1",
              client.step_optimizer, model_name, lr=-1.0)
        fails("INVALID_ARGUMENT", "adamw.beta1: expected 0 <= beta1 < 1, got 1",
              client.step_optimizer, model_name, lr=1e-3, betas=(1.0, 0.9))
        fails("INVALID_ARGUMENT", "adamw.eps: expected a finite value > 0",
              client.step_optimizer, model_name, lr=1e-3, eps=0.0)
        fails("INVALID_ARGUMENT", "max_grad_norm: expected a finite number",
              client.step_optimizer, model_name, lr=1e-3, max_grad_norm=math.nan)
        fails("INVALID_ARGUMENT", "other_grad_sq_norm: expected a finite number >= 0",
              client.step_optimizer, model_name, lr=1e-3, other_grad_sq_norm=-1.0)
        request = models_pb2.StepOptimizerRequest(model=model_name)
        fails("INVALID_ARGUMENT", "adamw: required", client._call, "StepOptimizer",
              client._models.StepOptimizer, request, None)
        request = models_pb2.StepOptimizerRequest(
            model=model_name, adamw=models_pb2.AdamW(lr=1e-3, eps=1e-8),
            warm_up=models_pb2.WarmUp(copies=models_pb2.WarmUp.COPIES_FORMATS))
        fails("INVALID_ARGUMENT", "warm_up.formats: expected 1 to 16 formats", client._call,
              "StepOptimizer", client._models.StepOptimizer, request, None)
        x = np.ones((2, 72), np.float32)
        fails("INVALID_ARGUMENT", "input: required with accumulate_grad", client.backward,
              model_name, "3", np.ones((2, 72), np.float32), accumulate_grad=True,
              phase="update")

        def download(layer="0", **fields):
            request = models_pb2.DownloadWeightsRequest(model=model_name, layer=layer, **fields)
            return client._call("DownloadWeights", client._models.DownloadWeights, request, None)

        fails("INVALID_ARGUMENT", "offset_elements: expected below 2880", download,
              offset_elements=2880)
        fails("INVALID_ARGUMENT", "dtype: expected DTYPE_FP32 or DTYPE_BF16", download,
              dtype=common_pb2.DTYPE_FP16)
        fails("INVALID_ARGUMENT", "role: expected", download, role=7)
        fails("INVALID_ARGUMENT", "max_elements: at most", download, max_elements=1 << 40)
        fails("INVALID_ARGUMENT", "role: layer '3' was registered without a bias", download,
              layer="3", role=models_pb2.TENSOR_ROLE_BIAS)
        fails("NOT_FOUND", "has no layer 'nope'", download, layer="nope")
        # A piece at an offset, in BF16: the master's bits, rounded to nearest even.
        piece = download(offset_elements=100, max_elements=5, dtype=common_pb2.DTYPE_BF16)
        assert piece.weight_version == 1 and piece.offset_elements == 100
        master = model[0].weight.detach().reshape(-1)[100:105]
        assert np.frombuffer(piece.data, "<u2").tolist() == \
            (master.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)).tolist()
        # Still serving, nothing lost: a step after all that works.
        backward_twice(client, model, torch.randn(2, 3, 40), torch.randn(2, 3, 24))
        assert session.step().weight_version == 2
        y = client.forward(model_name, "0", x[:, :40], phase="rollout").output
        assert y.shape == (2, 72)
    finally:
        session.restore()


def test_a_publish_warms_what_it_is_told(client, model_name):
    client.register_model(model_name, [("fc", 64, 64, False)])
    weights = {"fc": np.ones((64, 64), np.float32)}

    def cached():
        return set(client.describe_model(model_name).layers[0].cached_formats)

    client.upload_weights(model_name, weights, publish=True, warm_up="none")
    assert cached() == set()
    client.upload_weights(model_name, weights, publish=True, warm_up=["MXFP4_E2M1", "INT8"])
    assert cached() == {"MXFP4_E2M1", "INT8"}
    client.upload_weights(model_name, weights)
    client.publish(model_name, warm_up=["MXFP8_E4M3"], warm_in_background=True)
    for _ in range(200):  # answered before the warm-up: it lands soon after
        if cached() == {"MXFP8_E4M3"}:
            break
        time.sleep(0.01)
    assert cached() == {"MXFP8_E4M3"}
    with pytest.raises(ValueError, match="warm_up: expected 'previous', 'none' or a list"):
        client.publish(model_name, warm_up="all")
    client.delete_model(model_name)


def test_discarded_gradients_and_what_stays_local(client, model_name):
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(16, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU(),
                          nn.Linear(24, 8))
    model[2].bias.requires_grad_(False)  # a frozen bias: the daemon would step it
    shared = nn.Linear(8, 8)
    model.append(shared)
    model.append(nn.Sequential(shared))  # one module twice: still one layer
    session = offload(model, client, name=model_name, format="FP32",
                      optimizer=RemoteAdamW(lr=1e-2))
    try:
        assert session.remote_stepped == {"0", "4", "5"}
        x = torch.randn(3, 16)
        with client.phase("update"):
            model(x).sum().backward()
        # A failed pass's gradients can be dropped; the next step sees none of them.
        assert session.discard_gradients() == 3
        before = client.describe_model(model_name).weight_version
        idle = session.step()
        assert idle.grad_sq_norms == {} and idle.weight_version == before
        with client.phase("update"):
            model(x).sum().backward()
        assert set(session.step().grad_sq_norms) == {"0", "4", "5"}
        # local() runs the trained weights: it fetches them first.
        with session.local() as plain, torch.no_grad():
            assert not session.weights_stale
            local_y = plain(x)
        with client.phase("rollout"), torch.no_grad():
            remote_y = model(x)
        assert torch.allclose(local_y, remote_y, rtol=1e-5, atol=1e-6)
    finally:
        session.restore()
    with pytest.raises(ValueError, match="no offloaded layer can be stepped on the daemon"):
        tied = nn.Sequential(nn.Embedding(8, 8), nn.Linear(8, 8, bias=False))
        tied[1].weight = tied[0].weight
        offload(tied, client, name=model_name + "-tied", optimizer=RemoteAdamW())
