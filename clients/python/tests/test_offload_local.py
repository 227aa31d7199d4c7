"""offload(..., compute="local"): the layers run here with mxserve.torch.emulator, and a
PPO step gives the same losses and weights, bit for bit, as the same step through
the daemon; the daemon's energy report after it is the same too."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mxserve  # noqa: E402
from mxserve.rlhf import trainer as rlhf  # noqa: E402
from mxserve.rlhf.models import ModelConfig, build_model  # noqa: E402
from mxserve.torch import offload  # noqa: E402

TINY = dict(arch="qwen2", vocab_size=24, hidden_size=32, num_layers=2, num_heads=4,
            num_kv_heads=2, intermediate_size=48, max_positions=64, norm_eps=1e-6,
            tie_word_embeddings=True, eos_token_id=1)
GPT2 = dict(arch="gpt2", vocab_size=24, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=4,
            intermediate_size=64, max_positions=64, norm_eps=1e-5, tie_word_embeddings=True,
            eos_token_id=1)
PAD, EOS = 0, 1
PROMPTS = [[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2], [14, 2]]
# One format family per phase, so every path of the emulator runs in one step:
# MX blocks (rollout), INT8 (reward), FP16's fma chain and MXFP8 by layer (update).
MIXED = {"name": "local-mixed", "description": "every numerics path in one step",
         "defaults": {"rollout": "MXFP4", "reward": "INT8", "update": "MXFP8_E4M3"},
         "rules": [{"phase": "update", "layers": "*mlp*", "format": "FP16"}]}


# The policy's scale rules and stochastic roundings, NVFP4 among the formats: the
# local emulator must apply them with the seeds daemon mode sends.
NUMERICS = {"name": "local-numerics", "description": "scale rules and stochastic rounding",
            "defaults": {"rollout": "NVFP4", "reward": "MXFP6_E3M2", "update": "MXFP4"},
            "rules": [{"phase": "update", "layers": "*mlp*", "format": "INT8"}],
            "scale_rules": {"update": "rceil", "reward": "ceil"},
            "roundings": {"update": "stochastic", "rollout": "stochastic"}}


def lm(config, seed):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**config)).eval()


def trainer(client, compute, run, config=TINY, policy="local-mixed", seed=0):
    ppo = rlhf.PPOConfig(batch_size=4, response_length=4, learning_rate=1e-3)
    return rlhf.PPOTrainer(client, lm(config, 0), rlhf.RewardModel(lm(config, 2)), ppo,
                           eos_id=EOS, pad_id=PAD, seed=seed, policy=policy, run=run,
                           name_prefix=f"t-{compute}-{config['arch']}", compute=compute)


def bits(t):
    return t.detach().float().contiguous().view(torch.int32)


def without_run(rows):
    return sorted(tuple(sorted((k, v) for k, v in row.items() if k != "run")) for row in rows)


def energy(client, run):
    return {(e.source, e.phase): (e.joules, e.busy_seconds, e.requests)
            for e in client.energy_report(run=run).entries}


@pytest.mark.parametrize("config,policy", [(TINY, MIXED), (GPT2, MIXED), (TINY, NUMERICS)],
                         ids=["qwen2", "gpt2", "qwen2-rules-stochastic"])
def test_local_ppo_step_equals_the_daemon_step(client, config, policy):
    client.put_policy(policy)
    tag = f"{config['arch']}-{policy['name']}"
    runs = {"daemon": f"local-test/daemon-{tag}", "local": f"local-test/local-{tag}"}
    results = {}
    for compute, run in runs.items():
        t = trainer(client, compute, run, config, policy["name"])
        try:
            metrics = [t.step(PROMPTS) for _ in range(2)]
            results[compute] = (metrics, {n: p.detach().clone()
                                          for n, p in t.model.named_parameters()},
                                t.work(run))
            # Nothing was uploaded in local mode: the daemon holds no weights.
            if compute == "local":
                described = client.describe_model(t.sessions["policy"].model_name)
                assert described.weight_version == 0
        finally:
            t.close()
    (m_d, p_d, w_d), (m_l, p_l, w_l) = results["daemon"], results["local"]
    assert m_l == m_d  # every loss and statistic, exactly
    assert p_l.keys() == p_d.keys()
    for name in p_d:
        assert torch.equal(bits(p_l[name]), bits(p_d[name])), name
    assert without_run(w_l) == without_run(w_d)  # the same GEMMs, split the same way
    # The same requests, seconds and joules per source and phase. The daemon adds
    # its own calls' doubles in whichever order its workers finish them (two runs
    # of the daemon path differ in the last bits too), hence 1e-12, not ==.
    e_d, e_l = energy(client, runs["daemon"]), energy(client, runs["local"])
    assert e_d and e_l.keys() == e_d.keys()
    for key, (joules, seconds, requests) in e_d.items():
        assert e_l[key][2] == requests, key
        assert e_l[key][0] == pytest.approx(joules, rel=1e-12), key
        assert e_l[key][1] == pytest.approx(seconds, rel=1e-12), key


def test_the_session_seed_keys_local_stochastic_rounding(client):
    """The stochastic policy really rounds stochastically here: the same session
    seed gives the same output, another seed another; the trainer keys each of
    its sessions by its own seed and the session's role."""
    client.put_policy(NUMERICS)
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(4))
    outputs = []
    for seed in (5, 5, 6):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(40, 8))
        session = offload(model, client, f"local-seed-{len(outputs)}", replace=True,
                          compute="local", policy=NUMERICS["name"], seed=seed)
        try:
            with client.phase("update"):
                outputs.append(bits(model(x)))
        finally:
            session.restore()
    assert torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[0], outputs[2])
    seeds = set()
    for seed in (0, 1):
        t = trainer(client, "local", "", TINY, NUMERICS["name"], seed)
        seeds |= {s._seed for s in t.sessions.values()}
        t.close()
    assert len(seeds) == 6


def test_local_layer_formats_follow_the_policy(client):
    client.put_policy(MIXED)
    model = nn.Sequential(nn.Linear(40, 8))
    session = offload(model, client, "local-formats", policy="local-mixed", replace=True,
                      compute="local")
    try:
        x = torch.randn(3, 40)
        for phase, fmt in (("rollout", "MXFP4_E2M1"), ("reward", "INT8"),
                           ("update", "MXFP8_E4M3")):
            with client.phase(phase):
                model(x)
            info = session.layers["0"].last_info
            assert (info.format, info.backend, info.kernel) == (fmt, "local", "emulator")
        with pytest.raises(ValueError, match="phase: required for compute='local'"):
            model(x)
        session.layers["0"].format = "MXINT8"
        with client.phase("update"):
            model(x)
        assert session.layers["0"].last_info.format == "MXINT8"
        assert session.sync_weights() == 0
    finally:
        session.restore()


def test_local_quantized_weight_follows_in_place_updates(client):
    model = nn.Sequential(nn.Linear(32, 4, bias=False))
    session = offload(model, client, "local-cache", replace=True, compute="local",
                      format="MXINT8")
    try:
        x = torch.randn(2, 32)
        with client.phase("update"):
            before = model(x)
            with torch.no_grad():
                session.layers["0"].weight.mul_(2.0)
            after = model(x)
        assert torch.equal(after, before * 2.0)  # MXINT8: scales double, codes stay
    finally:
        session.restore()


def test_bad_compute_mode_is_named(client):
    with pytest.raises(ValueError, match="compute: expected 'daemon' or 'local', got 'gpu'"):
        offload(nn.Sequential(nn.Linear(4, 4)), client, "bad-compute", compute="gpu")
