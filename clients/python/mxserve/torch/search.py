"""A learned policy generator: DynaQuant's reinforcement-learning search over
per-layer formats, on an offloaded model (the daemon, or the local emulator).

    from mxserve.torch import search
    session = offload(model, client, "lm", compute="local")
    result = search.search(session, batches, search.SearchConfig(phase="rollout",
                           budget_bits=6.0, episodes=40, seed=0))
    client.put_policy(result.policy("rl-rollout"))

An episode walks the layers in module order; at each layer a small PPO agent picks
a format from `formats`, the layer is pinned to it (the layers before keep their
choices, the layers after run in FP32), the model runs on the calibration batches
and the step's reward is read from its outputs against the all-FP32 model. After
`episodes_per_update` episodes the agent is updated (clipped PPO, episodic
returns); the best episode seen, or the greedy one at the end if better, becomes
the answer: an ordinary policy for one RLHF phase whose description says how it
was made.

The agent's state per layer is the poster's: the weight's mean and standard
deviation, its gradient norm (one FP32 backward of the objective's loss), the
layer's share of the searched parameters, its index, the previous layer's choice
(one-hot) and an EMA of the episode's rewards. The per-step reward depends on
the phase the policy is for (`objective`):

- "lm" (the poster's): a·2σ(−k·Δppl/ppl) − b·KL(p_q ‖ p_ref) − c·|ΔH| + d·saved,
  with Δppl the perplexity change, ΔH the change in the output distribution's
  entropy (the poster used attention entropy, which needs the model's attention
  maps; the output entropy is available for any language model) and `saved` the
  bits saved against 16, weighted by the layer's share of parameters;
- "rollout": −b·KL − e·tail + d·saved, tail the reference probability mass whose
  importance weight p_ref / p_q exceeds `is_cap` (what truncated importance
  sampling would clip);
- "reward": (ρ − 1) + d·saved, ρ Spearman's rank correlation of the quantized
  and the FP32 scores (the model returns one score per sequence);
- "update": (cos − 1) + d·saved, cos the cosine between the quantized and the
  FP32 gradients of the loss over the searched layers' weights.

A budget — one kind: `budget_bits` (mean bits per weight element over the
searched layers, scales included) or joules (`budget_joules`: the FPGA model's
joules for one forward of `budget_tokens` tokens through them; `relative_budget`:
the same as a fraction of all-FP16's; the tighter if both) — is enforced by
masking: an action is open
only if the cheapest formats for the layers left still fit, so every episode,
and the answer, is within it.

With compute="local", every pair the contract computes on its float path (FP32,
the reference; FP16, BF16; NF4 and BNB_FP4; mixed kinds) runs the emulator's fast
float path during a search (`float_path`): one GEMM within the contract's
tolerance instead of the daemon's fma chain, many times faster on a CPU; the
rewards compare formats, and the MX, NVFP4 and INT8 pairs keep the daemon's bits
either way.

The weights the agent chooses for do not change during the search: the poster's
short fine-tuning of the quantized and the reference model after each choice is
not built here (mxserve's formats are exact; what it would add is adaptation,
at the cost of a model copy per episode). Evaluations of an assignment prefix
are cached, so repeated prefixes cost nothing; the search is reproducible for a
fixed seed (exact numerics, seeded sampling and initialisation).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mxserve import _wire, energy_model, stats
from mxserve.torch import profile as _profile
from mxserve.torch.offloading import OffloadSession

__all__ = ["OBJECTIVES", "Episode", "SearchConfig", "SearchResult", "search"]

OBJECTIVES = ("lm", "rollout", "reward", "update")
PHASES = ("rollout", "reward", "update")
# The poster's action set: {nf4, fp4, int8, fp16, bf16, fp32}, FP4 bitsandbytes'.
DEFAULT_FORMATS = ("NF4", "BNB_FP4", "INT8", "FP16", "BF16", "FP32")

LossFn = Callable[[torch.Tensor, Any], torch.Tensor]
ForwardFn = Callable[[nn.Module, Any], Any]


@dataclass
class SearchConfig:
    """What the search optimises and how. The reward weights and the agent's
    hyperparameters are ours (the poster names the terms, not their weights)."""
    phase: str = "rollout"              # the RLHF phase the policy is for
    objective: Optional[str] = None     # None: the phase's ("rollout" → "rollout", ...)
    formats: Sequence[str] = DEFAULT_FORMATS
    episodes: int = 32
    seed: int = 0
    budget_bits: Optional[float] = None     # mean bits per weight element, scales included
    budget_joules: Optional[float] = None   # FPGA-model joules of one forward, budget_tokens
    relative_budget: Optional[float] = None  # the same, as a fraction of all-FP16's joules
    budget_tokens: int = 512
    # The emulator's float path while searching (MXSERVE_EMULATOR_FLOAT): "fast",
    # one GEMM within the contract's tolerance, or "exact", the daemon's fma chain.
    float_path: str = "fast"
    # Reward weights: perplexity, KL, entropy, memory saved, importance-weight tail.
    ppl_weight: float = 1.0
    ppl_sharpness: float = 10.0
    kl_weight: float = 1.0
    entropy_weight: float = 0.1
    memory_weight: float = 0.5
    tail_weight: float = 1.0
    is_cap: float = 2.0
    reward_ema: float = 0.9
    # The agent: a two-layer MLP with policy and value heads, clipped PPO.
    hidden: int = 32
    learning_rate: float = 3e-3
    episodes_per_update: int = 4
    ppo_epochs: int = 4
    clip: float = 0.2
    entropy_bonus: float = 0.01

    def resolved_objective(self) -> str:
        return self.objective or self.phase

    def validate(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase: expected one of {', '.join(PHASES)}, got {self.phase!r}")
        if self.resolved_objective() not in OBJECTIVES:
            raise ValueError(f"objective: expected one of {', '.join(OBJECTIVES)}, "
                             f"got {self.objective!r}")
        if not self.formats:
            raise ValueError("formats: expected at least one format")
        for name, value, low in (("episodes", self.episodes, 1), ("hidden", self.hidden, 1),
                                 ("episodes_per_update", self.episodes_per_update, 1),
                                 ("ppo_epochs", self.ppo_epochs, 1),
                                 ("budget_tokens", self.budget_tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        for name in ("budget_bits", "budget_joules", "relative_budget"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0
                                          and math.isfinite(value)):
                raise ValueError(f"{name}: expected a positive number, got {value!r}")
        if self.budget_bits is not None and (self.budget_joules is not None or
                                             self.relative_budget is not None):
            # Masking keeps one additive budget exactly (the cheapest formats for
            # the layers left must still fit); two of different kinds may admit no
            # assignment at all although each alone does.
            raise ValueError("budget_bits: give a bits budget or a joules budget "
                             "(budget_joules, relative_budget), not both")
        if not 0.0 <= self.reward_ema < 1.0:
            raise ValueError(f"reward_ema: expected a number in [0, 1), got {self.reward_ema!r}")
        if self.float_path not in ("fast", "exact"):
            raise ValueError(f"float_path: expected 'fast' or 'exact', got {self.float_path!r}")
        if not self.is_cap > 1.0:
            raise ValueError(f"is_cap: expected a number above 1, got {self.is_cap!r}")


@dataclass
class Episode:
    """One walk over the layers: the formats chosen, the per-step rewards, and the
    assignment's mean bits per weight and modelled joules."""
    formats: Tuple[str, ...]
    rewards: Tuple[float, ...]
    bits_per_weight: float
    joules: float
    greedy: bool = False

    @property
    def total(self) -> float:
        return float(sum(self.rewards))


@dataclass
class SearchResult:
    config: SearchConfig
    layers: Tuple[str, ...]
    best: Episode
    episodes: List[Episode]
    seconds: float
    evaluations: int             # model passes over the batches (cache misses)
    final_metrics: Dict[str, float] = field(default_factory=dict)
    # What the search itself cost on the FPGA model: the joules of every GEMM its
    # evaluations ran, priced as the daemon books calls (the session's work
    # ledger; mxserve.energy_model.phase_joules). Modelled, not measured.
    search_joules: float = 0.0

    @property
    def assignment(self) -> Dict[str, str]:
        return dict(zip(self.layers, self.best.formats))

    def policy(self, name: str, others: str = "FP16") -> Dict[str, Any]:
        """The answer as a policy document (Policies.PutPolicy): the searched phase
        by layer, the other phases `others` everywhere."""
        c = self.config
        budget = ", ".join(part for part in (
            f"budget {c.budget_bits} bits/weight" if c.budget_bits else "",
            f"budget {c.budget_joules} J per {c.budget_tokens} tokens" if c.budget_joules else "",
            f"budget {c.relative_budget} x all-FP16 joules" if c.relative_budget else "")
            if part) or "no budget"
        description = (
            f"RL-searched (DynaQuant-style PPO, mxserve.torch.search) for phase {c.phase}: objective "
            f"{c.resolved_objective()}, {len(self.episodes)} episodes, seed {c.seed}, {budget}; "
            f"best return {self.best.total:.4g}, {self.best.bits_per_weight:.3g} bits/weight, "
            f"{self.best.joules:.3g} J modelled; {self.seconds:.1f} s, "
            f"{self.evaluations} evaluations, {self.search_joules:.3g} J modelled for the search")
        defaults = {p: others for p in PHASES}
        rules = [{"phase": c.phase, "layers": layer, "format": fmt}
                 for layer, fmt in zip(self.layers, self.best.formats)]
        return {"name": name, "description": description, "defaults": defaults, "rules": rules}


# --- the objectives -----------------------------------------------------------------------

def _next_token_loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    """Mean next-token cross entropy of logits [B, T, V] for token ids [B, T]."""
    ids = batch if isinstance(batch, torch.Tensor) else None
    if ids is None or ids.dtype not in (torch.int64, torch.int32) or output.dim() != 3:
        raise TypeError("loss: the default loss needs batches of token ids [B, T] and logits "
                        "[B, T, V]; pass loss=")
    logits = output[:, :-1].reshape(-1, output.shape[-1]).float()
    return F.cross_entropy(logits, ids[:, 1:].reshape(-1).to(logits.device).long())


@dataclass
class _Outputs:
    logits: List[torch.Tensor]          # per batch, on the CPU in float64
    loss: float                         # mean over batches
    grads: Optional[torch.Tensor]       # "update": the searched weights' gradient, flat


class _Evaluator:
    """Runs the model with the searched layers pinned to an assignment (the rest
    FP32) and scores it against the all-FP32 run."""

    def __init__(self, session: OffloadSession, layers: Sequence[str], batches: List[Any],
                 config: SearchConfig, forward: Optional[ForwardFn], loss: LossFn):
        self.session, self.layers, self.batches = session, list(layers), batches
        self.config, self.forward, self.loss = config, forward, loss
        self.objective = config.resolved_objective()
        self.cache: Dict[Tuple[str, ...], Dict[str, float]] = {}
        self.evaluations = 0
        self.reference = self._run(("FP32",) * len(self.layers))

    def _run(self, formats: Sequence[str]) -> _Outputs:
        self.evaluations += 1
        model = self.session.model
        for layer, fmt in zip(self.layers, formats):
            self.session.layers[layer].format = fmt
        weights = [self.session.layers[n].weight for n in self.layers]
        want_grads = self.objective == "update"
        logits, losses = [], []
        grads = [torch.zeros_like(w) for w in weights] if want_grads else None
        with _profile._eval_mode(model), torch.set_grad_enabled(want_grads), \
                self.session.client.phase(self.config.phase):
            for batch in self.batches:
                out = _profile._output_tensor(_profile._run(model, batch, self.forward))
                if self.objective in ("lm", "rollout", "update"):
                    loss = self.loss(out, batch)
                    losses.append(float(loss))
                    if want_grads:
                        parts = torch.autograd.grad(loss, weights)
                        for g, p in zip(grads, parts):
                            g += p
                logits.append(out.detach().double().cpu())
        flat = torch.cat([g.reshape(-1) for g in grads]).double() if want_grads else None
        return _Outputs(logits, float(np.mean(losses)) if losses else 0.0, flat)

    def metrics(self, formats: Tuple[str, ...]) -> Dict[str, float]:
        """The objective's terms for the searched layers' first len(formats)
        choices (the rest FP32); cached by prefix."""
        full = formats + ("FP32",) * (len(self.layers) - len(formats))
        cached = self.cache.get(full)
        if cached is not None:
            return cached
        out = self._run(full)
        ref = self.reference
        m: Dict[str, float] = {}
        if self.objective == "reward":
            scores_q = torch.cat([o.reshape(-1) for o in out.logits]).numpy()
            scores_r = torch.cat([o.reshape(-1) for o in ref.logits]).numpy()
            rho = stats.spearman(scores_q, scores_r)
            m["spearman"] = 0.0 if math.isnan(rho) else rho
        elif self.objective == "update":
            denominator = float(out.grads.norm() * ref.grads.norm())
            m["grad_cosine"] = float(out.grads @ ref.grads) / denominator if denominator > 0 else 0.0
            m["loss_change"] = out.loss - ref.loss
        else:
            kl = tail = h_q = h_r = 0.0
            rows = 0
            for q, r in zip(out.logits, ref.logits):
                log_q = q.reshape(-1, q.shape[-1]).log_softmax(-1)
                log_r = r.reshape(-1, r.shape[-1]).log_softmax(-1)
                p_r, p_q = log_r.exp(), log_q.exp()
                kl += float((p_q * (log_q - log_r)).sum())           # KL(p_q ‖ p_ref)
                tail += float((p_r * (p_r > self.config.is_cap * p_q)).sum())
                h_q -= float((p_q * log_q).sum())
                h_r -= float((p_r * log_r).sum())
                rows += log_q.shape[0]
            m.update(kl=kl / rows, is_tail=tail / rows, entropy_change=(h_q - h_r) / rows,
                     ppl_change=math.exp(out.loss) / math.exp(ref.loss) - 1.0)
        self.cache[full] = m
        return m

    def reward(self, m: Dict[str, float], saved: float) -> float:
        c = self.config
        if self.objective == "lm":
            closeness = 2.0 / (1.0 + math.exp(min(60.0, c.ppl_sharpness * m["ppl_change"])))
            return (c.ppl_weight * closeness - c.kl_weight * m["kl"] -
                    c.entropy_weight * abs(m["entropy_change"]) + c.memory_weight * saved)
        if self.objective == "rollout":
            return -c.kl_weight * m["kl"] - c.tail_weight * m["is_tail"] + c.memory_weight * saved
        if self.objective == "reward":
            return m["spearman"] - 1.0 + c.memory_weight * saved
        return m["grad_cosine"] - 1.0 + c.memory_weight * saved


# --- the agent ----------------------------------------------------------------------------

class _Agent(nn.Module):
    def __init__(self, inputs: int, actions: int, hidden: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(),
                                  nn.Linear(hidden, hidden), nn.Tanh())
        self.policy = nn.Linear(hidden, actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, state: torch.Tensor, mask: torch.Tensor):
        h = self.body(state)
        logits = self.policy(h).masked_fill(~mask, -1e9)
        return torch.distributions.Categorical(logits=logits), self.value(h).squeeze(-1)


@dataclass
class _Step:
    state: torch.Tensor
    mask: torch.Tensor
    action: int
    log_prob: float
    value: float
    reward: float = 0.0


# --- the search ---------------------------------------------------------------------------

def _layer_features(session: OffloadSession, layers: Sequence[str], batches: List[Any],
                    forward: Optional[ForwardFn], loss: LossFn, objective: str,
                    phase: str) -> np.ndarray:
    """Per layer: weight mean and std, log gradient norm (one FP32 pass), share of
    parameters; z-scored across layers, the share kept as is."""
    weights = [session.layers[n].weight for n in layers]
    for n in layers:
        session.layers[n].format = "FP32"
    grads = [torch.zeros_like(w) for w in weights]
    model = session.model
    with _profile._eval_mode(model), torch.enable_grad(), session.client.phase(phase):
        for batch in batches:
            out = _profile._output_tensor(_profile._run(model, batch, forward))
            value = out.float().mean() if objective == "reward" else loss(out, batch)
            for g, p in zip(grads, torch.autograd.grad(value, weights, allow_unused=True)):
                if p is not None:
                    g += p
    sizes = np.array([w.numel() for w in weights], dtype=np.float64)
    raw = np.array([[float(w.detach().float().mean()), float(w.detach().float().std()),
                     math.log1p(float(g.norm()))] for w, g in zip(weights, grads)])
    spread = raw.std(axis=0)
    z = (raw - raw.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    return np.concatenate([z, (sizes / sizes.sum())[:, None]], axis=1)


def search(session: OffloadSession, batches: Iterable[Any], config: Optional[SearchConfig] = None,
           *, layers: Optional[Iterable[str]] = None, forward: Optional[ForwardFn] = None,
           loss: Optional[LossFn] = None, energy: Optional[energy_model.EnergyModel] = None,
           progress: bool = True) -> SearchResult:
    """Runs the search on an offloaded model (see the module's docstring) and
    returns the best assignment with its episodes. `batches`: calibration inputs
    as `mxserve.torch.profile.capture` takes them; `layers`: the layers to search
    (default all of the session's); `loss(output, batch)`: the language-model
    loss (default next-token cross entropy of token-id batches); `energy`: the
    FPGA model's parameters (default the repository's file, for budget_joules and
    the modelled joules). The layers' format pins are restored afterwards."""
    config = config or SearchConfig()
    config.validate()
    if not isinstance(session, OffloadSession):
        raise TypeError("search: expected an OffloadSession (mxserve.torch.offload)")
    formats = tuple(_wire.format_name(_wire.format_to_wire(f)) for f in config.formats)
    if "policy" in formats:
        raise ValueError("formats: name each format; 'policy' is not one")
    names = list(session.layers) if layers is None else \
        ([layers] if isinstance(layers, str) else list(layers))
    for n in names:
        if n not in session.layers:
            raise ValueError(f"layers: model '{session.model_name}' has no layer {n!r}")
    if not names:
        raise ValueError("layers: expected at least one layer to search")
    batches = list(batches)
    if not batches:
        raise ValueError("batches: expected at least one calibration batch")
    loss = loss or _next_token_loss
    params = energy or energy_model.load_energy_model()
    objective = config.resolved_objective()

    shapes = [(session.layers[n].out_features, session.layers[n].in_features) for n in names]
    elements = sum(n * k for n, k in shapes)
    bits = np.array([[energy_model.packed_bytes(f, n, k) * 8.0 for f in formats]
                     for n, k in shapes])
    joules = np.array([[energy_model.estimate_gemm(params, f, f, config.budget_tokens, n,
                                                   k).joules for f in formats]
                       for n, k in shapes])
    share = np.array([n * k for n, k in shapes], dtype=np.float64) / elements
    saved = np.array([[(16.0 - bits[i, a] / (n * k)) / 16.0 * share[i] for a in range(len(formats))]
                      for i, (n, k) in enumerate(shapes)])
    joules_limit, joules_name = config.budget_joules, "budget_joules"
    if config.relative_budget is not None:
        fp16 = sum(energy_model.estimate_gemm(params, "FP16", "FP16", config.budget_tokens, n,
                                              k).joules for n, k in shapes)
        relative = config.relative_budget * fp16
        if joules_limit is None or relative < joules_limit:
            joules_limit, joules_name = relative, "relative_budget"
    limits = [(bits, config.budget_bits * elements if config.budget_bits else None,
               "budget_bits", elements),
              (joules, joules_limit, joules_name, 1.0)]
    for table, limit, name, per in limits:
        if limit is not None and table.min(axis=1).sum() > limit * (1 + 1e-12):
            raise ValueError(f"{name}: the cheapest formats of {', '.join(formats)} need "
                             f"{table.min(axis=1).sum() / per:.4g}, more than {limit / per:.4g}")

    def open_actions(i: int, spent: Tuple[float, float]) -> torch.Tensor:
        ok = np.ones(len(formats), dtype=bool)
        for (table, limit, _, _), used in zip(limits, spent):
            if limit is not None:
                rest = table[i + 1:].min(axis=1).sum()
                ok &= used + table[i] + rest <= limit * (1 + 1e-12)
        return torch.from_numpy(ok)

    pins = {n: layer.format for n, layer in session.layers.items()}
    float_env = os.environ.get("MXSERVE_EMULATOR_FLOAT")
    os.environ["MXSERVE_EMULATOR_FLOAT"] = config.float_path
    started = time.monotonic()
    work_before = energy_model.work_counts(session.work())
    try:
        evaluator = _Evaluator(session, names, batches, config, forward, loss)
        features = torch.tensor(_layer_features(session, names, batches, forward, loss,
                                                objective, config.phase), dtype=torch.float32)
        state_size = features.shape[1] + 2 + len(formats) + 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            agent = _Agent(state_size, len(formats), config.hidden)
        optimizer = torch.optim.Adam(agent.parameters(), lr=config.learning_rate)
        sampler = torch.Generator().manual_seed(config.seed)

        def run_episode(greedy: bool) -> Tuple[Episode, List[_Step]]:
            chosen: List[int] = []
            steps: List[_Step] = []
            ema, spent = 0.0, (0.0, 0.0)
            for i in range(len(names)):
                previous = torch.zeros(len(formats) + 1)
                previous[chosen[-1] if chosen else len(formats)] = 1.0
                state = torch.cat([features[i], torch.tensor([i / len(names), ema]), previous])
                mask = open_actions(i, spent)
                if not bool(mask.any()):  # cannot happen with one budget; never pick blind
                    raise RuntimeError(f"search: no format of {', '.join(formats)} keeps layer "
                                       f"{names[i]!r} within the budget")
                with torch.no_grad():
                    dist, value = agent(state, mask)
                    action = int(dist.probs.argmax()) if greedy else \
                        int(torch.multinomial(dist.probs, 1, generator=sampler))
                chosen.append(action)
                spent = (spent[0] + bits[i, action], spent[1] + joules[i, action])
                m = evaluator.metrics(tuple(formats[a] for a in chosen))
                reward = evaluator.reward(m, float(saved[i, action]))
                ema = config.reward_ema * ema + (1 - config.reward_ema) * reward
                steps.append(_Step(state, mask, action, float(dist.log_prob(torch.tensor(action))),
                                   float(value), reward))
            rows = range(len(names))
            episode = Episode(tuple(formats[a] for a in chosen), tuple(s.reward for s in steps),
                              float(sum(bits[i, a] for i, a in zip(rows, chosen)) / elements),
                              float(sum(joules[i, a] for i, a in zip(rows, chosen))), greedy)
            return episode, steps

        episodes: List[Episode] = []
        batch: List[List[_Step]] = []
        for e in range(config.episodes):
            episode, steps = run_episode(greedy=False)
            episodes.append(episode)
            batch.append(steps)
            if len(batch) == config.episodes_per_update or e == config.episodes - 1:
                _ppo_update(agent, optimizer, batch, config)
                batch = []
            if progress:
                elapsed = time.monotonic() - started
                best = max(x.total for x in episodes)
                eta = elapsed / (e + 1) * (config.episodes - e - 1)
                print(f"search: episode {e + 1}/{config.episodes}, return {episode.total:.4g}, "
                      f"best {best:.4g}, {elapsed:.1f} s, ETA {eta:.0f} s", file=sys.stderr)
        greedy, _ = run_episode(greedy=True)
        episodes.append(greedy)
        best = max(episodes, key=lambda x: (x.total, x.greedy))
        final = evaluator.metrics(best.formats)
        spent = {key: count - work_before.get(key, 0)
                 for key, count in energy_model.work_counts(session.work()).items()}
        search_joules = sum(energy_model.phase_joules(
            {key: count for key, count in spent.items() if count > 0}, params).values())
        return SearchResult(config, tuple(names), best, episodes, time.monotonic() - started,
                            evaluator.evaluations, dict(final), search_joules)
    finally:
        for n, fmt in pins.items():
            session.layers[n].format = fmt
        if float_env is None:
            os.environ.pop("MXSERVE_EMULATOR_FLOAT", None)
        else:
            os.environ["MXSERVE_EMULATOR_FLOAT"] = float_env


def _ppo_update(agent: _Agent, optimizer: torch.optim.Optimizer, episodes: List[List[_Step]],
                config: SearchConfig) -> None:
    """Clipped PPO on finished episodes: returns-to-go (undiscounted), advantages
    against the value head, normalised over the batch."""
    steps = [s for episode in episodes for s in episode]
    returns = torch.tensor([sum(s.reward for s in episode[i:])
                            for episode in episodes for i in range(len(episode))])
    states = torch.stack([s.state for s in steps])
    masks = torch.stack([s.mask for s in steps])
    actions = torch.tensor([s.action for s in steps])
    old_log_probs = torch.tensor([s.log_prob for s in steps])
    advantages = returns - torch.tensor([s.value for s in steps])
    if len(steps) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    for _ in range(config.ppo_epochs):
        dist, values = agent(states, masks)
        ratio = (dist.log_prob(actions) - old_log_probs).exp()
        surrogate = torch.min(ratio * advantages,
                              ratio.clamp(1 - config.clip, 1 + config.clip) * advantages)
        loss = -surrogate.mean() + 0.5 * (values - returns).pow(2).mean() - \
            config.entropy_bonus * dist.entropy().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
