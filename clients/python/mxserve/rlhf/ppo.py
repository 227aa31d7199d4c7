"""The arithmetic of PPO-RLHF, apart from any model: masked statistics, advantage
whitening, GAE, the per-token KL penalty with the score at the last token, the
clipped policy and value losses, truncated importance sampling for rollouts
that ran in another (quantized) precision than the learner, and the health
metrics of that mismatch as verl names them (`mismatch_metrics`).

Conventions follow TRL's PPO trainer, whose defaults (kl_coef 0.05, cliprange 0.2,
vf_coef 0.1, gamma 1, lam 0.95) are the defaults here. Tensors are [batch, tokens]
over the response tokens; `mask` is 1 for real tokens and 0 for padding.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Union

import torch

KL_COEF = 0.05
CLIPRANGE = 0.2
CLIPRANGE_VALUE = 0.2
VF_COEF = 0.1
GAMMA = 1.0
LAM = 0.95
IS_CAP = 2.0


def masked_mean(values: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean over the tokens the mask keeps (all, without one)."""
    if mask is None:
        return values.mean()
    return (values * mask).sum() / mask.sum()


def masked_var(values: torch.Tensor, mask: Optional[torch.Tensor] = None,
               unbiased: bool = True) -> torch.Tensor:
    """Variance over the kept tokens; `unbiased` applies Bessel's correction n/(n-1)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = values.numel() if mask is None else mask.sum()
        if n < 2:
            raise ValueError("masked_var: an unbiased variance needs at least two kept tokens")
        var = var * n / (n - 1)
    return var


def whiten(values: torch.Tensor, mask: Optional[torch.Tensor] = None,
           shift_mean: bool = True) -> torch.Tensor:
    """(values − mean) / sqrt(var + 1e-8) over the kept tokens; with shift_mean False
    the mean is added back (TRL whitens rewards that way, advantages fully)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def kl_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                 estimator: str = "k1") -> torch.Tensor:
    """An estimate of KL(π ‖ π_ref) per sampled token, from log-probs of the tokens
    sampled from π: "k1" is log π − log π_ref (unbiased, can be negative), "k3" is
    (r − 1) − log r with r = π_ref/π (unbiased and never negative)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kl_per_token: estimator {estimator!r}; expected 'k1' or 'k3'")


def token_rewards(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                  mask: torch.Tensor, kl_coef: float = KL_COEF,
                  estimator: str = "k1") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: −kl_coef · KL at every response token, plus the reward
    model's score ([batch]) at each sequence's last kept token. Returns (rewards,
    the KL per token)."""
    kl = kl_per_token(logprobs, ref_logprobs, estimator) * mask
    rewards = -kl_coef * kl
    lengths = mask.sum(dim=1).long()
    if (lengths < 1).any():
        raise ValueError("token_rewards: every sequence needs at least one response token")
    last = lengths - 1
    rows = torch.arange(rewards.shape[0])
    rewards[rows, last] += scores.to(rewards.dtype)
    return rewards, kl


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor] = None,
        gamma: float = GAMMA, lam: float = LAM) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over [batch, tokens]; the value after the
    last token is 0. Returns (advantages, returns = advantages + values)."""
    if mask is not None:
        rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    steps = rewards.shape[1]
    for t in reversed(range(steps)):
        next_value = values[:, t + 1] if t + 1 < steps else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        advantages[:, t] = last
    return advantages, advantages + values


@dataclasses.dataclass
class PolicyLoss:
    loss: torch.Tensor
    clipfrac: torch.Tensor  # share of kept tokens where the clipped term won
    approx_kl: torch.Tensor  # ½·mean (log π_new − log π_old)²
    ratio_mean: torch.Tensor


def policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor,
                cliprange: Union[float, torch.Tensor] = CLIPRANGE,
                is_weights: Optional[torch.Tensor] = None) -> PolicyLoss:
    """PPO's clipped surrogate, max(−A·ρ, −A·clip(ρ, 1 ± ε)) averaged over kept
    tokens, ρ = π_new/π_old. `cliprange` is one ε or one per token (an adaptive
    clipping range). `is_weights` (truncated importance weights of the rollout, see
    truncated_is_weights) multiply each token's loss."""
    log_ratio = new_logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token = torch.max(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights
    return PolicyLoss(loss=masked_mean(per_token, mask),
                      clipfrac=masked_mean((clipped > unclipped).to(ratio.dtype), mask),
                      approx_kl=0.5 * masked_mean(log_ratio ** 2, mask),
                      ratio_mean=masked_mean(ratio, mask))


@dataclasses.dataclass
class ValueLoss:
    loss: torch.Tensor
    clipfrac: torch.Tensor


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, cliprange_value: float = CLIPRANGE_VALUE) -> ValueLoss:
    """½·max((V − R)², (clip(V, V_old ± ε) − R)²) averaged over kept tokens."""
    clipped_values = torch.clamp(values, old_values - cliprange_value,
                                 old_values + cliprange_value)
    unclipped = (values - returns) ** 2
    clipped = (clipped_values - returns) ** 2
    return ValueLoss(loss=0.5 * masked_mean(torch.max(unclipped, clipped), mask),
                     clipfrac=masked_mean((clipped > unclipped).to(values.dtype), mask))


@dataclasses.dataclass
class ImportanceWeights:
    weights: torch.Tensor  # [batch, tokens] (sequence level: one value per row, repeated)
    mean: torch.Tensor     # of the truncated weights over kept tokens (sequences)
    std: torch.Tensor
    ess: torch.Tensor      # effective sample size, (Σw)²/Σw², as a share of the count
    truncated: torch.Tensor  # share of weights the cap cut
    prob_gap: torch.Tensor   # mean |p_rollout − p_learner| over kept tokens


def truncated_is_weights(rollout_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                         mask: torch.Tensor, cap: float = IS_CAP,
                         level: str = "token") -> ImportanceWeights:
    """Truncated importance sampling for rollouts sampled by a differently quantized
    policy: w = min(π_learner/π_rollout, cap) per token ("token"), or of the
    sequence's product of ratios ("sequence"), both computed from log-probs.
    Detached: the weights correct the sampling distribution, they carry no
    gradient."""
    if cap <= 0:
        raise ValueError(f"truncated_is_weights: cap must be positive, got {cap}")
    log_ratio = (learner_logprobs - rollout_logprobs).detach() * mask
    if level == "token":
        raw = torch.exp(log_ratio)
        keep = mask
    elif level == "sequence":
        raw = torch.exp(log_ratio.sum(dim=1, keepdim=True)).expand_as(log_ratio)
        keep = torch.zeros_like(mask)  # statistics count each sequence once
        keep[:, 0] = 1
    else:
        raise ValueError(f"truncated_is_weights: level {level!r}; expected 'token' or "
                         "'sequence'")
    weights = torch.clamp(raw, max=cap)
    n = keep.sum()
    mean = (weights * keep).sum() / n
    var = (((weights - mean) ** 2) * keep).sum() / n
    ess = ((weights * keep).sum() ** 2) / ((weights ** 2) * keep).sum() / n
    truncated = ((raw > cap).to(weights.dtype) * keep).sum() / n
    gap = masked_mean((torch.exp(rollout_logprobs) - torch.exp(learner_logprobs)).abs().detach(),
                      mask)
    return ImportanceWeights(weights=weights * mask, mean=mean, std=var.sqrt(), ess=ess,
                             truncated=truncated, prob_gap=gap)


# Where exp() of a log-ratio is clamped for the metrics, as verl does (exp(±20)).
_LOG_RATIO_BOUND = 20.0


def mismatch_metrics(rollout_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                     mask: torch.Tensor, cap: float = IS_CAP,
                     prefix: str = "rollout_corr/") -> Dict[str, float]:
    """Rollout–learner mismatch health metrics, named and defined as verl's
    rollout correction logs them (verl/trainer/ppo/rollout_corr_helper.py:
    compute_is_metrics, token level, and compute_offpolicy_metrics), each key
    prefixed with `prefix` as verl prefixes them ("rollout_corr/").

    Inputs are [batch, tokens] log-probs of the sampled response tokens under the
    rollout policy (quantized, the sampler) and the learner (π_old, update
    precision), and the response mask. w = exp(learner − rollout) = π_learner /
    π_rollout per valid token, its exponent clamped to ±20 (verl clamps so for
    the weight statistics and χ²; here K3 uses the same clamped w, which differs
    from verl's unclamped K3 only for ratios beyond e^20). All means are over the
    valid tokens of the whole batch unless said otherwise. These are diagnostics
    of the token-level weight whatever `is_level` the loss uses.

    - rollout_is_mean, _min, _max: of the untruncated w (verl computes them
      before truncating). verl warns when the mean leaves [0.5, 2].
    - rollout_is_std: population std of w clamped to [1/cap, cap] (verl clamps
      before squaring, so one extreme token cannot dominate).
    - rollout_is_eff_sample_size: 1 / mean((w'/mean w')²) with w' = w clamped to
      [1/cap, cap], i.e. (Σw')² / (n·Σw'²): the effective sample size as a share
      of the n tokens, in (0, 1]; 1 when every weight is equal. verl warns below 0.3.
    - rollout_is_ratio_fraction_high / _low: share of tokens with w > cap (the
      ones truncated importance sampling cuts) / w < 1/cap.
    - kl: K1, mean(log π_rollout − log π_learner), an unbiased estimate of
      KL(π_rollout ‖ π_learner) from tokens sampled by the rollout policy (can be
      negative on a finite sample); k3_kl: K3, mean(w − 1 − log w), the same KL,
      unbiased and never negative. Direction confirmed against verl: both are
      KL(rollout ‖ training), measured on rollout samples. verl warns at |KL| > 0.1.
    - training_ppl / rollout_ppl: per sequence exp(−mean token log-prob), then
      averaged over sequences (verl's batch mean of per-sequence perplexities);
      training_log_ppl / rollout_log_ppl: the same before exp.
    - log_ppl_diff: mean over sequences of (mean rollout log-prob − mean learner
      log-prob) = log(training_ppl_i / rollout_ppl_i), positive when the learner
      finds the sampled text less likely than the sampler did; log_ppl_abs_diff
      its absolute mean; ppl_ratio: mean over sequences of training_ppl_i /
      rollout_ppl_i.
    - chi2_token: mean(w²) − 1; chi2_seq: mean over sequences of (Π_t w_t)² − 1
      (χ² divergence estimates, the variance of the token / sequence IS weight).

    Detached and pure: returns Python floats."""
    if cap <= 0:
        raise ValueError(f"mismatch_metrics: cap must be positive, got {cap}")
    low, high = sorted((1.0 / cap, float(cap)))  # the band [1/cap, cap]
    if not (rollout_logprobs.shape == learner_logprobs.shape == mask.shape):
        raise ValueError(f"mismatch_metrics: shapes differ: {tuple(rollout_logprobs.shape)}, "
                         f"{tuple(learner_logprobs.shape)}, {tuple(mask.shape)}")
    rollout = rollout_logprobs.detach().double()
    learner = learner_logprobs.detach().double()
    m = mask.detach().double()
    n = m.sum()
    if n < 1:
        raise ValueError("mismatch_metrics: the mask keeps no token")
    valid = m > 0
    log_w = torch.where(valid, learner - rollout, torch.zeros_like(rollout))
    w = torch.exp(log_w.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))

    def mean(values: torch.Tensor) -> float:
        return float((values * m).sum() / n)

    banded = w.clamp(low, high)
    banded_mean = mean(banded)
    normalised = banded / banded_mean
    ess = 1.0 / mean(normalised ** 2)

    rows = m.sum(dim=1) > 0          # sequences with at least one valid token
    lengths = m.sum(dim=1)[rows]
    seq_learner = (learner * m).sum(dim=1)[rows] / lengths
    seq_rollout = (rollout * m).sum(dim=1)[rows] / lengths
    diff = seq_rollout - seq_learner
    seq_log_w = log_w.sum(dim=1)[rows].clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)

    values = {
        "rollout_is_mean": mean(w),
        "rollout_is_std": math.sqrt(max(mean(banded ** 2) - banded_mean ** 2, 0.0)),
        "rollout_is_min": float(w[valid].min()),
        "rollout_is_max": float(w[valid].max()),
        "rollout_is_eff_sample_size": ess,
        "rollout_is_ratio_fraction_high": mean((w > high).double()),
        "rollout_is_ratio_fraction_low": mean((w < low).double()),
        "kl": mean(rollout - learner),
        "k3_kl": mean(w - 1.0 - log_w),
        "training_ppl": float(torch.exp(-seq_learner).mean()),
        "training_log_ppl": float((-seq_learner).mean()),
        "rollout_ppl": float(torch.exp(-seq_rollout).mean()),
        "rollout_log_ppl": float((-seq_rollout).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": mean(w ** 2) - 1.0,
        "chi2_seq": float(torch.exp(2.0 * seq_log_w).mean()) - 1.0,
    }
    return {prefix + key: value for key, value in values.items()}
