"""Layers too large for one message, offloaded: a vocabulary projection whose logits,
dY and weight gradient each exceed the client's max_message_bytes.

The session splits such calls (forward and grad_input along M, grad_weight along the
rows of W with `weight_rows`). Here the client's limit is 1 MiB, so an 8192-row
projection is "large"; the same code splits a 151936 × 896 lm_head at 64 MiB. What
must hold: the pieces put together are bit-identical to unsplit calls, and the
energy ledger books exactly what the calls reported.
"""

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mxserve  # noqa: E402
from mxserve.torch import offload  # noqa: E402

SMALL = 1 << 20        # the splitting client's max_message_bytes
VOCAB, HIDDEN, TOKENS = 8192, 96, 48


def projection_model():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(64, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, VOCAB))


def step(model, client, name, fmt, run="", compute="daemon", policy="", seed=0):
    """One offloaded forward and backward in phase update; the logits, every
    parameter's gradient, and the session (restored, its model deleted)."""
    session = offload(model, client, name=name, format=fmt, grad_weight="remote",
                      compute=compute, policy=policy, seed=seed)
    torch.manual_seed(12)
    x = torch.randn(TOKENS, 64)
    target = torch.randint(0, VOCAB, (TOKENS,))
    with client.run(run), client.phase("update"):
        logits = model(x)
        nn.functional.cross_entropy(logits, target).backward()
    session.restore()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, session


def bits(t):
    return t.contiguous().view(torch.int32)


@pytest.fixture
def small_client(daemon):
    with mxserve.Client(daemon.address, timeout=60, max_message_bytes=SMALL) as c:
        c.wait_ready(timeout=10)
        yield c


@pytest.mark.parametrize("fmt", ["MXFP8_E4M3", "INT8", "MXFP4_E2M1"])
def test_split_calls_give_the_bits_of_unsplit_ones(client, small_client, model_name, fmt):
    model = projection_model()
    whole_logits, whole_grads, whole = step(copy.deepcopy(model), client, model_name + "-whole",
                                            fmt)
    split_logits, split_grads, split = step(model, small_client, model_name + "-split", fmt)
    # The unsplit session made one call per layer and direction; the split one more.
    assert whole.totals["update"].requests == 4
    assert split.totals["update"].requests > 4
    assert torch.equal(bits(split_logits), bits(whole_logits))
    assert split_grads.keys() == whole_grads.keys()
    for name, grad in whole_grads.items():
        assert torch.equal(bits(split_grads[name]), bits(grad)), name


# The update phase rounds stochastically under the rceil rule: split calls then
# draw per request, and NVFP4 takes a tensor scale per request.
SPLIT_POLICY = {"name": "large-numerics", "description": "stochastic update",
                "defaults": {"rollout": "MXFP8_E4M3", "reward": "MXFP8_E4M3", "update": "MXFP4"},
                "scale_rules": {"update": "rceil"}, "roundings": {"update": "stochastic"}}


@pytest.mark.parametrize("fmt", ["MXFP4_E2M1", "NVFP4"])
def test_local_split_calls_give_the_daemons_bits(small_client, model_name, fmt):
    """compute="local" computes split calls piece by piece where the split changes
    bits, with the seeds daemon mode sends: the daemon's logits and gradients."""
    small_client.put_policy(SPLIT_POLICY)
    model = projection_model()
    results = {}
    for compute, seed in (("daemon", 5), ("local", 5), ("local", 6)):
        logits, grads, session = step(copy.deepcopy(model), small_client,
                                      f"{model_name}-{compute}-{seed}", fmt, compute=compute,
                                      policy=SPLIT_POLICY["name"], seed=seed)
        assert session.totals["update"].requests > 4  # split
        results[compute, seed] = logits, grads
    (d_logits, d_grads), (l_logits, l_grads) = results["daemon", 5], results["local", 5]
    assert torch.equal(bits(l_logits), bits(d_logits))
    for name, grad in d_grads.items():
        assert torch.equal(bits(l_grads[name]), bits(grad)), name
    assert not torch.equal(bits(results["local", 6][0]), bits(l_logits))


def test_the_ledger_books_every_piece(small_client, model_name):
    run = f"large/{model_name}"
    _, _, session = step(projection_model(), small_client, model_name, "MXFP8_E4M3", run=run)
    totals = session.totals["update"]
    # lm_head: logits 48 × 8192 FP32 (1.5 MiB) in 2 forwards of 30 and 18 rows; dY in
    # 2 grad_input calls; its 8192 × 96 grad_weight in 4 slices of 2533 rows at most.
    # The first layer: one forward, one backward (its input needs no gradient).
    assert totals.requests == 1 + 2 + 2 + 4 + 1
    report = small_client.energy_report(run=run)
    assert report.joules("fpga_model", "update") == pytest.approx(totals.model_joules, rel=1e-12)
    assert totals.model_joules > 0
    (entry,) = [e for e in report.entries if e.source == "fpga_model"]
    assert entry.requests == totals.requests
    assert report.busy_seconds("fpga_model") == pytest.approx(totals.model_seconds, rel=1e-12)


def test_an_input_larger_than_a_message_cannot_give_a_remote_grad_weight(small_client,
                                                                        model_name):
    model = nn.Sequential(nn.Linear(300, 4096, bias=False))
    session = offload(model, small_client, name=model_name, format="MXFP8_E4M3")
    x = torch.randn(1000, 300)  # 1.2 MB: every weight_rows slice would carry all of it
    with small_client.phase("update"):
        y = model(x)  # the forward splits along M: fine
        assert y.shape == (1000, 4096)
        with pytest.raises(ValueError, match=r"'?0'?: grad_weight needs all of the input X "
                                             r"\(1000 x 300, 1200000 bytes\) in each request"):
            y.sum().backward()
    session.restore()
