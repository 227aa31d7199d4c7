"""The arithmetic of PPO-RLHF, apart from any model: masked statistics, advantage
whitening, GAE, the per-token KL penalty with the score at the last token, the
clipped policy and value losses, and truncated importance sampling for rollouts
that ran in another (quantized) precision than the learner.

Conventions follow TRL's PPO trainer, whose defaults (kl_coef 0.05, cliprange 0.2,
vf_coef 0.1, gamma 1, lam 0.95) are the defaults here. Tensors are [batch, tokens]
over the response tokens; `mask` is 1 for real tokens and 0 for padding.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

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
