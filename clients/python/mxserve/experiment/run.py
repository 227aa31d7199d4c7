"""Running and evaluating the matrix: one seeded PPO-RLHF run per configuration,
seed and repetition, its held-out evaluation, and the driver `run_experiment`
that keeps each finished run in state/ and writes the report."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

import torch

from mxserve import stats
from mxserve.client import Client, MxserveError
from mxserve.experiment.config import (BASELINE_POLICY, FROZEN_DTYPES, ConfigError, Configuration,
                                       Experiment)
from mxserve.experiment.report import UNTRAINED, energy_ranges, phase_sum, write_outputs
from mxserve.experiment.state import RunState
from mxserve.rlhf import tasks
from mxserve.rlhf.machine import describe_machine, source_commit
from mxserve.rlhf.tasks import Task
from mxserve.rlhf.trainer import (PHASES, PolicyWithValue, PPOTrainer, generate, left_pad,
                                  limit_vocab)
from mxserve.torch import COMPUTE_MODES, offload

__all__ = ["Progress", "RunResult", "build_task", "check_compute", "describe", "exact_kl",
           "run_experiment"]


# --- progress ----------------------------------------------------------------------------


class Progress:
    """One status line on stderr: redrawn in place on a terminal, one line per
    message otherwise (CI logs)."""

    def __init__(self, enabled: bool = True, stream=sys.stderr):
        self.enabled, self.stream = enabled, stream
        self.tty = enabled and stream.isatty()
        self._open = False

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K" + message)
            self._open = True
        else:
            self.stream.write(message + "\n")
        self.stream.flush()

    def bar(self, done: int, total: int, message: str) -> None:
        width = 20
        filled = width * done // max(total, 1)
        self(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {message}")

    def done(self, message: str = "") -> None:
        if self.tty and self._open:
            self.stream.write("\n")
            self._open = False
        if message:
            self(message)
            if self.tty:
                self.stream.write("\n")
                self._open = False


# --- one run -----------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    configuration: str
    policy: str
    seed: int
    repetition: int
    run_tag: str
    where: str                                     # "mxserved", "emulated:cuda" or "local:cuda"
    wall_seconds: Dict[str, float]
    totals: Dict[str, Dict[str, float]]            # phase → daemon ExecutionInfo sums
    energy: Dict[str, Dict[str, float]]            # phase → source → joules
    busy_seconds: Dict[str, Dict[str, float]]      # phase → source → seconds
    curves: List[Dict[str, float]]
    kind: str = "trained"                          # "trained", "untrained" or "local"
    held_out_reward: float = float("nan")
    win_rate: float = float("nan")                 # against FP16 of the same seed
    kl_vs_fp16: float = float("nan")
    reward_spearman: float = float("nan")
    backend: str = ""                              # the daemon's, from ExecutionInfo
    # Per held-out prompt, in order (the statistics resample these):
    judge_scores: List[float] = dataclasses.field(default_factory=list)  # judge (FP16 RM)
    reward_scores: List[float] = dataclasses.field(default_factory=list)  # its own RM formats
    kls: List[float] = dataclasses.field(default_factory=list)  # KL(π_q ‖ π_FP16), same seed
    # An FP16 baseline of a later seed, judged against the previous seed's baseline
    # (the noise floor): that seed and the per-prompt KL against it.
    noise_vs_seed: Optional[int] = None
    noise_kls: List[float] = dataclasses.field(default_factory=list)
    energy_label: str = ""                         # "measured" / "replayed" for a local run
    # A local run's meter: idle power before the run, and whether the phase joules
    # came from an energy counter (else from integrated power samples).
    idle_watts: Optional[float] = None
    energy_counter: Optional[bool] = None
    # With a counter: how well its intervals are dated (the widest clock bracket
    # around a read, EnergyMeter.max_read_seconds) and how many each phase got.
    counter_read_max_seconds: Optional[float] = None
    counter_intervals: Dict[str, int] = dataclasses.field(default_factory=dict)
    work: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # the GEMMs it ran
    examples: List[Dict[str, str]] = dataclasses.field(default_factory=list)


def _energy_for_run(client: Client, run: str):
    """The run's own energy report as {phase: {source: joules}} and {phase:
    {source: busy seconds}}."""
    report = client.energy_report(run=run)
    energy = {p: {e.source: e.joules for e in report.entries if e.phase == p} for p in PHASES}
    busy = {p: {e.source: e.busy_seconds for e in report.entries if e.phase == p} for p in PHASES}
    return energy, busy


def _prompt_batches(prompts: List[List[int]], batch_size: int, seed: int):
    """An endless, seeded stream of prompt batches (reshuffled every pass)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield from tasks.shuffled_batches(prompts, batch_size, generator)


class _Judges:
    """The daemon-side models every configuration is measured against: the reward
    model in FP16 (the judge, order-insensitive: it scores each response alone) and
    the trained FP16 baseline policy of the seed being run (for KL). One baseline is
    held at a time: the runner goes seed by seed, the baseline first."""

    def __init__(self, client: Client, task: Task, prefix: str, run: str,
                 compute: str = "daemon", device: str = "cpu"):
        self.client, self.run = client, run
        self.compute, self.device = compute, torch.device(device)
        # The trained baseline stays FP32 whatever task.frozen_dtype says: its PPO
        # updates are small enough that BF16 rounding would blur them.
        self.dtype = torch.float32
        self.reward = task.new_reward().to(self.device)
        self.reward_session = offload(self.reward, client, f"{prefix}.judge",
                                      policy=BASELINE_POLICY, replace=True, compute=compute)
        self.baseline_policy = None
        self.baseline_session = None
        self.baseline_key: Optional[Tuple[int, int]] = None  # (seed, repetition)
        self.prefix = prefix

    def set_baseline(self, policy_lm, key: Tuple[int, int]) -> None:
        if self.baseline_session is not None:
            self.baseline_session.restore()
        self.baseline_policy = policy_lm.to(self.device, self.dtype)
        self.baseline_session = offload(self.baseline_policy, self.client,
                                        f"{self.prefix}.baseline", policy=BASELINE_POLICY,
                                        replace=True, compute=self.compute)
        self.baseline_key = key

    @torch.no_grad()
    def score(self, ids, mask) -> torch.Tensor:
        with self.client.phase("reward"), self.client.run(self.run):
            return self.reward(ids.to(self.device), mask.to(self.device)).float()

    @torch.no_grad()
    def baseline_logits(self, ids, mask) -> torch.Tensor:
        with self.client.phase("rollout"), self.client.run(self.run):
            return self.baseline_policy(ids.to(self.device),
                                        attention_mask=mask.to(self.device)).logits.float()

    def close(self) -> None:
        for session in (self.reward_session, self.baseline_session):
            if session is not None:
                session.restore()


def exact_kl(log_q: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(q ‖ b) per position, exactly over the vocabulary (no sampling estimator):
    Σ_v q(v)·(log q(v) − log b(v)), from log-probabilities [..., V]; tokens q gives
    probability 0 contribute 0 (ids outside a tokenizer's vocabulary)."""
    q = log_q.exp()
    return torch.where(q > 0, q * (log_q - log_b), torch.zeros_like(q)).sum(-1)


def _evaluate(trainer: PPOTrainer, judges: _Judges, task: Task, experiment: Experiment,
              eval_run: str, result: RunResult, kl_against_baseline: bool = True) -> None:
    """Per held-out prompt: the judge's score, the configuration's own reward score
    and, when `kl_against_baseline`, KL(π_q ‖ π_FP16) against the baseline the
    judges hold, summed over the response's tokens. The aggregates (win rate, ρ,
    intervals) are computed across seeds by `experiment_report`."""
    prompts = task.test_prompts[:experiment.eval_prompts]
    generator = torch.Generator().manual_seed(experiment.eval_seed)
    trainer.run, training_run = eval_run, trainer.run  # evaluation is not the run's energy
    judge_scores: List[float] = []
    config_scores: List[float] = []
    kls: List[float] = []
    try:
        bs = experiment.eval_batch_size or experiment.ppo.batch_size
        for start in range(0, len(prompts), bs):
            rollout = trainer.rollout(prompts[start:start + bs], keep_logits=True,
                                      generator=generator)
            ids, mask = rollout.ids.cpu(), rollout.mask.cpu()
            judge_scores += judges.score(ids, mask).tolist()
            config_scores += trainer.score(rollout.ids, rollout.mask).cpu().tolist()
            width = rollout.prompt_width
            if kl_against_baseline:
                # π_FP16 on the same tokens: the logits predicting each response token,
                # over the vocabulary the rollout could sample from (as π_q's are),
                # both at the sampling temperature's softmax.
                base = limit_vocab(judges.baseline_logits(ids, mask)[:, width - 1:-1],
                                   task.vocab_limit)
                t = experiment.ppo.temperature
                per_token = exact_kl(
                    torch.log_softmax(rollout.logits.to(base.device).float() / t, -1),
                    torch.log_softmax(base / t, -1))
                kls += (per_token * rollout.response_mask.to(base.device)).sum(1).tolist()
            responses = rollout.responses()
            for row in range(min(3 - len(result.examples), ids.shape[0])):
                prompt = ids[row, :width][mask[row, :width].bool()].tolist()
                result.examples.append({"prompt": task.decode(prompt),
                                        "response": task.decode(responses[row]),
                                        "judge_score": f"{judge_scores[start + row]:.4f}"})
    finally:
        trainer.run = training_run
    result.judge_scores = judge_scores
    result.reward_scores = config_scores
    result.held_out_reward = sum(judge_scores) / len(judge_scores)
    if kl_against_baseline:
        result.kls = kls
        result.kl_vs_fp16 = sum(kls) / len(kls)
    result.reward_spearman = stats.spearman(config_scores, judge_scores) if len(judge_scores) > 1 \
        else float("nan")


def _model_device(device: str, compute: str) -> str:
    """Where the trainers' and judges' models live: `device` when the emulator
    computes their layers here, else the CPU (the daemon computes them)."""
    return device if compute == "local" else "cpu"


def _run_one(client: Client, task: Task, experiment: Experiment, configuration: Configuration,
             seed: int, repetition: int, run_tag: str, progress: Progress, label: str,
             local_device: Optional[str] = None, sampler_factory=None,
             steps: Optional[int] = None, compute: str = "daemon",
             device: str = "cpu") -> Tuple[RunResult, PPOTrainer]:
    """Trains one configuration through the daemon (its linears computed there, or
    with `compute` "local" here on `device` with the daemon's numerics), or with
    `local_device` natively here (the measured baseline); the energy is read from the
    daemon for `run_tag` either way. `steps=0` trains nothing (the untrained row)."""
    steps = experiment.steps if steps is None else steps
    torch.manual_seed(seed)
    policy_lm, reward = task.new_policy(), task.new_reward()
    device = local_device or _model_device(device, compute)
    frozen = None if task.frozen_dtype == torch.float32 else task.frozen_dtype
    trainer = PPOTrainer(None if local_device else client, policy_lm, reward, experiment.ppo,
                         policy=configuration.policy_name, run=run_tag,
                         name_prefix=f"{run_tag.split('/')[0]}.{configuration.name}",
                         eos_id=task.eos_id, pad_id=task.pad_id, seed=seed, device=device,
                         vocab_limit=task.vocab_limit, compute=compute, frozen_dtype=frozen)
    sampler = None
    try:
        if sampler_factory is not None:
            sampler = sampler_factory(lambda: trainer.current_phase)
            # The trainer's phase switches are the meter's boundaries (counter reads).
            trainer.phase_hook = getattr(sampler, "boundary", None)
            sampler.start()
        curves = []
        batches = _prompt_batches(task.train_prompts, experiment.ppo.batch_size, seed)
        for step in range(1, steps + 1):
            metrics = trainer.step(next(batches))
            metrics["step"] = step
            curves.append(metrics)
            progress.bar(step, steps, f"{label}: reward "
                         f"{metrics['objective/scores']:+.3f} kl {metrics['objective/kl']:.4f}")
        wall = dict(trainer.wall)
    finally:
        if sampler is not None:
            sampler.stop()
    totals = {phase: dataclasses.asdict(t) for phase, t in trainer.totals().items()}
    # Read only after the sampler stopped: the power stream ends with the run.
    energy, busy = _energy_for_run(client, run_tag)
    result = RunResult(configuration=configuration.name, policy=configuration.label,
                       seed=seed, repetition=repetition, run_tag=run_tag,
                       where=(f"local:{local_device}" if local_device else
                              f"emulated:{device}" if compute == "local" else "mxserved"),
                       wall_seconds=wall, totals=totals, energy=energy, busy_seconds=busy,
                       curves=curves)
    result.work = trainer.work(run_tag) if trainer.sessions else []
    if sampler is not None:
        result.idle_watts = getattr(sampler, "idle_watts", None)
        result.energy_counter = getattr(sampler, "has_counter", None)
        if result.energy_counter:
            result.counter_read_max_seconds = sampler.max_read_seconds
            result.counter_intervals = dict(collections.Counter(p for p, *_ in sampler.intervals))
    if trainer.sessions:
        info = next(iter(trainer.sessions["policy"].layers.values())).last_info
        result.backend = info.backend if info is not None else ""
    return result, trainer


# --- preparing the matrix ----------------------------------------------------------------


def _check_policies(client: Client, experiment: Experiment, prefix: str) -> None:
    """Checks every named policy exists and puts the inline ones: before the task
    is built, so a typo costs seconds, not a training run."""
    known = {p.name for p in client.list_policies()}
    for index, c in enumerate(experiment.configurations):
        if isinstance(c.policy, str):
            if c.policy not in known:
                raise ConfigError(f"configurations[{index}] ({c.name}).policy: the daemon has "
                                  f"no policy {c.policy!r} (it has: {', '.join(sorted(known))})")
            c.policy_name = c.policy
        elif isinstance(c.policy, Mapping):
            document = dict(c.policy)
            document["name"] = f"{prefix}.{c.name}"
            document.setdefault("description", f"experiment {experiment.name}: {c.name}")
            try:
                c.policy_name = client.put_policy(document).name
            except MxserveError as error:
                raise ConfigError(f"configurations[{index}] ({c.name}).policy: the daemon "
                                  f"refused it: {error.message}") from None


def _generate_policies(client: Client, experiment: Experiment, task: Task, prefix: str,
                       progress: Progress) -> Optional[Dict[str, Any]]:
    """Generates the `generate` configurations' policies: the daemon's kinds from a
    sensitivity profile of the initial policy (calibrated on its own samples, with
    Fisher gradients), kind "rl" by mxserve.torch.search on the same samples."""
    generated = [c for c in experiment.configurations
                 if c.generate is not None and c.generate.get("kind") != "rl"]
    searched = [c for c in experiment.configurations
                if c.generate is not None and c.generate.get("kind") == "rl"]
    if not generated and not searched:
        return None
    info: Dict[str, Any] = {}
    if searched:
        info["search"] = _search_policies(client, experiment, task, prefix, searched, progress)
    if not generated:
        return info
    from mxserve.torch import profile as mxprofile

    progress(f"profiling the policy model for {len(generated)} generated policies")
    # Profiled as the trainer offloads it (PolicyWithValue: layers "lm.…"), so the
    # generated rules name the very layers the policy, reference and reward models
    # register; the value head is left out (it is not part of the LM's output).
    # Always on the daemon, whatever `compute` says: ProfileModel measures each
    # layer's error with the weights the daemon holds, so they are uploaded.
    model = PolicyWithValue(task.new_policy())
    session = offload(model, client, f"{prefix}.profile", replace=True)
    try:
        with session.local():
            batches = _calibration_rollouts(experiment, task, model)
        layers = [name for name in session.layers if name != "value_head"]
        captured = mxprofile.capture(session, batches, logits=True, layers=layers,
                                     forward=lambda m, b: m(b[0], b[1])[0])
        prof = mxprofile.profile(client, session, captured,
                                 formats=["MXFP4", "MXFP6", "MXFP8", "INT8", "FP16"])
        for index, c in enumerate(experiment.configurations):
            if c.generate is None or c.generate.get("kind") == "rl":
                continue
            spec = dict(c.generate)
            kind = spec.pop("kind", "fraction")
            name = f"{prefix}.{c.name}"
            try:
                made = client.generate_policy(session.model_name, name, kind, **spec,
                                              description=f"experiment {experiment.name}: {c.name}")
            except MxserveError as error:
                raise ConfigError(f"configurations[{index}] ({c.name}).generate: the daemon "
                                  f"refused it: {error.message}") from None
            except (TypeError, ValueError) as error:
                raise ConfigError(f"configurations[{index}] ({c.name}).generate: {error}") from None
            c.policy_name = made.policy.name
        return {**info, "profile_source": prof.source, "profile_tokens": prof.tokens,
                "profile_formats": list(prof.formats)}
    finally:
        session.restore()


def _calibration_rollouts(experiment: Experiment, task: Task, model: PolicyWithValue) -> List[Any]:
    """(ids, mask) batches of the initial policy's own samples on the first training
    prompts: what profiles and searches calibrate on."""
    rows = task.train_prompts[:experiment.ppo.batch_size * experiment.profile_batches]
    batches = []
    generator = torch.Generator().manual_seed(experiment.eval_seed)
    with torch.no_grad():
        for start in range(0, len(rows), experiment.ppo.batch_size):
            ids, mask = (t.to(model.value_head.weight.device) for t in
                         left_pad(rows[start:start + experiment.ppo.batch_size], task.pad_id))
            rollout = generate(model.lm, ids, mask, experiment.ppo.response_length,
                               experiment.ppo.temperature, task.eos_id, task.pad_id, generator,
                               vocab_limit=task.vocab_limit)
            batches.append((rollout.ids, rollout.mask))
    return batches


def _masked_next_token_loss(logits: torch.Tensor, batch: Any) -> torch.Tensor:
    """Mean next-token cross entropy over the real tokens of an (ids, mask) batch."""
    ids, mask = batch
    per_token = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1),
        reduction="none")
    weights = (mask[:, 1:] * mask[:, :-1]).reshape(-1).float()
    return (per_token * weights).sum() / weights.sum().clamp(min=1.0)


def _search_phase(client: Client, experiment: Experiment, task: Task, prefix: str,
                  spec: Mapping[str, Any], phase: str, seeds: range, progress: Progress,
                  name: str) -> list:
    """mxserve.torch.search of `phase` once per seed, on the local emulator: the
    policy model for rollout and update, the reward model for reward. The model,
    its calibration rollouts and the offload session are made once and shared by
    the seeds (a search restores the layers' pins when it ends)."""
    from mxserve.torch import search as mxsearch

    policy_model = PolicyWithValue(task.new_policy())
    if phase == "reward":
        model, forward, loss = task.new_reward(), None, None
    else:
        model = policy_model
        forward = lambda m, b: m(b[0], b[1])[0]  # noqa: E731 (the logits)
        loss = _masked_next_token_loss
    batches = _calibration_rollouts(experiment, task, policy_model)
    session = offload(model, client, f"{prefix}.search", replace=True, compute="local")
    try:
        layers = [n for n in session.layers if n != "value_head"]
        results = []
        for seed in seeds:
            progress(f"searching {name}'s {phase} formats (mxserve.torch.search, seed {seed})")
            config = mxsearch.SearchConfig(
                phase=phase, formats=spec.get("candidates", mxsearch.DEFAULT_FORMATS),
                episodes=spec.get("episodes", 24), seed=seed,
                relative_budget=spec.get("relative_budget"), budget_bits=spec.get("budget_bits"),
                budget_joules=spec.get("budget_joules"))
            results.append(mxsearch.search(session, batches, config, layers=layers,
                                           forward=forward, loss=loss, progress=False))
        return results
    finally:
        session.restore()


def _search_summary(result) -> Dict[str, Any]:
    return {"seed": result.config.seed, "seconds": round(result.seconds, 3),
            "evaluations": result.evaluations, "episodes": len(result.episodes),
            "search_joules_modelled": result.search_joules, "best_return": result.best.total,
            "bits_per_weight": result.best.bits_per_weight,
            "modelled_joules": result.best.joules, **result.final_metrics}


def _search_policies(client: Client, experiment: Experiment, task: Task, prefix: str,
                     configurations: List[Configuration], progress: Progress) -> Dict[str, Any]:
    """Kind "rl": one mxserve.torch.search per configuration and phase, on the local
    emulator (the policy model for rollout and update, the reward model for
    reward), its answers joined into one policy with `high` on the phases not
    searched. With search_seeds > 1 each phase is searched once per seed and the
    best return kept; every seed's result and the spread of the returns go to
    the summary. Returns each search's cost and result for the summary."""
    costs: Dict[str, Any] = {}
    for c in configurations:
        spec = dict(c.generate)
        phases = spec.get("phases") or ["rollout"]
        high = spec.get("high", "FP16")
        rules, runs = [], {}
        for phase in phases:
            seeds = range(spec.get("seed", 0), spec.get("seed", 0) + spec.get("search_seeds", 1))
            tried = _search_phase(client, experiment, task, prefix, spec, phase, seeds, progress,
                                  c.name)
            best = max(tried, key=lambda r: r.best.total)  # the search's own objective
            rules += best.policy("x")["rules"]
            runs[phase] = _search_summary(best)
            if len(tried) > 1:
                returns = np.array([r.best.total for r in tried])
                runs[phase]["seeds"] = [_search_summary(r) for r in tried]
                runs[phase]["best_return_spread"] = {
                    "mean": float(returns.mean()), "std": float(returns.std(ddof=1)),
                    "min": float(returns.min()), "max": float(returns.max())}
        name = f"{prefix}.{c.name}"
        description = (f"experiment {experiment.name}: {c.name}, RL-searched "
                       f"(mxserve.torch.search) for {', '.join(phases)}: " +
                       "; ".join(f"{p} {r['episodes']} episodes, seed {r['seed']}, "
                                 f"{r['seconds']} s" for p, r in runs.items()))
        client.put_policy({"name": name, "description": description,
                           "defaults": {p: high for p in PHASES}, "rules": rules})
        c.policy_name = name
        costs[c.name] = runs
    return costs


def build_task(spec: Mapping[str, Any], progress: Progress) -> Task:
    spec = dict(spec)
    kind = spec.pop("kind")
    frozen = FROZEN_DTYPES[spec.pop("frozen_dtype", "fp32")]
    if kind == "synthetic":
        task = tasks.synthetic_task(progress=progress, **spec)
    else:
        task = tasks.hh_rlhf_task(progress=progress, **spec)
    return task if frozen == torch.float32 else task.hold_in(frozen)


# --- the driver --------------------------------------------------------------------------


def check_compute(device: str, compute: str) -> None:
    if compute not in COMPUTE_MODES:
        raise ConfigError(f"--compute: expected one of {', '.join(COMPUTE_MODES)}, got {compute!r}")
    if device.startswith("cuda") and compute == "daemon":
        raise ConfigError("--device cuda with --compute daemon: the daemon computes on its own "
                          "machine, so nothing would train on this GPU; use --compute local "
                          "(the default with --device cuda)")


def describe(experiment: Experiment, device: str, compute: str,
             power_source: Optional[str]) -> Dict[str, Any]:
    """What makes two runs the same experiment (a resumed run must match it)."""
    return {"name": experiment.name, "task": experiment.task,
            "ppo": dataclasses.asdict(experiment.ppo), "steps": experiment.steps,
            "seeds": experiment.seeds, "repetitions": experiment.repetitions,
            "configurations": [[c.name, c.policy, c.generate] for c in experiment.configurations],
            "profile_batches": experiment.profile_batches, "eval": [
                experiment.eval_prompts, experiment.eval_seed, experiment.eval_batch_size],
            "device": device, "compute": compute, "power_source": power_source}


def run_experiment(client: Client, experiment: Experiment, out: str, *,
                   progress: Optional[Progress] = None, device: str = "cpu",
                   power_source: Optional[str] = None, task: Optional[Task] = None,
                   compute: str = "daemon", resume: bool = False, overwrite: bool = False,
                   on_job_done: Optional[Callable[[int, RunResult], None]] = None
                   ) -> Dict[str, Any]:
    """Runs the whole matrix and writes the outputs; returns the summary.

    Every finished job is kept under out/state/ (`mxserve.experiment.state`); with
    `resume` a run of the same experiment continues at its next unfinished job, with
    `overwrite` it starts over, and with neither a non-empty `out` is refused
    (ResumeError). `on_job_done(index, result)` is called after each job is saved."""
    progress = progress or Progress(False)
    check_compute(device, compute)
    started = time.time()
    state = RunState(out, describe(experiment, device, compute, power_source))
    saved = state.open(resume, overwrite)
    tag = saved["tag"] if saved else f"{experiment.name}-{os.urandom(3).hex()}"
    client.wait_ready()
    # The run's own names: daemon models and policies, so concurrent experiments
    # (even of the same name) never touch each other's.
    _check_policies(client, experiment, tag)
    try:
        if task is None:
            progress(f"building the task ({experiment.task['kind']})")
            task = build_task(experiment.task, progress)
        if saved:
            # The policies as they were, generated ones included: no second profile.
            progress(f"resuming {out}: run tag {tag}")
            for c in experiment.configurations:
                entry = saved["policies"][c.name]
                if entry["name"].startswith(tag + "."):
                    client.put_policy(entry["document"])
                c.policy_name = entry["name"]
            profile_info = saved["profile_info"]
        else:
            profile_info = _generate_policies(client, experiment, task, tag, progress) or {}
        policies = {c.name: client.get_policy(c.policy_name).document
                    for c in experiment.configurations}
        if not saved:
            state.start(tag, {c.name: {"name": c.policy_name, "document": policies[c.name]}
                              for c in experiment.configurations}, profile_info)
        runs = _run_matrix(client, experiment, task, tag, progress, device, power_source,
                           compute, state, on_job_done)
    finally:
        for c in experiment.configurations:
            if c.policy_name.startswith(tag + "."):
                with contextlib.suppress(MxserveError):
                    client.delete_policy(c.policy_name)
    info = {"backend": next((r.backend for r in runs if r.backend), "?"),
            "machine": describe_machine(device), "commit": source_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "run_tag": tag, "duration_s": time.time() - started, "device": device,
            "compute": compute, "frozen_dtype": str(task.frozen_dtype).removeprefix("torch."),
            "resumed": bool(saved), "policies": policies, **profile_info}
    baseline = next(c.name for c in experiment.configurations if c.is_baseline)
    summary = write_outputs(out, experiment, task, runs, info, baseline,
                            energy_ranges=energy_ranges(runs, baseline))
    state.finish()
    return summary


def _jobs(experiment: Experiment, device: str, local_baseline: bool):
    """(configuration, seed, repetition, kind) in run order: seed by seed, each
    seed's FP16 baseline first (every other run of the seed is judged against it),
    then the untrained policy, then the rest; the locally run baseline (GPU, or a
    replayed trace) once, after the first seed's baseline."""
    baseline = next(c for c in experiment.configurations if c.is_baseline)
    others = [c for c in experiment.configurations if not c.is_baseline]
    untrained = dataclasses.replace(baseline, name=UNTRAINED)
    jobs = []
    for seed in experiment.seeds:
        for repetition in range(experiment.repetitions):
            jobs.append((baseline, seed, repetition, "trained"))
            if local_baseline and len(jobs) == 1:
                jobs.append((dataclasses.replace(baseline, name=f"FP16-{device.split(':')[0]}"),
                             seed, repetition, "local"))
            jobs.append((untrained, seed, repetition, "untrained"))
            jobs += [(c, seed, repetition, "trained") for c in others]
    return jobs


def _eta(started: float, done: int, total: int) -> str:
    if done == 0:
        return ""
    remaining = (time.time() - started) / done * (total - done)
    return f", ETA {int(remaining // 60)} min {int(remaining % 60):02d} s"


def _run_matrix(client: Client, experiment: Experiment, task: Task, tag: str,
                progress: Progress, device: str, power_source: Optional[str],
                compute: str = "daemon", state: Optional[RunState] = None,
                on_job_done: Optional[Callable[[int, RunResult], None]] = None
                ) -> List[RunResult]:
    eval_run = f"{tag}/eval"
    judges = _Judges(client, task, tag, eval_run, compute, _model_device(device, compute))
    runs: List[RunResult] = []
    baseline_judge: Dict[Tuple[int, int], List[float]] = {}  # (seed, repetition) → scores
    jobs = _jobs(experiment, device, device != "cpu" or bool(power_source))
    started = time.time()
    latest_baseline: Optional[Tuple[int, int]] = None  # of the jobs found finished
    ran = 0  # jobs run by this process (the ETA's rate)
    try:
        for index, (configuration, seed, repetition, kind) in enumerate(jobs, 1):
            label = f"[{index}/{len(jobs)}] {configuration.name} seed {seed}"
            is_baseline = configuration.is_baseline and kind == "trained"
            finished = state.finished(index) if state is not None else None
            if finished is not None:
                result = RunResult(**finished)
                runs.append(result)
                if is_baseline:
                    baseline_judge[(seed, repetition)] = result.judge_scores
                    latest_baseline = (seed, repetition)
                progress(f"{label}: kept from the interrupted run")
                continue
            if latest_baseline is not None and judges.baseline_key != latest_baseline:
                # Resuming: the judges hold the latest finished baseline, as they did.
                judges.set_baseline(state.load_baseline(
                    task.new_policy().to(judges.dtype), latest_baseline), latest_baseline)
            run_tag = f"{tag}/{configuration.name}/s{seed}r{repetition}"
            local = kind == "local"
            sampler_factory = _sampler_factory(client, power_source, device, run_tag) \
                if local else None
            result, trainer = _run_one(client, task, experiment, configuration, seed, repetition,
                                       run_tag, progress, label,
                                       local_device=device if local else None,
                                       sampler_factory=sampler_factory,
                                       steps=0 if kind == "untrained" else None,
                                       compute=compute, device=device)
            result.kind = kind
            if local:
                result.energy_label = "replayed" if (power_source or "").startswith("replay:") \
                    else "measured"
            try:
                previous = judges.baseline_key
                # A later seed's baseline is first judged against the previous seed's:
                # that is the noise floor. Then it becomes the baseline of its seed.
                _evaluate(trainer, judges, task, experiment, eval_run, result,
                          kl_against_baseline=not is_baseline or previous is not None)
                if is_baseline:
                    if previous is not None:
                        result.noise_vs_seed, result.noise_kls = previous[0], result.kls
                    judges.set_baseline(trainer.policy_copy(), (seed, repetition))
                    if state is not None:
                        state.save_baseline(judges.baseline_policy, (seed, repetition))
                    latest_baseline = (seed, repetition)
                    baseline_judge[(seed, repetition)] = result.judge_scores
                    result.kls = [0.0] * len(result.judge_scores)  # itself, by definition
                    result.kl_vs_fp16 = 0.0
                result.win_rate = float(stats.outcomes(
                    result.judge_scores, baseline_judge[(seed, repetition)]).mean())
            finally:
                trainer.close()
            runs.append(result)
            ran += 1
            if state is not None:
                state.save_run(index, dataclasses.asdict(result))
            progress.done(f"{label}: held-out reward {result.held_out_reward:+.3f}, win rate "
                          f"{result.win_rate:.3f}, KL {result.kl_vs_fp16:.4f}, "
                          f"{phase_sum(result.energy, 'fpga_model'):.4g} J (FPGA model)"
                          f"{_eta(started, ran, ran + len(jobs) - index)}")
            if on_job_done is not None:
                on_job_done(index, result)
    finally:
        judges.close()
    return runs


def _sampler_factory(client: Client, power_source: Optional[str], device: str, run_tag: str):
    """Energy of the locally run baseline, under its run tag: gpu_baseline.EnergyMeter,
    so that with an NVML energy counter each trainer phase's joules are the counter's
    (source gpu_baseline) and the samples go to gpu_baseline_sampled; without one the
    samples are gpu_baseline, as before."""
    if power_source is None:
        return None
    from mxserve.rlhf.gpu_baseline import SOURCE, EnergyMeter
    from mxserve.rlhf.power import open_power_source

    def synchronize():
        torch.cuda.synchronize(torch.device(device))

    def make(current_phase):
        power = open_power_source(power_source)
        return EnergyMeter(client, power, device if device != "cpu" else "replay", run_tag,
                           synchronize=synchronize if device.startswith("cuda") else None,
                           source=SOURCE, phase=current_phase())
    return make
