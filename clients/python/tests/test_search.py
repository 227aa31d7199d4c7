"""mxserve.torch.search, the RL policy generator, end to end on a tiny language model
offloaded to the local emulator (the daemon holds the policy and layer specs):
every objective runs, the answer is within its budget and a valid policy the
daemon resolves, the same seed gives the same search, and bad arguments are
named before anything runs."""

import pytest

torch = pytest.importorskip("torch")

from mxserve import energy_model  # noqa: E402
from mxserve.torch import search  # noqa: E402
from mxserve.rlhf import trainer as rlhf  # noqa: E402
from mxserve.rlhf.models import ModelConfig, build_model  # noqa: E402
from mxserve.torch import offload  # noqa: E402

TINY = dict(arch="qwen2", vocab_size=24, hidden_size=32, num_layers=1, num_heads=4,
            num_kv_heads=2, intermediate_size=48, max_positions=64, norm_eps=1e-6,
            tie_word_embeddings=False, eos_token_id=1)
FORMATS = ("MXFP4_E2M1", "INT8", "FP16", "FP32")


def lm(seed=0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**TINY)).eval()


def batches():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(2, 24, (4, 12), generator=g) for _ in range(2)]


@pytest.fixture
def session(client, model_name):
    s = offload(lm(), client, model_name, replace=True, compute="local")
    yield s
    s.restore()


def run(session, **overrides):
    config = search.SearchConfig(**{"formats": FORMATS, "episodes": 4, "episodes_per_update": 2,
                                    **overrides})
    return search.search(session, batches(), config, progress=False)


def test_a_search_is_within_budget_reproducible_and_a_policy(client, session, model_name):
    session.reset_work()
    first = run(session, phase="rollout", budget_bits=10.0, seed=3)
    # Its own cost: every GEMM its evaluations ran, each priced by the FPGA model.
    params = energy_model.load_energy_model()
    assert first.search_joules == pytest.approx(sum(
        row["count"] * energy_model.estimate_gemm(params, row["x_format"], row["w_format"],
                                                  row["m"], row["n"], row["k"]).joules
        for row in session.work()), rel=1e-12)
    layers = list(session.layers)
    assert first.layers == tuple(layers)
    assert len(first.episodes) == 5 and first.episodes[-1].greedy  # 4 sampled, then greedy
    # Every episode is within the budget (masking), the answer too.
    assert all(e.bits_per_weight <= 10.0 for e in first.episodes)
    assert first.best.total == max(e.total for e in first.episodes)
    assert set(first.best.formats) <= set(FORMATS)
    assert all(len(e.rewards) == len(layers) for e in first.episodes)
    assert {"kl", "is_tail"} <= set(first.final_metrics)
    # The pins are as they were.
    assert all(layer.format is None for layer in session.layers.values())

    again = run(session, phase="rollout", budget_bits=10.0, seed=3)
    assert [e.formats for e in again.episodes] == [e.formats for e in first.episodes]
    assert [e.rewards for e in again.episodes] == [e.rewards for e in first.episodes]
    # Its own cost on the FPGA model: the GEMMs of its evaluations, the same for
    # the same seed.
    assert first.search_joules > 0 and again.search_joules == first.search_joules

    document = first.policy("rl-test")
    assert "RL-searched" in document["description"] and "seed 3" in document["description"]
    assert "J modelled for the search" in document["description"]
    client.put_policy(document)
    try:
        table = client.resolve_policy(model_name, "rl-test").table()
        assert {layer: table[("rollout", layer)] for layer in layers} == first.assignment
        assert {table[("update", layer)] for layer in layers} == {"FP16"}
    finally:
        client.delete_policy("rl-test")


def test_the_agent_learns_what_the_reward_asks(session):
    """With memory saved worth far more than any divergence, 32 episodes teach the
    agent MXFP4 for every layer: the greedy walk at the end picks it (a random
    walk would, one time in 4^8)."""
    result = run(session, phase="rollout", memory_weight=10.0, episodes=32, episodes_per_update=4,
                 seed=0)
    greedy = result.episodes[-1]
    assert greedy.greedy and set(greedy.formats) == {"MXFP4_E2M1"}
    assert result.best.formats == greedy.formats
    early = sum(e.total for e in result.episodes[:4])
    late = sum(e.total for e in result.episodes[-5:-1])
    assert late > early


def test_a_tight_budget_forces_the_cheapest_formats(session):
    # MXFP4 everywhere is 4.508 bits per weight here (K = 48 pads to 64); any
    # other choice for any layer would pass 4.6.
    result = run(session, phase="rollout", budget_bits=4.6, seed=0)
    assert all(set(e.formats) == {"MXFP4_E2M1"} for e in result.episodes)
    assert result.best.bits_per_weight == pytest.approx(4.508, abs=0.001)


def test_an_energy_budget_is_kept(session):
    loose = run(session, phase="rollout", seed=1)
    cap = min(e.joules for e in loose.episodes) * 1.01
    capped = run(session, phase="rollout", budget_joules=cap, seed=1)
    assert all(e.joules <= cap for e in capped.episodes)


@pytest.mark.parametrize("objective,metric", [("lm", "ppl_change"), ("update", "grad_cosine")])
def test_every_language_model_objective_runs(session, objective, metric):
    result = run(session, phase="update", objective=objective, episodes=2, seed=2)
    assert metric in result.final_metrics
    # All FP32 is the reference itself: nothing changes, no memory is saved.
    reference = run(session, phase="update", objective=objective, episodes=1,
                    formats=("FP32",), seed=2)
    if objective == "update":
        assert reference.final_metrics["grad_cosine"] == pytest.approx(1.0, abs=1e-12)
    else:
        assert reference.final_metrics["ppl_change"] == 0.0


def test_the_reward_objective_ranks_scores(client, model_name):
    reward = rlhf.RewardModel(lm(2))
    s = offload(reward, client, model_name, replace=True, compute="local")
    try:
        ids = batches()
        mask_batches = [(b, torch.ones_like(b)) for b in ids]
        config = search.SearchConfig(phase="reward", formats=FORMATS, episodes=2, seed=0)
        result = search.search(s, mask_batches, config, progress=False)
        assert -1.0 <= result.final_metrics["spearman"] <= 1.0
        assert result.policy("x")["rules"][0]["phase"] == "reward"
    finally:
        s.restore()


def test_bad_arguments_are_named(session):
    with pytest.raises(ValueError, match="phase: expected one of rollout, reward, update"):
        run(session, phase="warmup")
    with pytest.raises(ValueError, match="objective: expected one of lm, rollout"):
        run(session, objective="bleu")
    with pytest.raises(ValueError, match="episodes: expected an integer >= 1, got 0"):
        run(session, episodes=0)
    with pytest.raises(ValueError, match="budget_bits: the cheapest formats of .* need 4.508, "
                                         "more than 3"):
        run(session, budget_bits=3.0)
    # Two budgets of different kinds may admit no assignment although each alone does.
    with pytest.raises(ValueError, match="budget_bits: give a bits budget or a joules budget"):
        run(session, budget_bits=8.0, relative_budget=0.5)
    with pytest.raises(ValueError, match="format: unknown format 'NF5'"):
        run(session, formats=("NF5",))
    with pytest.raises(ValueError, match="layers: model .* has no layer 'nope'"):
        search.search(session, batches(), search.SearchConfig(), layers=["nope"], progress=False)
    with pytest.raises(ValueError, match="batches: expected at least one"):
        search.search(session, [], search.SearchConfig(), progress=False)
