"""The experiment: seeded PPO-RLHF once per configuration of a policy matrix, with
quality and energy per phase, in one command.

    python3 -m mxserve.experiment --server 127.0.0.1:50051 --quick --out results/
    python3 -m mxserve.experiment --server 127.0.0.1:50051 --config matrix.toml --out results/

Each configuration names a daemon policy (a built-in preset, a policy given inline,
or one generated from a sensitivity profile of the policy model) and runs the same
seeded PPO (`mxserve.rlhf`) with every linear layer on mxserved in its phase. Its
requests carry a run tag of their own, so the energy read back belongs to that run
alone. Then, on held-out prompts:

- held-out reward: the mean score of its responses by the reward model in FP16
  (the judge, the same for every configuration);
- win rate against the FP16 baseline: per prompt, the judge prefers this
  configuration's response to the baseline's (ties count half);
- KL(π_q ‖ π_FP16): per response, Σ over its tokens of the exact KL between the
  trained policy's next-token distribution in its rollout formats and the trained
  FP16 baseline's, on the same tokens; averaged over responses;
- reward Spearman ρ: the reward model's scores of the same responses in the
  configuration's reward formats against the judge's.

Outputs in --out: results.csv (one row per configuration), runs.csv (one per run),
summary.json (everything, training curves included), pareto.png, curves.png and
report.md. Energy is the FPGA model's estimate in emulation, the board's
measurement on F2, and the GPU's measured power for the `--device cuda` baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from mxserve import _wire, tasks
from mxserve.client import Client, MxserveError
from mxserve.machine import cpu_model
from mxserve.rlhf import (PHASES, PolicyWithValue, PPOConfig, PPOTrainer, generate, left_pad,
                          limit_vocab)
from mxserve.tasks import Task
from mxserve.torch import offload
from mxserve.types import PROFILE_SCORES

__all__ = ["ConfigError", "Configuration", "Experiment", "load_config", "main", "run_experiment"]

BASELINE_POLICY = "fp16-baseline"
# Short enough that a run tag "{name}-{6 hex}/{configuration}/s{seed}r{repetition}"
# stays within the daemon's 64 characters.
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,16}$")
_CONFIG_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,24}$")


class ConfigError(ValueError):
    """The experiment's configuration is wrong; raised before any training."""


# --- the matrix --------------------------------------------------------------------------

# ../shared/ORIGIN.md's two formulations. The first (INT8 on a fraction of the layers,
# the most tolerant first, FP16 on the rest) is generated from a sensitivity profile;
# the second is the daemon's built-in MX presets. The last row is a generated policy
# of issue 16's budgeted kind: least sensitivity at half the all-FP16 energy.
DEFAULT_MATRIX: List[Dict[str, Any]] = [
    {"name": "FP16", "policy": BASELINE_POLICY},
    {"name": "INT8-uniform", "policy": {"defaults": {"rollout": "INT8", "reward": "INT8",
                                                     "update": "INT8"}}},
    {"name": "INT8-A", "generate": {"kind": "fraction", "low": "INT8", "high": "FP16",
                                    "fraction": {"rollout": 0.2, "reward": 0.2, "update": 0.0}}},
    {"name": "INT8-B", "generate": {"kind": "fraction", "low": "INT8", "high": "FP16",
                                    "fraction": {"rollout": 0.5, "reward": 0.5, "update": 0.0}}},
    {"name": "INT8-C", "generate": {"kind": "fraction", "low": "INT8", "high": "FP16",
                                    "fraction": {"rollout": 0.8, "reward": 0.8, "update": 0.0}}},
    {"name": "INT8-D", "generate": {"kind": "fraction", "low": "INT8", "high": "FP16",
                                    "fraction": {"rollout": 0.8, "reward": 0.5, "update": 0.2}}},
    {"name": "MX-A", "policy": "A-conservative"},
    {"name": "MX-B", "policy": "B-balanced"},
    {"name": "MX-C", "policy": "C-aggressive"},
    {"name": "MX-D", "policy": "D-phase-adaptive"},
    {"name": "MX-budget", "generate": {"kind": "budget", "candidates": ["MXFP4", "MXFP8", "FP16"],
                                       "high": "FP16", "metric": "energy",
                                       "relative_budget": 0.5}},
]

QUICK: Dict[str, Any] = {
    "name": "quick",
    "task": {"kind": "synthetic", "seed": 0, "n_train": 256, "n_test": 32},
    "ppo": {"steps": 8, "batch_size": 8, "response_length": 8, "learning_rate": 5e-4,
            "temperature": 1.0},
    "seeds": [0],
}

# Each task kind's keys and what they take: (type, least value) for numbers.
_COUNT, _SEED, _TEXT = (int, 1), (int, 0), (str, None)
_TASK_KEYS = {
    "synthetic": {"kind": _TEXT, "seed": _SEED, "n_train": _COUNT, "n_test": _COUNT,
                  "sft_steps": _COUNT, "reward_steps": _COUNT},
    "hh-rlhf": {"kind": _TEXT, "checkpoint": _TEXT, "data": _TEXT, "reward_checkpoint": _TEXT,
                "n_train": _COUNT, "n_test": _COUNT, "seed": _SEED, "max_prompt_tokens": _COUNT,
                "reward_steps": _COUNT},
}
_TOP_KEYS = {"name", "task", "ppo", "seeds", "repetitions", "configurations", "profile", "eval"}
_CONFIG_KEYS = {"name", "policy", "generate"}
_GENERATE_KEYS = {"kind", "low", "high", "fraction", "budget", "relative_budget", "tolerance",
                  "candidates", "metric", "score", "groups", "phases"}


@dataclasses.dataclass
class Configuration:
    name: str
    policy: Any = None                 # a policy name, or an inline policy document (dict)
    generate: Optional[Dict[str, Any]] = None
    policy_name: str = ""              # what the daemon calls it, once known

    @property
    def is_baseline(self) -> bool:
        return self.policy == BASELINE_POLICY

    @property
    def label(self) -> str:
        """The policy as the report names it: the daemon's name for a named one."""
        if isinstance(self.policy, str):
            return self.policy
        if self.generate is not None:
            spec = self.generate
            return f"generated {spec.get('kind', 'fraction')}"
        return "inline"


@dataclasses.dataclass
class Experiment:
    name: str
    task: Dict[str, Any]
    ppo: PPOConfig
    steps: int
    seeds: List[int]
    repetitions: int
    configurations: List[Configuration]
    profile_batches: int = 2
    eval_prompts: int = 32
    eval_seed: int = 1234


def _check_keys(where: str, mapping: Any, allowed: Iterable[str]) -> Dict[str, Any]:
    """`mapping` as a dict, when it is a table with only `allowed` keys."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a table/object, got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(allowed))})")
    return dict(mapping)


def _check_value(where: str, value: Any, kind: type, least: Optional[float] = None) -> Any:
    """`value` when it is a `kind` (an int is a float too; a bool is neither) and at
    least `least`."""
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value)
    if not ok or (least is not None and value < least):
        bound = f" >= {least}" if least is not None else ""
        raise ConfigError(f"{where}: expected {_KIND_NAMES[kind]}{bound}, got {value!r}")
    return value


_KIND_NAMES = {int: "an integer", float: "a finite number", bool: "true or false",
               str: "a string", list: "a list"}


def _check_generate(where: str, spec: Any) -> Dict[str, Any]:
    """A generated policy's recipe, checked here so a typo costs no training: the
    daemon checks the numbers against the profile later."""
    spec = _check_keys(where, spec, _GENERATE_KEYS)
    kind = spec.get("kind", "fraction")
    if kind not in ("fraction", "budget", "tolerance"):
        raise ConfigError(f"{where}.kind: expected fraction, budget or tolerance, got {kind!r}")
    for key in ("fraction", "budget", "relative_budget", "tolerance"):
        if key in spec:
            values = spec[key]
            if isinstance(values, Mapping):
                for phase, value in values.items():
                    _check_phase(f"{where}.{key}.{phase}", phase)
                    _check_value(f"{where}.{key}.{phase}", value, float, 0)
            else:
                _check_value(f"{where}.{key}", values, float, 0)
    for key in ("low", "high"):
        if key in spec:
            _check_format(f"{where}.{key}", spec[key])
    candidates = spec.get("candidates", [])
    if not isinstance(candidates, list):
        raise ConfigError(f"{where}.candidates: expected a list of formats, got {candidates!r}")
    for i, fmt in enumerate(candidates):
        _check_format(f"{where}.candidates[{i}]", fmt)
    for i, phase in enumerate(_check_value(f"{where}.phases", spec.get("phases", []), list)):
        _check_phase(f"{where}.phases[{i}]", phase)
    for i, glob in enumerate(_check_value(f"{where}.groups", spec.get("groups", []), list)):
        _check_value(f"{where}.groups[{i}]", glob, str)
    if spec.get("metric", "energy") not in ("energy", "time", "bits"):
        raise ConfigError(f"{where}.metric: expected energy, time or bits, got {spec['metric']!r}")
    if spec.get("score", "auto") not in PROFILE_SCORES:
        raise ConfigError(f"{where}.score: expected one of {', '.join(PROFILE_SCORES)}, "
                          f"got {spec['score']!r}")
    return spec


def _check_format(where: str, fmt: Any) -> None:
    try:
        _wire.format_to_wire(_check_value(where, fmt, str))
    except ValueError:
        raise ConfigError(f"{where}: expected a format ({', '.join(_wire.FORMATS)}), "
                          f"got {fmt!r}") from None


def _check_phase(where: str, phase: Any) -> None:
    if phase not in PHASES:
        raise ConfigError(f"{where}: expected a phase ({', '.join(PHASES)}), got {phase!r}")


def _check_seeds(where: str, seeds: Any) -> List[int]:
    """Seeds as the config and --seeds take them: a non-empty list of integers in
    [0, 10^6)."""
    if not isinstance(seeds, list) or not seeds or \
            not all(isinstance(s, int) and 0 <= s < 10**6 for s in seeds):
        raise ConfigError(f"{where}: expected a non-empty list of integers in [0, 10^6), "
                          f"got {seeds!r}")
    return seeds


def load_config(source: Any) -> Experiment:
    """A config file (.toml or .json) or an already parsed mapping → Experiment.
    Every key is checked: a typo is an error, not a silent default."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as error:
            raise ConfigError(f"--config {path}: {error.strerror}") from None
        try:
            if path.endswith(".toml"):
                import tomllib
                data = tomllib.loads(raw.decode())
            else:
                data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as error:
            raise ConfigError(f"--config {path}: not valid {'TOML' if path.endswith('.toml') else 'JSON'}: "
                              f"{error}") from None
    else:
        data = source
    data = _check_keys("config", data, _TOP_KEYS)

    name = data.get("name", "experiment")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"name: expected 1-16 of [A-Za-z0-9_.-], got {name!r}")

    task = data.get("task", {"kind": "synthetic"})
    if not isinstance(task, Mapping):
        raise ConfigError(f"task: expected a table/object, got {type(task).__name__}")
    kind = task.get("kind", "synthetic")
    if kind not in _TASK_KEYS:
        raise ConfigError(f"task.kind: expected 'synthetic' or 'hh-rlhf', got {kind!r}")
    task = _check_keys("task", task, _TASK_KEYS[kind])
    for key, (type_, least) in _TASK_KEYS[kind].items():
        if key in task:
            _check_value(f"task.{key}", task[key], type_, least)
    task["kind"] = kind
    if kind == "hh-rlhf":
        for key in ("checkpoint", "data"):
            if not task.get(key):
                raise ConfigError(f"task.{key}: required for kind 'hh-rlhf' (a checkpoint "
                                  "directory and a directory with HH-RLHF's train/test jsonl)")

    ppo_fields = {f.name: f for f in dataclasses.fields(PPOConfig)}
    ppo_table = _check_keys("ppo", data.get("ppo", {}), set(ppo_fields) | {"steps"})
    steps = _check_value("ppo.steps", ppo_table.pop("steps", 100), int, 1)
    for key, value in ppo_table.items():
        default = ppo_fields[key].default
        if default is None:  # Optional[float]: a number or absent
            _check_value(f"ppo.{key}", value, float)
        else:
            _check_value(f"ppo.{key}", value, float if isinstance(default, float) else type(default))
    try:
        ppo_config = PPOConfig(**ppo_table)
    except ValueError as error:
        raise ConfigError(f"ppo: {error}") from None

    seeds = _check_seeds("seeds", data.get("seeds", [0]))
    repetitions = data.get("repetitions", 1)
    if not isinstance(repetitions, int) or not 1 <= repetitions <= 999:
        raise ConfigError(f"repetitions: expected an integer in [1, 999], got {repetitions!r}")

    profile = _check_keys("profile", data.get("profile", {}), {"batches"})
    profile_batches = _check_value("profile.batches", profile.get("batches", 2), int, 1)
    evaluation = _check_keys("eval", data.get("eval", {}), {"prompts", "seed"})
    eval_prompts = _check_value("eval.prompts", evaluation.get("prompts", 32), int, 1)
    eval_seed = _check_value("eval.seed", evaluation.get("seed", 1234), int, 0)

    entries = data.get("configurations", DEFAULT_MATRIX)
    if not isinstance(entries, list):
        raise ConfigError(f"configurations: expected a list of tables, got {entries!r}")
    configurations = []
    for index, entry in enumerate(entries):
        where = f"configurations[{index}]"
        entry = _check_keys(where, entry, _CONFIG_KEYS)
        cname = entry.get("name")
        if not isinstance(cname, str) or not _CONFIG_NAME.match(cname):
            raise ConfigError(f"{where}.name: expected 1-24 of [A-Za-z0-9_.-], got {cname!r}")
        if ("policy" in entry) == ("generate" in entry):
            raise ConfigError(f"{where} ({cname}): give exactly one of 'policy' (a name or an "
                              "inline policy) and 'generate' (a generated policy's recipe)")
        policy = entry.get("policy")
        if policy is not None and not isinstance(policy, (str, Mapping)):
            raise ConfigError(f"{where}.policy: expected a policy name or an inline policy "
                              f"table, got {type(policy).__name__}")
        generate = entry.get("generate")
        if generate is not None:
            generate = _check_generate(f"{where}.generate", generate)
        configurations.append(Configuration(cname, policy=policy, generate=generate))
    names = [c.name for c in configurations]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ConfigError(f"configurations: the name {duplicate!r} is used twice")
    if not any(c.is_baseline for c in configurations):
        raise ConfigError(f"configurations: one must be the FP16 baseline (policy "
                          f"{BASELINE_POLICY!r}); win rate and KL are measured against it")
    # The baseline runs first: every other configuration is judged against it.
    configurations.sort(key=lambda c: not c.is_baseline)

    return Experiment(name=name, task=task, ppo=ppo_config, steps=steps, seeds=list(seeds),
                      repetitions=repetitions, configurations=configurations,
                      profile_batches=profile_batches, eval_prompts=eval_prompts,
                      eval_seed=eval_seed)


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
    where: str                                     # "mxserved" or "local:cuda" ...
    wall_seconds: Dict[str, float]
    totals: Dict[str, Dict[str, float]]            # phase → daemon ExecutionInfo sums
    energy: Dict[str, Dict[str, float]]            # phase → source → joules
    busy_seconds: Dict[str, Dict[str, float]]      # phase → source → seconds
    curves: List[Dict[str, float]]
    held_out_reward: float = float("nan")
    win_rate: float = float("nan")
    kl_vs_fp16: float = float("nan")
    reward_spearman: float = float("nan")
    backend: str = ""                              # the daemon's, from ExecutionInfo
    judge_scores: List[float] = dataclasses.field(default_factory=list)
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
    model in FP16 (the judge) and, once the baseline has trained, its policy in FP16."""

    def __init__(self, client: Client, task: Task, prefix: str, run: str):
        self.client, self.run = client, run
        self.reward = task.new_reward()
        self.reward_session = offload(self.reward, client, f"{prefix}.judge",
                                      policy=BASELINE_POLICY, replace=True)
        self.baseline_policy = None
        self.baseline_session = None
        self.prefix = prefix

    def set_baseline(self, policy_lm) -> None:
        self.baseline_policy = policy_lm.cpu().float()
        self.baseline_session = offload(self.baseline_policy, self.client,
                                        f"{self.prefix}.baseline", policy=BASELINE_POLICY,
                                        replace=True)

    @torch.no_grad()
    def score(self, ids, mask) -> torch.Tensor:
        with self.client.phase("reward"), self.client.run(self.run):
            return self.reward(ids, mask).float()

    @torch.no_grad()
    def baseline_logits(self, ids, mask) -> torch.Tensor:
        with self.client.phase("rollout"), self.client.run(self.run):
            return self.baseline_policy(ids, attention_mask=mask).logits.float()

    def close(self) -> None:
        for session in (self.reward_session, self.baseline_session):
            if session is not None:
                session.restore()


def _evaluate(trainer: PPOTrainer, judges: _Judges, task: Task, experiment: Experiment,
              eval_run: str, baseline_scores: Optional[List[float]], result: RunResult) -> None:
    """Held-out reward, win rate, KL(π_q ‖ π_FP16) and reward Spearman ρ."""
    from mxserve.profile import spearman

    prompts = task.test_prompts[:experiment.eval_prompts]
    generator = torch.Generator().manual_seed(experiment.eval_seed)
    trainer.run, training_run = eval_run, trainer.run  # evaluation is not the run's energy
    judge_scores: List[float] = []
    config_scores: List[float] = []
    kls: List[float] = []
    try:
        bs = experiment.ppo.batch_size
        for start in range(0, len(prompts), bs):
            rollout = trainer.rollout(prompts[start:start + bs], keep_logits=True,
                                      generator=generator)
            ids, mask = rollout.ids.cpu(), rollout.mask.cpu()
            judge_scores += judges.score(ids, mask).tolist()
            config_scores += trainer.score(rollout.ids, rollout.mask).cpu().tolist()
            # π_FP16 on the same tokens: the logits predicting each response token,
            # over the vocabulary the rollout could sample from (as π_q's are).
            width = rollout.prompt_width
            base = limit_vocab(judges.baseline_logits(ids, mask)[:, width - 1:-1],
                               task.vocab_limit)
            quantized = rollout.logits.cpu()
            log_q = torch.log_softmax(quantized, -1)
            log_b = torch.log_softmax(base, -1)
            q = log_q.exp()  # ids outside the tokenizer's vocabulary have q = 0
            per_token = torch.where(q > 0, q * (log_q - log_b), torch.zeros_like(q)).sum(-1)
            kls += (per_token * rollout.response_mask.cpu()).sum(1).tolist()
            responses = rollout.responses()
            for row in range(min(3 - len(result.examples), ids.shape[0])):
                prompt = ids[row, :width][mask[row, :width].bool()].tolist()
                result.examples.append({"prompt": task.decode(prompt),
                                        "response": task.decode(responses[row]),
                                        "judge_score": f"{judge_scores[start + row]:.4f}"})
    finally:
        trainer.run = training_run
    result.judge_scores = judge_scores
    result.held_out_reward = sum(judge_scores) / len(judge_scores)
    result.kl_vs_fp16 = sum(kls) / len(kls)
    result.reward_spearman = spearman(config_scores, judge_scores) if len(judge_scores) > 1 \
        else float("nan")
    reference = baseline_scores if baseline_scores is not None else judge_scores
    wins = [1.0 if a > b else 0.5 if a == b else 0.0 for a, b in zip(judge_scores, reference)]
    result.win_rate = sum(wins) / len(wins)


def _run_one(client: Client, task: Task, experiment: Experiment, configuration: Configuration,
             seed: int, repetition: int, run_tag: str, progress: Progress, label: str,
             local_device: Optional[str] = None,
             sampler_factory=None) -> Tuple[RunResult, PPOTrainer]:
    """Trains one configuration on the daemon, or with `local_device` here (the
    measured baseline); the energy is read from the daemon for `run_tag` either way."""
    torch.manual_seed(seed)
    policy_lm, reward = task.new_policy(), task.new_reward()
    device = local_device or "cpu"
    trainer = PPOTrainer(None if local_device else client, policy_lm, reward, experiment.ppo,
                         policy=configuration.policy_name, run=run_tag,
                         name_prefix=f"{run_tag.split('/')[0]}.{configuration.name}",
                         eos_id=task.eos_id, pad_id=task.pad_id, seed=seed, device=device,
                         vocab_limit=task.vocab_limit)
    sampler = None
    try:
        if sampler_factory is not None:
            sampler = sampler_factory(lambda: trainer.current_phase)
            # The trainer's phase switches are the meter's boundaries (counter reads).
            trainer.phase_hook = getattr(sampler, "boundary", None)
            sampler.start()
        curves = []
        batches = _prompt_batches(task.train_prompts, experiment.ppo.batch_size, seed)
        for step in range(1, experiment.steps + 1):
            metrics = trainer.step(next(batches))
            metrics["step"] = step
            curves.append(metrics)
            progress.bar(step, experiment.steps, f"{label}: reward "
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
                       where=f"local:{local_device}" if local_device else "mxserved",
                       wall_seconds=wall, totals=totals, energy=energy, busy_seconds=busy,
                       curves=curves)
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
                                  f"refused it: {error.details}") from None


def _generate_policies(client: Client, experiment: Experiment, task: Task, prefix: str,
                       progress: Progress) -> Optional[Dict[str, Any]]:
    """Generates the `generate` configurations' policies from a sensitivity profile
    of the initial policy (calibrated on its own samples, with Fisher gradients)."""
    generated = [c for c in experiment.configurations if c.generate is not None]
    if not generated:
        return None
    from mxserve import profile as mxprofile

    progress(f"profiling the policy model for {len(generated)} generated policies")
    # Profiled as the trainer offloads it (PolicyWithValue: layers "lm.…"), so the
    # generated rules name the very layers the policy, reference and reward models
    # register; the value head is left out (it is not part of the LM's output).
    model = PolicyWithValue(task.new_policy())
    session = offload(model, client, f"{prefix}.profile", replace=True)
    try:
        rows = task.train_prompts[:experiment.ppo.batch_size * experiment.profile_batches]
        batches = []
        generator = torch.Generator().manual_seed(experiment.eval_seed)
        with session.local():
            for start in range(0, len(rows), experiment.ppo.batch_size):
                ids, mask = left_pad(rows[start:start + experiment.ppo.batch_size], task.pad_id)
                rollout = generate(model.lm, ids, mask, experiment.ppo.response_length,
                                   experiment.ppo.temperature, task.eos_id, task.pad_id, generator,
                                   vocab_limit=task.vocab_limit)
                batches.append((rollout.ids, rollout.mask))
        layers = [name for name in session.layers if name != "value_head"]
        captured = mxprofile.capture(session, batches, logits=True, layers=layers,
                                     forward=lambda m, b: m(b[0], b[1])[0])
        prof = mxprofile.profile(client, session, captured,
                                 formats=["MXFP4", "MXFP6", "MXFP8", "INT8", "FP16"])
        for index, c in enumerate(experiment.configurations):
            if c.generate is None:
                continue
            spec = dict(c.generate)
            kind = spec.pop("kind", "fraction")
            name = f"{prefix}.{c.name}"
            try:
                made = client.generate_policy(session.model_name, name, kind, **spec,
                                              description=f"experiment {experiment.name}: {c.name}")
            except MxserveError as error:
                raise ConfigError(f"configurations[{index}] ({c.name}).generate: the daemon "
                                  f"refused it: {error.details}") from None
            except (TypeError, ValueError) as error:
                raise ConfigError(f"configurations[{index}] ({c.name}).generate: {error}") from None
            c.policy_name = made.policy.name
        return {"profile_source": prof.source, "profile_tokens": prof.tokens,
                "profile_formats": list(prof.formats)}
    finally:
        session.restore()


def build_task(spec: Mapping[str, Any], progress: Progress) -> Task:
    spec = dict(spec)
    kind = spec.pop("kind")
    if kind == "synthetic":
        return tasks.synthetic_task(progress=progress, **spec)
    return tasks.hh_rlhf_task(progress=progress, **spec)


# --- aggregation and outputs -------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def _std(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if len(values) < 2:
        return 0.0 if values else float("nan")
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _energy_total(run: RunResult, source: str) -> float:
    return sum(run.energy[p].get(source, 0.0) for p in PHASES)


def _model_seconds(run: RunResult) -> float:
    return sum(run.busy_seconds[p].get("fpga_model", 0.0) for p in PHASES)


def summarize(runs: List[RunResult], baseline: str) -> List[Dict[str, Any]]:
    """One row per configuration: means over its seeds and repetitions."""
    by_config: Dict[str, List[RunResult]] = {}
    for run in runs:
        by_config.setdefault(run.configuration, []).append(run)
    base_runs = by_config[baseline]
    base_energy = _mean([_energy_total(r, "fpga_model") for r in base_runs])
    base_phase_energy = {p: _mean([r.energy[p].get("fpga_model", 0.0) for r in base_runs])
                         for p in PHASES}
    base_seconds = _mean([_model_seconds(r) for r in base_runs])
    gpu_runs = [r for r in runs if any(r.energy[p].get("gpu_baseline") for p in PHASES)]
    gpu_energy = _mean([_energy_total(r, "gpu_baseline") for r in gpu_runs]) if gpu_runs else None
    rows = []
    for name, group in by_config.items():
        row: Dict[str, Any] = {"configuration": name, "policy": group[0].policy,
                               "where": group[0].where, "runs": len(group)}
        for source in ("fpga_model", "fpga", "gpu_baseline"):
            totals = [_energy_total(r, source) for r in group]
            if any(totals):
                row[f"energy_{source}_J"] = _mean(totals)
                for phase in PHASES:
                    row[f"energy_{source}_{phase}_J"] = _mean([r.energy[phase].get(source, 0.0)
                                                               for r in group])
        energy = row.get("energy_fpga_model_J")
        if energy is not None and base_energy:
            row["energy_saving_pct"] = 100.0 * (1.0 - energy / base_energy)
            for phase in PHASES:
                if base_phase_energy[phase]:
                    row[f"energy_saving_{phase}_pct"] = 100.0 * (
                        1.0 - row[f"energy_fpga_model_{phase}_J"] / base_phase_energy[phase])
            seconds = _mean([_model_seconds(r) for r in group])
            row["model_seconds"] = seconds
            row["speedup_model"] = base_seconds / seconds if seconds else float("nan")
        if energy is not None and gpu_energy:
            row["energy_saving_vs_gpu_pct"] = 100.0 * (1.0 - energy / gpu_energy)
        for phase in PHASES:
            row[f"wall_{phase}_s"] = _mean([r.wall_seconds.get(phase, 0.0) for r in group])
            row[f"compute_{phase}_s"] = _mean([r.totals.get(phase, {}).get("compute_seconds", 0.0)
                                               for r in group])
        row["held_out_reward"] = _mean([r.held_out_reward for r in group])
        row["win_rate"] = _mean([r.win_rate for r in group])
        row["win_rate_std"] = _std([r.win_rate for r in group])
        row["win_rate_drop_pp"] = 100.0 * (0.5 - row["win_rate"])
        row["kl_vs_fp16"] = _mean([r.kl_vs_fp16 for r in group])
        row["reward_spearman"] = _mean([r.reward_spearman for r in group])
        last = [r.curves[-1] for r in group if r.curves]
        for key in ("objective/rlhf_reward", "objective/kl", "policy/clipfrac_avg", "is/ess",
                    "is/weight_mean", "is/prob_gap"):
            row["final_" + key.replace("/", "_")] = _mean([c.get(key, float("nan")) for c in last])
        rows.append(row)
    return rows


def pareto_front(points: Sequence[Tuple[float, float]]) -> List[int]:
    """Indices of the points no other point beats on both axes (x: energy saving,
    higher is better; y: win-rate drop, lower is better), in order of x."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y)
                        for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated and not (math.isnan(x) or math.isnan(y)):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _plots(rows, runs, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(r.get("energy_saving_pct", float("nan")), r["win_rate_drop_pp"]) for r in rows]
    front = pareto_front(points)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, (row, (x, y)) in enumerate(zip(rows, points)):
        ax.scatter([x], [y], s=40, color="tab:red" if i in front else "tab:blue", zorder=3)
        ax.annotate(row["configuration"], (x, y), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    if front:
        ax.plot([points[i][0] for i in front], [points[i][1] for i in front], color="tab:red",
                linewidth=1, label="Pareto front", zorder=2)
    ax.axhline(10, color="grey", linestyle=":", linewidth=1, label="target: < 10 pp drop")
    ax.axvline(30, color="grey", linestyle="--", linewidth=1, label="target: > 30 % saving")
    ax.set_xlabel("energy saving vs FP16 baseline, % (FPGA-model estimate)")
    ax.set_ylabel("win-rate drop vs FP16 baseline, percentage points")
    ax.set_title("Energy saving vs alignment quality")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pareto.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, ax in zip(("objective/rlhf_reward", "objective/kl"), axes):
        for run in runs:
            if run.repetition == 0 and run.seed == runs[0].seed:
                ax.plot([c["step"] for c in run.curves], [c[key] for c in run.curves],
                        label=run.configuration, linewidth=1)
        ax.set_xlabel("PPO step")
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"Training curves (seed {runs[0].seed})")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.{digits}f}"
    return str(value)


def criteria(rows: List[Dict[str, Any]]) -> List[Tuple[str, str, bool]]:
    """ORIGIN.md's success criteria (MX formulation, and the first formulation's
    speedup on the FPGA model), each (level, statement, met)."""
    by_name = {r["configuration"]: r for r in rows}
    checks = []
    d = by_name.get("MX-D")
    if d is not None:
        saving, drop = d.get("energy_saving_pct", float("nan")), d["win_rate_drop_pp"]
        for level, need_saving, max_drop in (("target", 30.0, 10.0), ("stretch", 50.0, 5.0)):
            met = saving > need_saving and drop < max_drop
            checks.append((level, f"policy D: {-saving:+.1f} % energy, {-drop:+.1f} pp win rate "
                                  f"(needs > {need_saving:.0f} % saving with < {max_drop:.0f} pp "
                                  "drop)", met))
    quantized = [r for r in rows if r["configuration"] != "FP16" and "energy_saving_pct" in r]
    if quantized:
        best = max(quantized, key=lambda r: r["energy_saving_pct"])
        checks.append(("minimum", f"one policy saves measurable energy: {best['configuration']} "
                                  f"saves {best['energy_saving_pct']:.1f} %",
                       best["energy_saving_pct"] > 1.0))
        fast = [r for r in quantized if r.get("speedup_model", 0) > 1.5 and r["win_rate_drop_pp"] < 10]
        checks.append(("target (first formulation)", "> 1.5× speedup (FPGA model) with < 10 pp "
                       "win-rate drop: " + (", ".join(r["configuration"] for r in fast) or "none"),
                       bool(fast)))
    adaptive = [r for r in quantized if r["configuration"] in ("INT8-A", "INT8-B", "INT8-C",
                                                                "INT8-D", "MX-B", "MX-D",
                                                                "MX-budget")]
    uniform = by_name.get("INT8-uniform")
    if adaptive and uniform:
        beats = [r for r in adaptive if r["win_rate"] > uniform["win_rate"]
                 and r.get("energy_saving_pct", -1e9) >= 0]
        checks.append(("target (first formulation)", "layer-adaptive beats uniform INT8 on win "
                       "rate: " + (", ".join(r["configuration"] for r in beats) or "none"),
                       bool(beats)))
    return checks


def write_outputs(out: str, experiment: Experiment, task: Task, runs: List[RunResult],
                  info: Dict[str, Any]) -> Dict[str, Any]:
    os.makedirs(out, exist_ok=True)
    baseline = next(c.name for c in experiment.configurations if c.is_baseline)
    rows = summarize(runs, baseline)
    columns: List[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(os.path.join(out, "results.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    with open(os.path.join(out, "runs.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["configuration", "policy", "seed", "repetition", "run_tag", "where",
                         "fpga_model_J", "gpu_baseline_J", "held_out_reward", "win_rate",
                         "kl_vs_fp16", "reward_spearman"])
        for r in runs:
            writer.writerow([r.configuration, r.policy, r.seed, r.repetition, r.run_tag, r.where,
                             f"{_energy_total(r, 'fpga_model'):.6g}",
                             f"{_energy_total(r, 'gpu_baseline'):.6g}",
                             f"{r.held_out_reward:.6g}", f"{r.win_rate:.6g}",
                             f"{r.kl_vs_fp16:.6g}", f"{r.reward_spearman:.6g}"])
    checks = criteria(rows)
    summary = {"experiment": experiment.name, "task": task.description, "task_setup": task.setup,
               "ppo": dataclasses.asdict(experiment.ppo), "steps": experiment.steps,
               "seeds": experiment.seeds, "repetitions": experiment.repetitions, **info,
               "configurations": rows,
               "criteria": [{"level": l, "statement": s, "met": m} for l, s, m in checks],
               "runs": [dataclasses.asdict(r) for r in runs]}
    with open(os.path.join(out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1, default=float, allow_nan=True)
    _plots(rows, runs, out)
    _report(out, experiment, task, rows, checks, info)
    return summary


def _report(out, experiment, task, rows, checks, info) -> None:
    lines = [f"# Experiment `{experiment.name}`", "",
             f"{task.description}; PPO {experiment.steps} steps × batch "
             f"{experiment.ppo.batch_size}, responses up to {experiment.ppo.response_length} "
             f"tokens, seeds {experiment.seeds} × {experiment.repetitions} repetition(s); "
             f"daemon backend `{info.get('backend', '?')}` on {info.get('cpu', '?')}; "
             f"{info.get('duration_s', 0):.0f} s in all.", "",
             "Energy and FPGA time are **FPGA-model estimates** (the daemon's energy model of "
             "the MX datapath; on an F2 board the `fpga` source is measured). Quality is exact "
             "for the FPGA: the emulation is bit-identical to its datapath.", "",
             "| configuration | policy | energy (J) | saving | rollout / reward / update saving | "
             "FPGA-model speedup | held-out reward | win rate vs FP16 | KL(π‖π_FP16) | reward ρ |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        phase_savings = " / ".join(_fmt(r.get(f"energy_saving_{p}_pct"), 0) for p in PHASES)
        lines.append(
            f"| {r['configuration']} | `{r['policy']}` | {_fmt(r.get('energy_fpga_model_J'), 4)} | "
            f"{_fmt(r.get('energy_saving_pct'), 1)} % | {phase_savings} % | "
            f"{_fmt(r.get('speedup_model'))}× | {_fmt(r['held_out_reward'], 3)} | "
            f"{_fmt(r['win_rate'], 3)} | {_fmt(r['kl_vs_fp16'], 4)} | "
            f"{_fmt(r['reward_spearman'], 3)} |")
    gpu = [r for r in rows if "energy_gpu_baseline_J" in r]
    if gpu:
        lines += ["", "GPU baseline (measured): " + "; ".join(
            f"{r['configuration']} {r['energy_gpu_baseline_J']:.1f} J" for r in gpu)]
    lines += ["", "## Success criteria (../shared/ORIGIN.md)", ""]
    for level, statement, met in checks:
        lines.append(f"- **{level}** — {statement}: **{'met' if met else 'not met'}**")
    lines += ["", "Win-rate drop is in percentage points below 0.5 (the baseline against "
              "itself); the judge is the reward model in FP16, ties count half.", "",
              "![Pareto](pareto.png)", "", "![Curves](curves.png)", ""]
    with open(os.path.join(out, "report.md"), "w") as handle:
        handle.write("\n".join(lines))


# --- the driver --------------------------------------------------------------------------


def run_experiment(client: Client, experiment: Experiment, out: str, *,
                   progress: Optional[Progress] = None, device: str = "cpu",
                   power_source: Optional[str] = None, task: Optional[Task] = None) -> Dict[str, Any]:
    """Runs the whole matrix and writes the outputs; returns the summary."""
    progress = progress or Progress(False)
    started = time.time()
    tag = f"{experiment.name}-{os.urandom(3).hex()}"
    client.wait_ready()
    # The run's own names: daemon models and policies, so concurrent experiments
    # (even of the same name) never touch each other's.
    _check_policies(client, experiment, tag)
    try:
        if task is None:
            progress(f"building the task ({experiment.task['kind']})")
            task = build_task(experiment.task, progress)
        profile_info = _generate_policies(client, experiment, task, tag, progress) or {}
        policies = {c.name: client.get_policy(c.policy_name).document
                    for c in experiment.configurations}
        runs = _run_matrix(client, experiment, task, tag, progress, device, power_source)
    finally:
        for c in experiment.configurations:
            if c.policy_name.startswith(tag + "."):
                with contextlib.suppress(MxserveError):
                    client.delete_policy(c.policy_name)
    info = {"backend": next((r.backend for r in runs if r.backend), "?"), "cpu": cpu_model(),
            "run_tag": tag, "duration_s": time.time() - started, "device": device,
            "policies": policies, **profile_info}
    return write_outputs(out, experiment, task, runs, info)


def _run_matrix(client: Client, experiment: Experiment, task: Task, tag: str,
                progress: Progress, device: str, power_source: Optional[str]) -> List[RunResult]:
    eval_run = f"{tag}/eval"
    judges = _Judges(client, task, tag, eval_run)
    runs: List[RunResult] = []
    baseline_scores: Dict[Tuple[int, int], List[float]] = {}
    jobs = [(c, s, r) for c in experiment.configurations for s in experiment.seeds
            for r in range(experiment.repetitions)]
    if device != "cpu" or power_source:
        baseline = next(c for c in experiment.configurations if c.is_baseline)
        jobs.insert(len(experiment.seeds) * experiment.repetitions,
                    (dataclasses.replace(baseline, name=f"FP16-{device.split(':')[0]}"), None, None))
    try:
        index = 0
        for configuration, seed, repetition in jobs:
            index += 1
            local = seed is None
            if local:  # the measured GPU (or replayed) FP16 baseline, one run of the first seed
                seed, repetition = experiment.seeds[0], 0
            label = f"[{index}/{len(jobs)}] {configuration.name} seed {seed}"
            run_tag = f"{tag}/{configuration.name}/s{seed}r{repetition}"
            sampler_factory = _sampler_factory(client, power_source, device, run_tag) if local else None
            result, trainer = _run_one(client, task, experiment, configuration, seed, repetition,
                                       run_tag, progress, label,
                                       local_device=device if local else None,
                                       sampler_factory=sampler_factory)
            try:
                if configuration.is_baseline and not local and judges.baseline_session is None:
                    judges.set_baseline(trainer.policy_copy())
                _evaluate(trainer, judges, task, experiment, eval_run,
                          baseline_scores.get((seed, repetition)), result)
                if configuration.is_baseline and not local:
                    baseline_scores[(seed, repetition)] = result.judge_scores
            finally:
                trainer.close()
            runs.append(result)
            progress.done(f"{label}: held-out reward {result.held_out_reward:+.3f}, win rate "
                          f"{result.win_rate:.3f}, KL {result.kl_vs_fp16:.4f}, "
                          f"{_energy_total(result, 'fpga_model'):.4g} J (FPGA model)")
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
    from mxserve.gpu_baseline import SOURCE, EnergyMeter
    from mxserve.power import open_power_source

    def synchronize():
        torch.cuda.synchronize(torch.device(device))

    def make(current_phase):
        power = open_power_source(power_source)
        return EnergyMeter(client, power, device if device != "cpu" else "replay", run_tag,
                           synchronize=synchronize if device.startswith("cuda") else None,
                           source=SOURCE, phase=current_phase())
    return make


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m mxserve.experiment",
        description="PPO-RLHF over a policy matrix on mxserved: per-phase energy and "
                    "quality for every configuration, with a results table, a Pareto "
                    "plot and a report.")
    parser.add_argument("--server", default=os.environ.get("MXSERVE_ADDRESS", "127.0.0.1:50051"),
                        help="mxserved's address (default %(default)s)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="the experiment: a TOML or JSON file (see "
                                         "clients/python/README.md, 'The experiment')")
    source.add_argument("--quick", action="store_true",
                        help="the built-in model and synthetic task, the whole default matrix, "
                             "a few minutes on two cores")
    parser.add_argument("--out", required=True, help="directory for results.csv, runs.csv, "
                                                     "summary.json, pareto.png, curves.png, report.md")
    parser.add_argument("--steps", type=int, help="override the PPO steps of the config")
    parser.add_argument("--seeds", help="override the seeds, e.g. 0,1,2")
    parser.add_argument("--only", help="run only these configurations (comma-separated; the "
                                       "FP16 baseline always runs)")
    parser.add_argument("--device", default="cpu",
                        help="'cuda' (or cuda:N): also run the FP16 baseline locally on the GPU "
                             "and measure its power (default: cpu, no local baseline)")
    parser.add_argument("--power-source", help="power for the local baseline: 'nvml' (default "
                                               "with --device cuda) or 'replay:FILE'")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    progress = Progress(not args.quiet)
    try:
        data = QUICK if args.quick else None
        experiment = load_config(copy.deepcopy(data) if data else args.config)
        if args.steps is not None:
            if args.steps < 1:
                raise ConfigError(f"--steps: expected at least 1, got {args.steps}")
            experiment.steps = args.steps
        if args.seeds:
            try:
                seeds = [int(s) for s in args.seeds.split(",")]
            except ValueError:
                seeds = args.seeds
            experiment.seeds = _check_seeds("--seeds", seeds)
        if args.only:
            wanted = set(args.only.split(","))
            unknown = wanted - {c.name for c in experiment.configurations}
            if unknown:
                raise ConfigError(f"--only: no configuration {sorted(unknown)[0]!r} (have: "
                                  f"{', '.join(c.name for c in experiment.configurations)})")
            experiment.configurations = [c for c in experiment.configurations
                                         if c.is_baseline or c.name in wanted]
        power = args.power_source or ("nvml" if args.device.startswith("cuda") else None)
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA device here")
        with Client(args.server) as client:
            summary = run_experiment(client, experiment, args.out, progress=progress,
                                     device=args.device, power_source=power)
    except (FileNotFoundError, ValueError) as error:  # ConfigError is a ValueError
        progress.done()
        print(f"mxserve.experiment: {error}", file=sys.stderr)
        return 2
    except MxserveError as error:
        progress.done()
        print(f"mxserve.experiment: the daemon at {args.server} answered {error}", file=sys.stderr)
        return 1
    progress.done()
    for check in summary["criteria"]:
        print(f"{check['level']}: {check['statement']}: {'met' if check['met'] else 'not met'}")
    print(f"wrote {os.path.join(args.out, 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
