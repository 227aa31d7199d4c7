"""The PPO-RLHF trainer (mxserve.rlhf.trainer): generation, the phases its calls run in,
and the energy its run tag collects on a real daemon."""

import math

import pytest

torch = pytest.importorskip("torch")

from mxserve.rlhf import trainer as rlhf  # noqa: E402
from mxserve.rlhf.models import ModelConfig, build_model  # noqa: E402

TINY = dict(arch="qwen2", vocab_size=24, hidden_size=32, num_layers=2, num_heads=4,
            num_kv_heads=2, intermediate_size=48, max_positions=64, norm_eps=1e-6,
            tie_word_embeddings=True, eos_token_id=1)
PAD, EOS = 0, 1


def tiny_lm(seed=0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**TINY)).eval()


def test_left_pad_and_sequence_scores():
    ids, mask = rlhf.left_pad([[5, 6, 7], [9]], PAD)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    # The score is read at each row's last real token, wherever padding sits.
    per_token = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    scores = rlhf.sequence_scores(per_token, torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]]))
    assert scores.tolist() == [2.0, 8.0]


def test_cached_generation_matches_full_forwards():
    lm = tiny_lm()
    ids, mask = rlhf.left_pad([[5, 6, 7, 8], [9, 10]], PAD)
    out = rlhf.generate(lm, ids, mask, max_new_tokens=6, temperature=0.7, eos_id=EOS,
                        pad_id=PAD, generator=torch.Generator().manual_seed(3), keep_logits=True)
    assert out.ids.shape[0] == 2 and out.prompt_width == 4
    # The sampling log-probs are the full (uncached) forward's at the same tokens.
    with torch.no_grad():
        logits = lm(out.ids, attention_mask=out.mask).logits
    full = rlhf.response_logprobs(logits, out.ids, out.prompt_width, 0.7) * out.response_mask
    assert torch.allclose(out.logprobs, full, atol=1e-5)
    kept = out.response_mask.bool()
    assert torch.allclose(out.logits[kept], logits[:, 3:-1][kept], atol=1e-5)
    # After EOS a row is padding and masked out.
    for row, mask_row in zip(out.response_ids.tolist(), out.response_mask.tolist()):
        if EOS in row:
            end = row.index(EOS)
            assert mask_row == [1] * (end + 1) + [0] * (len(row) - end - 1)
            assert all(t == PAD for t in row[end + 1:])


def test_greedy_generation_is_the_argmax_continuation():
    lm = tiny_lm(1)
    ids, mask = rlhf.left_pad([[3, 4, 5]], PAD)
    out = rlhf.generate(lm, ids, mask, max_new_tokens=4, temperature=1.0, eos_id=99,
                        pad_id=PAD, greedy=True)
    sequence = [3, 4, 5]
    with torch.no_grad():
        for _ in range(4):
            sequence.append(int(lm(torch.tensor([sequence])).logits[0, -1].argmax()))
    assert out.ids[0].tolist() == sequence


def test_adaptive_cliprange_widens_with_the_actors_disagreement():
    rollout = torch.log(torch.tensor([[0.5, 0.5, 0.2]]))
    learner = torch.log(torch.tensor([[0.5, 0.25, 0.4]]))
    eps = rlhf.adaptive_cliprange(rollout, learner, 0.2)
    expected = [0.2, 0.2 * (1 + math.log(2)), 0.2 * (1 + math.log(2))]
    assert eps[0].tolist() == pytest.approx(expected, rel=1e-6)


def test_ppo_config_rejects_bad_values():
    with pytest.raises(ValueError, match="PPOConfig.is_level"):
        rlhf.PPOConfig(is_level="tokens")
    with pytest.raises(ValueError, match="PPOConfig.num_mini_batches"):
        rlhf.PPOConfig(batch_size=4, num_mini_batches=5)


def _trainer(client, **kwargs):
    policy = tiny_lm(0)
    reward = rlhf.RewardModel(tiny_lm(2))
    config = rlhf.PPOConfig(batch_size=4, response_length=4, learning_rate=1e-3, **kwargs)
    return rlhf.PPOTrainer(client, policy, reward, config, eos_id=EOS, pad_id=PAD, seed=0,
                           **({} if client is None else {"policy": "fp16-baseline",
                                                          "run": "test-rlhf/run1",
                                                          "name_prefix": "test-rlhf"}))


PROMPTS = [[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2], [14, 2]]
TRL_METRICS = ["objective/kl", "objective/entropy", "objective/non_score_reward",
               "objective/rlhf_reward", "objective/scores", "policy/approxkl_avg",
               "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg", "val/clipfrac_avg",
               "policy/entropy_avg", "val/ratio", "val/num_eos_tokens", "episode"]


def test_a_local_step_reports_trl_metrics_and_moves_the_policy():
    trainer = _trainer(None, adaptive_clip=True)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    metrics = trainer.step(PROMPTS)
    for name in TRL_METRICS + ["is/weight_mean", "is/ess", "is/prob_gap"]:
        assert math.isfinite(metrics[name]), name
    assert metrics["episode"] == 4.0
    # Locally the rollout and the learner are the same FP32 arithmetic: weights ≈ 1.
    assert metrics["is/weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["is/ess"] == pytest.approx(1.0, abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    # The reference and reward models are frozen.
    assert not any(p.requires_grad for p in trainer.reference.parameters())


def test_every_call_runs_in_its_phase_under_the_run_tag(client):
    trainer = _trainer(client)
    try:
        metrics = trainer.step(PROMPTS)
        assert math.isfinite(metrics["objective/rlhf_reward"])
        phases = {role: set(s.totals) for role, s in trainer.sessions.items()}
        assert phases == {"policy": {"rollout", "update"}, "reference": {"reward"},
                          "reward": {"reward"}}
        # 1 old-log-prob pass + 4 epochs of forward and backward: the update's calls.
        layers = len(trainer.sessions["policy"].layers)
        assert trainer.sessions["policy"].totals["update"].requests == layers * (1 + 4 * 2)
        # The run's energy report holds exactly what the responses said, per phase.
        report = client.energy_report(run="test-rlhf/run1")
        assert report.run == "test-rlhf/run1"
        joules = {}
        for entry in report.entries:
            if entry.source == "fpga_model":
                joules[entry.phase] = entry.joules
        totals = trainer.totals()
        assert set(joules) == {"rollout", "reward", "update"}
        for phase, amount in joules.items():
            assert amount == pytest.approx(totals[phase].model_joules, rel=1e-9)
            assert amount > 0
    finally:
        trainer.close()
    assert not any(m.name.startswith("test-rlhf.") for m in client.list_models())


def test_ids_past_the_tokenizers_vocabulary_are_never_sampled():
    lm = tiny_lm(3)
    ids, mask = rlhf.left_pad([[5, 6], [7, 8, 9]], PAD)
    out = rlhf.generate(lm, ids, mask, max_new_tokens=12, temperature=3.0, eos_id=99,
                        pad_id=PAD, generator=torch.Generator().manual_seed(0), vocab_limit=10)
    assert out.response_ids.max() < 10
    logits = torch.zeros(1, 3, 24)
    logprobs = rlhf.response_logprobs(logits, torch.tensor([[1, 2, 3]]), 1, 1.0, vocab_limit=10)
    assert torch.allclose(logprobs, torch.full((1, 2), -math.log(10)))
