"""PPO-RLHF arithmetic (mxserve.rlhf.ppo) against cases computed by hand."""

import math

import pytest

torch = pytest.importorskip("torch")

from mxserve.rlhf import ppo  # noqa: E402


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_masked_statistics_and_whitening():
    values, mask = t([1.0, 2.0, 3.0, 100.0]), t([1.0, 1.0, 1.0, 0.0])
    assert ppo.masked_mean(values, mask).item() == pytest.approx(2.0)
    # Kept: 1, 2, 3; squared deviations 1 + 0 + 1 = 2; unbiased: 2 / 2 = 1.
    assert ppo.masked_var(values, mask).item() == pytest.approx(1.0)
    assert ppo.masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)
    w = ppo.whiten(values, mask)
    assert w[0, :3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-7)
    assert ppo.whiten(values, mask, shift_mean=False)[0, :3].tolist() == \
        pytest.approx([1.0, 2.0, 3.0], abs=1e-7)
    with pytest.raises(ValueError, match="at least two"):
        ppo.masked_var(values, t([1.0, 0.0, 0.0, 0.0]))


def test_gae_by_hand():
    # One sequence, gamma 1, lambda 0.5; V after the last token is 0.
    rewards, values = t([0.0, 0.0, 1.0]), t([0.5, 0.25, 0.75])
    adv, ret = ppo.gae(rewards, values, gamma=1.0, lam=0.5)
    d2 = 1.0 - 0.75            # 0.25
    d1 = 0.0 + 0.75 - 0.25     # 0.5
    d0 = 0.0 + 0.25 - 0.5      # -0.25
    a2, a1 = d2, d1 + 0.5 * d2
    a0 = d0 + 0.5 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2])
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.25, a2 + 0.75])
    # gamma 0.9, lambda 1: advantages are discounted returns minus values.
    adv, _ = ppo.gae(t([1.0, 2.0]), t([0.0, 0.0]), gamma=0.9, lam=1.0)
    assert adv[0].tolist() == pytest.approx([1.0 + 0.9 * 2.0, 2.0])


def test_kl_estimators_and_token_rewards():
    logp, ref = t([math.log(0.5), math.log(0.2)]), t([math.log(0.25), math.log(0.4)])
    assert ppo.kl_per_token(logp, ref, "k1")[0].tolist() == \
        pytest.approx([math.log(2.0), math.log(0.5)])
    # k3 = (r - 1) - log r, r = ref/p: r = 0.5 -> 0.5 - 1 + log 2; r = 2 -> 1 - log 2.
    assert ppo.kl_per_token(logp, ref, "k3")[0].tolist() == \
        pytest.approx([-0.5 + math.log(2.0), 1.0 - math.log(2.0)])
    with pytest.raises(ValueError, match="estimator"):
        ppo.kl_per_token(logp, ref, "k2")
    # Two sequences, lengths 2 and 3: the score lands on each one's last token.
    logp = t([0.1, 0.2, 0.0], [0.3, 0.1, 0.2])
    ref = torch.zeros_like(logp)
    mask = t([1.0, 1.0, 0.0], [1.0, 1.0, 1.0])
    rewards, kl = ppo.token_rewards(t(5.0, -1.0), logp, ref, mask, kl_coef=0.1)
    assert rewards[0].tolist() == pytest.approx([-0.01, -0.02 + 5.0, 0.0])
    assert rewards[1].tolist() == pytest.approx([-0.03, -0.01, -0.02 - 1.0])
    assert kl[0, 2].item() == 0.0
    with pytest.raises(ValueError, match="at least one response token"):
        ppo.token_rewards(t(1.0), t([0.0]), t([0.0]), t([0.0]))


def test_clipped_policy_loss_by_hand():
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = t([math.log(1.5), math.log(0.5), math.log(1.1)])
    adv, mask = t([1.0, -1.0, 2.0]), t([1.0, 1.0, 1.0])
    out = ppo.policy_loss(new, old, adv, mask, cliprange=0.2)
    # Token 0: ratio 1.5, A 1: max(-1.5, -1.2) = -1.2 (clipped wins).
    # Token 1: ratio 0.5, A -1: max(0.5, 0.8) = 0.8 (clipped wins).
    # Token 2: ratio 1.1, A 2: max(-2.2, -2.2) = -2.2 (inside the range).
    assert out.loss.item() == pytest.approx((-1.2 + 0.8 - 2.2) / 3)
    assert out.clipfrac.item() == pytest.approx(2 / 3)
    logs = [math.log(1.5), math.log(0.5), math.log(1.1)]
    assert out.approx_kl.item() == pytest.approx(0.5 * sum(x * x for x in logs) / 3)
    weighted = ppo.policy_loss(new, old, adv, mask, 0.2, is_weights=t([2.0, 1.0, 0.5]))
    assert weighted.loss.item() == pytest.approx((-2.4 + 0.8 - 1.1) / 3)


def test_clipped_value_loss_by_hand():
    values, old, returns = t([1.0, 0.0]), t([0.5, 0.0]), t([2.0, 1.0])
    out = ppo.value_loss(values, old, returns, t([1.0, 1.0]), cliprange_value=0.2)
    # Token 0: clip(1.0, 0.3, 0.7) = 0.7: max((1-2)^2, (0.7-2)^2) = 1.69 (clipped wins).
    # Token 1: inside the range: (0-1)^2 = 1.
    assert out.loss.item() == pytest.approx(0.5 * (1.69 + 1.0) / 2)
    assert out.clipfrac.item() == pytest.approx(0.5)


def test_truncated_importance_weights_token_and_sequence():
    rollout = t([math.log(0.5), math.log(0.2), math.log(0.4)])
    learner = t([math.log(0.25), math.log(0.6), math.log(0.4)])
    mask = t([1.0, 1.0, 1.0])
    w = ppo.truncated_is_weights(rollout, learner, mask, cap=2.0)
    # Ratios 0.5, 3 (cut to 2), 1.
    assert w.weights[0].tolist() == pytest.approx([0.5, 2.0, 1.0])
    assert w.mean.item() == pytest.approx(3.5 / 3)
    assert w.std.item() == pytest.approx(math.sqrt(((0.5 - 3.5 / 3) ** 2 + (2 - 3.5 / 3) ** 2
                                                    + (1 - 3.5 / 3) ** 2) / 3))
    assert w.ess.item() == pytest.approx(3.5 ** 2 / (0.25 + 4 + 1) / 3)
    assert w.truncated.item() == pytest.approx(1 / 3)
    assert w.prob_gap.item() == pytest.approx((0.25 + 0.4 + 0.0) / 3)
    # Sequence level: the product 0.5 · 3 · 1 = 1.5 for every token, under the cap.
    s = ppo.truncated_is_weights(rollout, learner, mask, cap=2.0, level="sequence")
    assert s.weights[0].tolist() == pytest.approx([1.5, 1.5, 1.5])
    assert s.mean.item() == pytest.approx(1.5) and s.truncated.item() == 0.0
    with pytest.raises(ValueError, match="level"):
        ppo.truncated_is_weights(rollout, learner, mask, level="batch")
    with pytest.raises(ValueError, match="cap"):
        ppo.truncated_is_weights(rollout, learner, mask, cap=0)


def test_policy_loss_takes_a_clip_range_per_token():
    # ratio e^0.5 ≈ 1.6487 with A = 1: ε 0.2 clips at 1.2, ε 1.0 lets 1.6487 through.
    new = torch.tensor([[0.5, 0.5]])
    old = torch.zeros(1, 2)
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    out = ppo.policy_loss(new, old, adv, mask, cliprange=torch.tensor([[0.2, 1.0]]))
    assert out.loss.item() == pytest.approx(-(1.2 + math.exp(0.5)) / 2, abs=1e-6)
    assert out.clipfrac.item() == pytest.approx(0.5)
