"""A compact PPO-RLHF trainer whose every nn.Linear runs on mxserved, in its phase.

    trainer = PPOTrainer(client, policy_lm, reward_model, PPOConfig(), policy="D-phase-adaptive",
                         run="exp1/D/seed0")
    for prompts in batches:
        metrics = trainer.step(prompts)          # TRL's metric names
    trainer.close()

Four models, as in TRL's PPO: the policy (a causal LM with a value head on its last
hidden state), a frozen reference copy of the initial policy, and a frozen reward
model (a backbone with a scalar head). Each is offloaded to the daemon
(`mxserve.torch.offload`) under the same policy, and every call runs in the phase
it belongs to:

| work                                              | phase   |
|---------------------------------------------------|---------|
| sampling responses (prefill + KV-cached decoding) | rollout |
| reward-model scores                               | reward  |
| reference log-probs (the KL penalty's π_ref)      | reward  |
| the learner's log-probs and values, the PPO       | update  |
| epochs' forward and backward                      |         |

The reference model runs in the reward phase: it is a frozen model scoring finished
sequences, forward only, and its output is part of the per-token reward
(−kl_coef·KL), so it tolerates what reward scoring tolerates and belongs to the same
energy account. Running it in the update phase would bill inference to training.

Quantized rollouts are off-policy for the learner: the rollout's own log-probs
(π_rollout, in the rollout format) differ from the learner's (π_old, update format).
The loss is decoupled PPO: ratios against π_old, each token weighted by the
truncated importance weight min(π_old/π_rollout, C) (FlashRL, verl; `is_level`
"token" or "sequence", C = `is_cap` = 2). With `adaptive_clip`, the clip range of a
token widens with the disagreement between the two actors (see `adaptive_cliprange`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from mxserve.rlhf import ppo
from mxserve._wire import PHASES
from mxserve.client import Client
from mxserve.energy_model import merge_work
from mxserve.torch import OffloadSession, PhaseTotals, RemoteAdamW, offload

__all__ = ["PPOConfig", "PPOTrainer", "PolicyWithValue", "Rollout", "RewardModel",
           "adaptive_cliprange", "generate", "left_pad", "response_logprobs",
           "sequence_scores"]

@dataclasses.dataclass
class PPOConfig:
    """PPO's knobs; defaults are TRL's PPOConfig where TRL has one."""
    batch_size: int = 8
    response_length: int = 16
    temperature: float = 0.7
    num_ppo_epochs: int = 4
    num_mini_batches: int = 1
    learning_rate: float = 3e-6
    max_grad_norm: float = 1.0
    kl_coef: float = ppo.KL_COEF
    kl_estimator: str = "k1"
    cliprange: float = ppo.CLIPRANGE
    cliprange_value: float = ppo.CLIPRANGE_VALUE
    vf_coef: float = ppo.VF_COEF
    gamma: float = ppo.GAMMA
    lam: float = ppo.LAM
    whiten_rewards: bool = False
    missing_eos_penalty: Optional[float] = None
    is_level: str = "token"  # truncated importance sampling: "token", "sequence" or "none"
    is_cap: float = ppo.IS_CAP
    adaptive_clip: bool = False

    def __post_init__(self):
        checks = [("batch_size", self.batch_size >= 1), ("response_length", self.response_length >= 1),
                  ("temperature", self.temperature > 0), ("num_ppo_epochs", self.num_ppo_epochs >= 1),
                  ("num_mini_batches", 1 <= self.num_mini_batches <= self.batch_size),
                  ("learning_rate", self.learning_rate > 0), ("is_cap", self.is_cap > 0),
                  ("is_level", self.is_level in ("token", "sequence", "none")),
                  ("kl_estimator", self.kl_estimator in ("k1", "k3"))]
        for field, ok in checks:
            if not ok:
                raise ValueError(f"PPOConfig.{field}: invalid value {getattr(self, field)!r}")


# --- models ----------------------------------------------------------------------------


class PolicyWithValue(nn.Module):
    """A causal LM and a value head on its final hidden state (one forward gives
    both, as in TRL's value-head models; vf_coef 0.1 balances the shared body)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.value_head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=1.0 / math.sqrt(lm.config.hidden_size + 1))
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids, attention_mask):
        out = self.lm(input_ids, attention_mask=attention_mask)
        return out.logits, self.value_head(out.hidden).squeeze(-1)


class RewardModel(nn.Module):
    """A causal LM's body and a scalar head ("score", as in Hugging Face's
    sequence-classification models) read at each sequence's last real token. The
    LM head is dropped: scoring never needs the vocabulary."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        lm.lm_head = _NoHead()
        self.lm = lm
        self.score = nn.Linear(lm.config.hidden_size, 1, bias=False)
        nn.init.normal_(self.score.weight, std=1.0 / math.sqrt(lm.config.hidden_size + 1))

    def forward(self, input_ids, attention_mask):
        hidden = self.lm(input_ids, attention_mask=attention_mask).hidden
        return sequence_scores(self.score(hidden).squeeze(-1), attention_mask)


class _NoHead(nn.Module):
    """Stands in for a reward model's unused LM head: returns its input."""

    def forward(self, hidden):
        return hidden


def sequence_scores(per_token: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[batch, tokens] → [batch]: the value at each row's last real token."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (attention_mask.long() * (positions + 1)).argmax(dim=1)
    return per_token.gather(1, last[:, None]).squeeze(1)


# --- sequences ---------------------------------------------------------------------------


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token lists → (ids, mask), [batch, longest], padded on the left (generation
    continues every row from the same column)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, tokens in enumerate(sequences):
        if len(tokens):
            ids[row, width - len(tokens):] = torch.as_tensor(list(tokens), dtype=torch.long)
            mask[row, width - len(tokens):] = 1
    return ids, mask


def limit_vocab(logits: torch.Tensor, vocab_limit: Optional[int]) -> torch.Tensor:
    """Logits with ids ≥ vocab_limit at −inf: a checkpoint's embedding may have more
    rows than its tokenizer has tokens (Qwen2.5: 151,936 and 151,665), and those
    ids must never be sampled."""
    if vocab_limit is None or vocab_limit >= logits.shape[-1]:
        return logits
    return logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= vocab_limit,
                              float("-inf"))


def response_log_softmax(logits: torch.Tensor, prompt_width: int, temperature: float,
                         vocab_limit: Optional[int] = None) -> torch.Tensor:
    """The next-token log-distributions at the response positions ([B, R, V]) of
    logits of the whole sequence (position t predicts token t+1), at `temperature`
    and over the ids that can be sampled, as in generation."""
    predicting = limit_vocab(logits[:, prompt_width - 1:-1].float(), vocab_limit) / temperature
    return torch.log_softmax(predicting, dim=-1)


def response_logprobs(logits: torch.Tensor, ids: torch.Tensor, prompt_width: int,
                      temperature: float, vocab_limit: Optional[int] = None) -> torch.Tensor:
    """Log-probs of the response tokens ids[:, prompt_width:]."""
    return response_log_softmax(logits, prompt_width, temperature, vocab_limit).gather(
        2, ids[:, prompt_width:, None]).squeeze(2)


@dataclasses.dataclass
class Rollout:
    """Sampled responses: ids/mask cover prompt + response ([batch, P + R]); the
    response part is right-padded, its mask keeps tokens up to and including EOS."""
    ids: torch.Tensor
    mask: torch.Tensor
    prompt_width: int
    logprobs: torch.Tensor  # [batch, R], the sampling policy's, at the temperature
    ended: torch.Tensor     # [batch] bool: the response ended with EOS within the length
    logits: Optional[torch.Tensor] = None  # [batch, R, vocab] (float32) when kept

    @property
    def response_ids(self) -> torch.Tensor:
        return self.ids[:, self.prompt_width:]

    @property
    def response_mask(self) -> torch.Tensor:
        return self.mask[:, self.prompt_width:]

    def responses(self) -> List[List[int]]:
        return [row[m.bool()].tolist() for row, m in zip(self.response_ids, self.response_mask)]


@torch.no_grad()
def generate(lm: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
             max_new_tokens: int, temperature: float, eos_id: int, pad_id: int,
             generator: Optional[torch.Generator] = None, greedy: bool = False,
             keep_logits: bool = False, vocab_limit: Optional[int] = None) -> Rollout:
    """Samples up to `max_new_tokens` per row with a KV cache: one prefill of the
    left-padded prompts, then one token per step. Rows that produced EOS are padded
    from then on; stops early when every row has."""
    batch, device = prompt_ids.shape[0], prompt_ids.device
    out = lm(prompt_ids, attention_mask=prompt_mask, use_cache=True)
    mask = prompt_mask
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, logprobs, kept, logits_kept = [], [], [], []
    logits = limit_vocab(out.logits[:, -1].float(), vocab_limit)
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(logits / temperature, dim=-1)
        if greedy:
            token = logp.argmax(dim=-1)
        else:
            # On the CPU with a CPU generator: the same draws whatever the device.
            token = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(1)
            token = token.to(device)
        token = torch.where(done, torch.full_like(token, pad_id), token)
        tokens.append(token)
        logprobs.append(logp.gather(1, token[:, None]).squeeze(1))
        kept.append(~done)
        if keep_logits:
            logits_kept.append(logits)
        done = done | (token == eos_id)
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=1)
        out = lm(token[:, None], attention_mask=mask, cache=out.cache, use_cache=True)
        logits = limit_vocab(out.logits[:, -1].float(), vocab_limit)
    response = torch.stack(tokens, dim=1)
    response_mask = torch.stack(kept, dim=1).to(prompt_mask.dtype)
    return Rollout(ids=torch.cat([prompt_ids, response], dim=1),
                   mask=torch.cat([prompt_mask, response_mask], dim=1),
                   prompt_width=prompt_ids.shape[1],
                   logprobs=torch.stack(logprobs, dim=1) * response_mask, ended=done,
                   logits=torch.stack(logits_kept, dim=1) if keep_logits else None)


# --- adaptive clipping -------------------------------------------------------------------


def adaptive_cliprange(rollout_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                       cliprange: float) -> torch.Tensor:
    """Per-token clip range ε_t = ε · (1 + |log(π_old/π_rollout)|).

    After QuRL's adaptive clipping range: where the quantized actor and the
    full-precision learner agree the range is PPO's ε; where they disagree the
    trust region widens in proportion to the log-ratio, so tokens the quantized
    rollout mis-weighted are not all clipped away (QuRL reports that clipping those
    against a fixed ε is what collapses long runs). mxserve's formulation: QuRL's
    paper describes the idea, this is the formula used here."""
    return cliprange * (1.0 + (learner_logprobs - rollout_logprobs).abs().detach())


# --- the trainer -------------------------------------------------------------------------


class PPOTrainer:
    """Runs PPO steps on prompts; see the module docstring for the phases.

    `policy_lm` and `reward_model` are local modules; the trainer builds the value
    head and the frozen reference copy. With a `client`, it offloads all three roles
    under daemon model names `{name_prefix}.policy`, `.reference` and `.reward` with `policy`
    and tags every request with `run`, so this run's energy stays apart from any
    other's. Without one (the GPU baseline) everything runs here on `device`, under
    FP16 autocast on CUDA. `compute` says where offloaded linears compute (see
    `mxserve.torch.offload`): on the daemon, or "local" on `device` with the daemon's numerics.
    `frozen_dtype` (e.g. torch.bfloat16) holds the frozen reference in that dtype
    (the reward model comes in whatever dtype it has): half the memory of FP32 for
    models that never train. `optimizer="remote"` steps the policy's offloaded
    layers on the daemon (mxserve.torch.RemoteAdamW: the same Adam, bit for bit,
    clipping over both sides) and the rest here, so no weight crosses the wire
    during the PPO epochs but a tied vocabulary projection's. `totals()` sums the daemon's ExecutionInfo per phase;
    `wall` holds the seconds spent here in each phase; `current_phase` is the phase
    running now (a power sampler tags its samples with it). `phase_hook`, when set,
    is called with a phase as it is entered, before `current_phase` changes (an
    energy meter synchronises and reads its counter there)."""

    def __init__(self, client: Optional[Client], policy_lm: nn.Module, reward_model: RewardModel,
                 config: PPOConfig, *, policy: str = "", run: str = "", name_prefix: str = "ppo",
                 eos_id: int, pad_id: int, seed: int = 0, device: str = "cpu",
                 vocab_limit: Optional[int] = None, compute: str = "daemon",
                 frozen_dtype: Optional[torch.dtype] = None, optimizer: str = "local"):
        self.client = client
        self.config = config
        self.run = run
        self.device = torch.device(device)
        self.eos_id, self.pad_id = eos_id, pad_id
        self.vocab_limit = vocab_limit
        self.model = PolicyWithValue(policy_lm)
        self.reference = copy.deepcopy(policy_lm).requires_grad_(False)
        if frozen_dtype is not None:
            self.reference.to(frozen_dtype)
        self.reward_model = reward_model.requires_grad_(False)
        for module in (self.model, self.reference, self.reward_model):
            module.to(self.device)
        self.generator = torch.Generator().manual_seed(seed)
        if optimizer not in ("local", "remote"):
            raise ValueError(f"optimizer: expected 'local' or 'remote', got {optimizer!r}")
        if optimizer == "remote" and (client is None or compute != "daemon"):
            raise ValueError("optimizer='remote' steps the policy on the daemon: it needs a "
                             "client and compute='daemon'")
        # Adam, eps 1e-5, no weight decay: AdamW with weight_decay 0 is the same
        # step bit for bit, which is what the daemon runs with optimizer="remote".
        adam_eps = 1e-5
        self.remote_optimizer = (RemoteAdamW(lr=config.learning_rate, eps=adam_eps,
                                             weight_decay=0.0, max_grad_norm=config.max_grad_norm)
                                 if optimizer == "remote" else None)
        # Over every parameter; with optimizer="remote", over the local half only
        # (below, once the policy's session says which those are).
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate,
                                          eps=adam_eps)
        self.wall = {phase: 0.0 for phase in PHASES}
        self.current_phase = "rollout"
        self.phase_hook: Optional[Callable[[str], None]] = None
        self.step_count = 0
        self.sessions: Dict[str, OffloadSession] = {}
        if client is not None:
            try:
                # Each session keys a policy's stochastic rounding by the run's
                # seed and its role, so two seeds draw different bits.
                for index, (role, module) in enumerate((("policy", self.model),
                                                        ("reference", self.reference),
                                                        ("reward", self.reward_model))):
                    self.sessions[role] = offload(
                        module, client, f"{name_prefix}.{role}", policy=policy, replace=True,
                        compute=compute, seed=seed * 3 + index,
                        optimizer=self.remote_optimizer if role == "policy" else None)
                if self.remote_optimizer is not None:
                    # The local half: what the daemon does not step, same Adam.
                    self.optimizer = torch.optim.Adam(
                        self.sessions["policy"].local_parameters(), lr=config.learning_rate,
                        eps=adam_eps)
            except BaseException:
                self.close()
                raise

    def totals(self) -> Dict[str, PhaseTotals]:
        """Per phase: the daemon's ExecutionInfo summed over every session."""
        summed: Dict[str, PhaseTotals] = {}
        for session in self.sessions.values():
            for phase, totals in session.totals.items():
                summed.setdefault(phase, PhaseTotals()).merge(totals)
        return summed

    def work(self, run: Optional[str] = None) -> List[Dict[str, Any]]:
        """The GEMMs the daemon booked, merged over every session (JSON-ready rows,
        see OffloadSession.work); only run `run`'s when given. For
        mxserve.energy_model.phase_joules and saving_range."""
        return merge_work(*(session.work(run) for session in self.sessions.values()))

    def policy_copy(self) -> nn.Module:
        """A plain local copy of the policy LM as trained (no offloaded modules)."""
        with contextlib.ExitStack() as scope:
            if "policy" in self.sessions:
                # local() fetches the daemon's steps first, if it stepped.
                scope.enter_context(self.sessions["policy"].local())
            return copy.deepcopy(self.model.lm)

    def flush_work(self) -> None:
        """Reports the calls the sessions ran locally (compute="local") to the daemon's
        ledger; nothing to do otherwise. Each step ends with it."""
        for session in self.sessions.values():
            session.flush_work()

    def close(self) -> None:
        """Restores the local modules and deletes the daemon's copies."""
        for session in self.sessions.values():
            session.restore()
        self.sessions = {}

    @contextlib.contextmanager
    def _in_phase(self, phase: str) -> Iterator[None]:
        """Runs the body in `phase` (and the run tag) on the daemon, or locally
        under autocast; adds its wall time to `wall[phase]`."""
        if self.phase_hook is not None:
            self.phase_hook(phase)
        self.current_phase = phase
        start = time.perf_counter()
        with contextlib.ExitStack() as scopes:
            if self.client is not None:
                scopes.enter_context(self.client.phase(phase))
                scopes.enter_context(self.client.run(self.run))
            elif self.device.type == "cuda":
                scopes.enter_context(torch.autocast("cuda", dtype=torch.float16))
            try:
                yield
            finally:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.wall[phase] += time.perf_counter() - start

    def rollout(self, prompts: Sequence[Sequence[int]], keep_logits: bool = False,
                generator: Optional[torch.Generator] = None) -> Rollout:
        """Samples responses in the rollout phase."""
        ids, mask = (t.to(self.device) for t in left_pad(prompts, self.pad_id))
        with self._in_phase("rollout"):
            return generate(self.model.lm, ids, mask, self.config.response_length,
                            self.config.temperature, self.eos_id, self.pad_id,
                            generator or self.generator, keep_logits=keep_logits,
                            vocab_limit=self.vocab_limit)

    @torch.no_grad()
    def score(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Reward-model scores of whole sequences, in the reward phase."""
        with self._in_phase("reward"):
            return self.reward_model(ids, mask).float()

    def step(self, prompts: Sequence[Sequence[int]]) -> Dict[str, float]:
        """One PPO iteration on a batch of prompts: rollout, scoring, then
        `num_ppo_epochs` passes over `num_mini_batches` minibatches. Returns TRL's
        metrics, the truncated-IS weights' own statistics ("is/weight_mean",
        "is/weight_std", "is/ess", "is/truncated", "is/prob_gap"; absent with
        is_level "none") and verl's rollout-correction metrics
        ("rollout_corr/rollout_is_mean", ..., see ppo.mismatch_metrics; always)."""
        cfg = self.config
        rollout = self.rollout(prompts)
        ids, mask, width = rollout.ids, rollout.mask, rollout.prompt_width
        response_mask = rollout.response_mask.float()

        with torch.no_grad():
            scores = self.score(ids, mask)
            with self._in_phase("reward"):
                ref_logits = self.reference(ids, attention_mask=mask).logits
            ref_logprobs = response_logprobs(ref_logits, ids, width, cfg.temperature,
                                                self.vocab_limit)
            with self._in_phase("update"):
                logits, values_all = self.model(ids, mask)
            old_logprobs = response_logprobs(logits, ids, width, cfg.temperature,
                                                self.vocab_limit)
            old_values = values_all[:, width - 1:-1].float()
        if cfg.missing_eos_penalty is not None:
            scores = scores - cfg.missing_eos_penalty * (~rollout.ended).float()

        rewards, kl = ppo.token_rewards(scores, old_logprobs, ref_logprobs, response_mask,
                                        cfg.kl_coef, cfg.kl_estimator)
        if cfg.whiten_rewards:
            rewards = ppo.whiten(rewards, response_mask, shift_mean=False) * response_mask
        advantages, returns = ppo.gae(rewards, old_values, response_mask, cfg.gamma, cfg.lam)
        advantages = ppo.whiten(advantages, response_mask) * response_mask

        if cfg.is_level != "none":
            health = ppo.truncated_is_weights(rollout.logprobs, old_logprobs, response_mask,
                                              cfg.is_cap, cfg.is_level)
            is_weights = health.weights
        else:
            health, is_weights = None, None
        clip = (adaptive_cliprange(rollout.logprobs, old_logprobs, cfg.cliprange)
                if cfg.adaptive_clip else cfg.cliprange)

        stats: Dict[str, List[float]] = {k: [] for k in (
            "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg",
            "val/clipfrac_avg", "policy/entropy_avg", "val/ratio")}
        batch = ids.shape[0]
        order = torch.randperm(batch, generator=self.generator)
        size = math.ceil(batch / cfg.num_mini_batches)
        for _ in range(cfg.num_ppo_epochs):
            for start in range(0, batch, size):
                rows = order[start:start + size]
                sl = rows
                with self._in_phase("update"):
                    new_logits, new_values_all = self.model(ids[sl], mask[sl])
                    # One log-softmax over the vocabulary serves the loss and the entropy.
                    log_dist = response_log_softmax(new_logits, width, cfg.temperature,
                                                    self.vocab_limit)
                    new_logprobs = log_dist.gather(2, ids[sl][:, width:, None]).squeeze(2)
                    new_values = new_values_all[:, width - 1:-1].float()
                    m = response_mask[sl]
                    pl = ppo.policy_loss(new_logprobs, old_logprobs[sl], advantages[sl], m,
                                         clip if isinstance(clip, float) else clip[sl],
                                         None if is_weights is None else is_weights[sl])
                    vl = ppo.value_loss(new_values, old_values[sl], returns[sl], m,
                                        cfg.cliprange_value)
                    loss = pl.loss + cfg.vf_coef * vl.loss
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if self.remote_optimizer is not None:
                        # Clipping over both sides, the daemon's step, then the local one.
                        self.sessions["policy"].step(self.optimizer)
                    else:
                        nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                        self.optimizer.step()
                        if self.sessions:
                            self.sessions["policy"].sync_weights()
                with torch.no_grad():
                    entropy = torch.special.entr(log_dist.exp()).sum(-1)
                stats["policy/approxkl_avg"].append(float(pl.approx_kl))
                stats["policy/clipfrac_avg"].append(float(pl.clipfrac))
                stats["loss/policy_avg"].append(float(pl.loss))
                stats["loss/value_avg"].append(float(vl.loss))
                stats["val/clipfrac_avg"].append(float(vl.clipfrac))
                stats["policy/entropy_avg"].append(float(ppo.masked_mean(entropy, m)))
                stats["val/ratio"].append(float(pl.ratio_mean))

        self.step_count += 1
        kl_sum = (kl * response_mask).sum(1)
        metrics = {k: sum(v) / len(v) for k, v in stats.items()}
        metrics.update({
            "objective/kl": float(kl_sum.mean()),
            "objective/entropy": float((-old_logprobs * response_mask).sum(1).mean()),
            "objective/non_score_reward": float((-cfg.kl_coef * kl_sum).mean()),
            "objective/rlhf_reward": float((scores - cfg.kl_coef * kl_sum).mean()),
            "objective/scores": float(scores.mean()),
            "val/num_eos_tokens": float(rollout.ended.sum()),
            "episode": float(self.step_count * batch),
        })
        if health is not None:
            metrics.update({"is/weight_mean": float(health.mean), "is/weight_std": float(health.std),
                            "is/ess": float(health.ess), "is/truncated": float(health.truncated),
                            "is/prob_gap": float(health.prob_gap)})
        # The rollout-learner mismatch as verl logs it ("rollout_corr/..."), every
        # step: it is a diagnostic of the quantized sampler, needed most when no
        # correction is applied.
        metrics.update(ppo.mismatch_metrics(rollout.logprobs, old_logprobs, response_mask,
                                            cfg.is_cap))
        self.flush_work()
        return metrics
