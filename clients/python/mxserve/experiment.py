"""The experiment: seeded PPO-RLHF once per configuration of a policy matrix and per
training seed, with quality and energy per phase and their uncertainty, in one command.

    python3 -m mxserve.experiment --server 127.0.0.1:50051 --quick --out results/
    python3 -m mxserve.experiment --server 127.0.0.1:50051 --config matrix.toml --out results/

Each configuration names a daemon policy (a built-in preset, a policy given inline,
or one generated from a sensitivity profile of the policy model) and runs the same
seeded PPO (`mxserve.rlhf`) with every linear layer on mxserved in its phase. Its
requests carry a run tag of their own, so the energy read back belongs to that run
alone. The default matrix holds the origin's two policy families, a generated
budget policy, and each phase alone (one phase in MXFP4, MXFP8 or INT8 on every
layer, the others FP16). The runner goes seed by seed (`--seeds`: 3 by default, 2
for `--quick`), each seed's FP16 baseline first; it adds the untrained policy (did
PPO learn anything?) and the noise floor (FP16 of one seed against FP16 of the
previous one). Then, on the held-out prompts, per seed and prompt:

- held-out reward: the score of its response by the reward model in FP16 (the
  judge, the same for every configuration; it scores each response alone);
- win rate against the FP16 baseline of the same seed: the judge prefers this
  configuration's response to the baseline's (ties count half);
- KL(π_q ‖ π_FP16): exact over the vocabulary at the sampling temperature, summed
  over the response's tokens, against the same seed's trained FP16 baseline;
- reward Spearman ρ: the reward model's scores of the same responses in the
  configuration's reward formats against the judge's.

Every figure gets a 95 % hierarchical bootstrap interval (`mxserve.stats`); the
success criteria are met, not met or unresolved by their whole interval
(`mxserve.experiment_report`).

Outputs in --out: results.csv (one row per configuration), runs.csv (one per run),
summary.json (everything, training curves included), pareto.png, curves.png and
report.md. Energy is the FPGA model's estimate in emulation (with its range over the
model's parameters), the board's measurement on F2, and for the `--device cuda`
baseline the GPU's energy counter (NVML), labelled "replayed" when it came from a
power trace file instead. state/ keeps each finished run as it finishes, so that
`--resume` continues a killed run (`mxserve.experiment_state`).

`--compute local` (the default with `--device cuda`) computes the offloaded layers
in this process on the device, with the daemon's numerics; a preflight
(`mxserve.preflight`) prints the memory and time the run needs before any training
and refuses one that cannot fit. `--config seeds` is the shipped seeds' run
(configs/seeds.toml).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from mxserve import _wire, stats, tasks
from mxserve.client import Client, MxserveError
from mxserve.experiment_report import NOISE_FLOOR, UNTRAINED
from mxserve.experiment_report import phase_sum
from mxserve.experiment_report import pareto_front, summarize, write_outputs  # noqa: F401
from mxserve.machine import describe_machine, source_commit
from mxserve.experiment_state import ResumeError, RunState
from mxserve.rlhf import (PHASES, PolicyWithValue, PPOConfig, PPOTrainer, generate, left_pad,
                          limit_vocab)
from mxserve.tasks import Task
from mxserve.torch import COMPUTE_MODES, offload
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

# Each phase alone: one phase in a low format on every layer, the other two in FP16,
# so the report can say per phase what it tolerates ("which phase benefits most").
PHASE_ALONE_FORMATS = ("MXFP4", "MXFP8", "INT8")
PHASE_ALONE: List[Dict[str, Any]] = [
    {"name": f"{phase}-{fmt}",
     "policy": {"defaults": {p: (fmt if p == phase else "FP16") for p in PHASES}}}
    for phase in PHASES for fmt in PHASE_ALONE_FORMATS]
DEFAULT_MATRIX += PHASE_ALONE

# Rows the driver adds by itself: the initial policy evaluated untrained (did PPO
# learn anything at all?), and the locally run FP16 baseline (FP16-cuda, FP16-cpu).
_RESERVED = re.compile(rf"^({UNTRAINED}|FP16-(cpu|cuda)|{NOISE_FLOOR})$")

QUICK: Dict[str, Any] = {
    "name": "quick",
    "task": {"kind": "synthetic", "seed": 0, "n_train": 256, "n_test": 64},
    "eval": {"prompts": 64},
    "ppo": {"steps": 8, "batch_size": 8, "response_length": 8, "learning_rate": 5e-4,
            "temperature": 1.0},
    # Two seeds: the fewest that give a noise floor (FP16 of one seed against FP16 of
    # the other). Configured experiments default to three.
    "seeds": [0, 1],
}
DEFAULT_SEEDS = [0, 1, 2]
# The origin's held-out set: 200 prompts (a 50 % win rate then carries ±6.9 points).
DEFAULT_EVAL_PROMPTS = 200

# Each task kind's keys and what they take: (type, least value) for numbers.
_COUNT, _SEED, _TEXT = (int, 1), (int, 0), (str, None)
_TASK_KEYS = {
    "synthetic": {"kind": _TEXT, "seed": _SEED, "n_train": _COUNT, "n_test": _COUNT,
                  "sft_steps": _COUNT, "reward_steps": _COUNT, "frozen_dtype": _TEXT},
    "hh-rlhf": {"kind": _TEXT, "checkpoint": _TEXT, "data": _TEXT, "reward_checkpoint": _TEXT,
                "n_train": _COUNT, "n_test": _COUNT, "seed": _SEED, "max_prompt_tokens": _COUNT,
                "reward_steps": _COUNT, "frozen_dtype": _TEXT},
}
# task.frozen_dtype: the dtype of the models that never train (the task's initial
# policy and reward model, each run's reference and reward model, the judge's).
FROZEN_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Where hh-rlhf's paths may come from besides the config (a flag wins over these).
PATH_ENVIRONMENT = {"checkpoint": "MXSERVE_CHECKPOINT", "data": "MXSERVE_HH_RLHF"}
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
    eval_prompts: int = DEFAULT_EVAL_PROMPTS
    eval_seed: int = 1234
    # Prompts per evaluation batch: evaluation has no optimizer step, so it batches
    # wider than PPO does (fewer calls per prompt); 0 means PPO's batch size.
    eval_batch_size: int = 32


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


# Configs installed with the package; `--config NAME` names one.
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def shipped_config(path: str) -> str:
    """`path`, or the shipped config it names (a bare name like "seeds" that is not
    a file here)."""
    if os.path.exists(path) or os.sep in path or path.endswith((".toml", ".json")):
        return path
    shipped = os.path.join(CONFIG_DIR, f"{path}.toml")
    return shipped if os.path.isfile(shipped) else path


def load_config(source: Any) -> Experiment:
    """A config file (.toml or .json) or an already parsed mapping → Experiment.
    Every key is checked: a typo is an error, not a silent default."""
    if isinstance(source, (str, os.PathLike)):
        path = shipped_config(os.fspath(source))
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
    if task.get("frozen_dtype", "fp32") not in FROZEN_DTYPES:
        raise ConfigError(f"task.frozen_dtype: expected one of {', '.join(FROZEN_DTYPES)}, got "
                          f"{task['frozen_dtype']!r}")
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

    seeds = _check_seeds("seeds", data.get("seeds", DEFAULT_SEEDS))
    repetitions = data.get("repetitions", 1)
    if not isinstance(repetitions, int) or not 1 <= repetitions <= 999:
        raise ConfigError(f"repetitions: expected an integer in [1, 999], got {repetitions!r}")

    profile = _check_keys("profile", data.get("profile", {}), {"batches"})
    profile_batches = _check_value("profile.batches", profile.get("batches", 2), int, 1)
    evaluation = _check_keys("eval", data.get("eval", {}), {"prompts", "seed", "batch_size"})
    eval_prompts = _check_value("eval.prompts", evaluation.get("prompts", DEFAULT_EVAL_PROMPTS),
                                int, 1)
    eval_seed = _check_value("eval.seed", evaluation.get("seed", 1234), int, 0)
    eval_batch_size = _check_value("eval.batch_size", evaluation.get("batch_size", 32), int, 0)

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
        if _RESERVED.match(cname):
            raise ConfigError(f"{where}.name: {cname!r} is reserved for a row the runner adds "
                              "itself (untrained, FP16-cpu, FP16-cuda, noise-floor)")
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
                      eval_seed=eval_seed, eval_batch_size=eval_batch_size)


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
    # Always on the daemon, whatever `compute` says: ProfileModel measures each
    # layer's error with the weights the daemon holds, so they are uploaded.
    model = PolicyWithValue(task.new_policy())
    session = offload(model, client, f"{prefix}.profile", replace=True)
    try:
        rows = task.train_prompts[:experiment.ppo.batch_size * experiment.profile_batches]
        batches = []
        generator = torch.Generator().manual_seed(experiment.eval_seed)
        with session.local():
            for start in range(0, len(rows), experiment.ppo.batch_size):
                ids, mask = (t.to(model.value_head.weight.device) for t in
                             left_pad(rows[start:start + experiment.ppo.batch_size], task.pad_id))
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
                                  f"refused it: {error.message}") from None
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
    frozen = FROZEN_DTYPES[spec.pop("frozen_dtype", "fp32")]
    if kind == "synthetic":
        task = tasks.synthetic_task(progress=progress, **spec)
    else:
        task = tasks.hh_rlhf_task(progress=progress, **spec)
    return task if frozen == torch.float32 else task.hold_in(frozen)


# --- the driver --------------------------------------------------------------------------


def _check_compute(device: str, compute: str) -> None:
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

    Every finished job is kept under out/state/ (`mxserve.experiment_state`); with
    `resume` a run of the same experiment continues at its next unfinished job, with
    `overwrite` it starts over, and with neither a non-empty `out` is refused
    (ResumeError). `on_job_done(index, result)` is called after each job is saved."""
    progress = progress or Progress(False)
    _check_compute(device, compute)
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
                            energy_ranges=_energy_ranges(runs, baseline))
    state.finish()
    return summary


def _energy_ranges(runs: List[RunResult], baseline: str) -> Optional[Dict[str, Dict[str, Any]]]:
    """Per configuration, its FPGA-model saving (total and per phase) with its range
    over the energy model's parameter box (fpga/model/energy_model.json, "ranges"):
    the GEMMs the configuration's runs booked against those of the baseline's runs,
    priced under the same parameters at every point (`energy_model.saving_range`),
    and the parameters the saving is most sensitive to. None when the model file
    is not found (an installed package without the repository)."""
    from mxserve import energy_model

    try:
        params = energy_model.load_energy_model()
    except (energy_model.EnergyModelError, OSError):
        return None
    by_config: Dict[str, List[RunResult]] = {}
    for run in runs:
        if run.work:
            by_config.setdefault(run.configuration, []).append(run)
    if baseline not in by_config:
        return None
    base_work = energy_model.merge_work(*(r.work for r in by_config[baseline]))
    ranges: Dict[str, Dict[str, Any]] = {}
    for name, group in by_config.items():
        report = energy_model.saving_range(energy_model.merge_work(*(r.work for r in group)),
                                           base_work, params)
        fields: Dict[str, Any] = {"energy_range_method": report.method}
        for phase, saving in report.phases.items():
            key = "energy_saving_pct" if phase == "total" else f"energy_saving_{phase}_pct"
            if saving.min is not None:
                fields[f"{key}_min"], fields[f"{key}_max"] = saving.min, saving.max
        fields["energy_sensitive_parameters"] = ", ".join(
            report.phases["total"].most_sensitive(3)) if "total" in report.phases else ""
        ranges[name] = fields
    return ranges


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


def _at_least_one(flag: str, value: int) -> int:
    if value < 1:
        raise ConfigError(f"{flag}: expected at least 1, got {value}")
    return value


def _apply_overrides(experiment: Experiment, args: argparse.Namespace) -> None:
    """The command line's overrides of the config, and hh-rlhf's paths from the
    flags or the environment (a flag wins, then the environment, then the config);
    a path that is not there is an error naming where it can be set."""
    if args.steps is not None:
        experiment.steps = _at_least_one("--steps", args.steps)
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
    if args.prompts is not None:
        experiment.eval_prompts = _at_least_one("--prompts", args.prompts)
    ppo_overrides = {}
    if args.response_length is not None:
        ppo_overrides["response_length"] = _at_least_one("--response-length", args.response_length)
    if args.batch_size is not None:
        ppo_overrides["batch_size"] = _at_least_one("--batch-size", args.batch_size)
    if ppo_overrides:
        try:
            experiment.ppo = dataclasses.replace(experiment.ppo, **ppo_overrides)
        except ValueError as error:
            raise ConfigError(f"--batch-size/--response-length: {error}") from None
    task = experiment.task
    if args.prompt_length is not None:
        if task["kind"] != "hh-rlhf":
            raise ConfigError("--prompt-length: only an hh-rlhf task cuts its prompts")
        task["max_prompt_tokens"] = _at_least_one("--prompt-length", args.prompt_length)
    for key, variable in PATH_ENVIRONMENT.items():
        flag = getattr(args, key)
        if task["kind"] != "hh-rlhf":
            if flag:
                raise ConfigError(f"--{key}: the task is {task['kind']!r}, which reads no files")
            continue
        task[key] = flag or os.environ.get(variable) or task[key]
        if not os.path.isdir(task[key]):
            source = ("--" + key) if flag else (f"${variable}" if os.environ.get(variable)
                                                else "the config")
            raise ConfigError(f"task.{key}: {task[key]} not found (from {source}); set it in the "
                              f"config's [task], with --{key} or with ${variable}"
                              + ("; `python3 -m mxserve.checkpoint` writes a random-init one "
                                 "for a trial" if key == "checkpoint" else ""))


def preflight_estimate(experiment: Experiment, device: str, compute: str,
                       local_baseline: bool):
    """The preflight estimate (`mxserve.preflight`) for this experiment's model
    and matrix."""
    from mxserve import preflight
    from mxserve.models import ModelConfig, read_model_config

    task = experiment.task
    if task["kind"] == "hh-rlhf":
        config = read_model_config(task["checkpoint"])
        prompt_tokens, n_test = task.get("max_prompt_tokens", 448), task.get("n_test", 200)
    else:
        config = ModelConfig(**tasks.BUILTIN_CONFIG)
        prompt_tokens, n_test = 8, task.get("n_test", 32)
    cells = len(experiment.seeds) * experiment.repetitions
    shape = preflight.Shape(
        batch_size=experiment.ppo.batch_size, prompt_tokens=prompt_tokens,
        response_tokens=experiment.ppo.response_length,
        mini_batches=experiment.ppo.num_mini_batches, epochs=experiment.ppo.num_ppo_epochs,
        eval_batch_size=experiment.eval_batch_size, eval_prompts=min(experiment.eval_prompts,
                                                                     n_test),
        frozen_bytes=2 if task.get("frozen_dtype") == "bf16" else 4, steps=experiment.steps,
        runs=cells * len(experiment.configurations) + int(local_baseline),
        untrained_runs=cells)
    return preflight.estimate(config, shape, compute, device)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m mxserve.experiment",
        description="PPO-RLHF over a policy matrix on mxserved: per-phase energy and "
                    "quality for every configuration, with a results table, a Pareto "
                    "plot and a report. Before any training it prints a preflight "
                    "estimate of memory and time and refuses a run that cannot fit.")
    parser.add_argument("--server", default=os.environ.get("MXSERVE_ADDRESS", "127.0.0.1:50051"),
                        help="mxserved's address (default %(default)s)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="the experiment: a TOML or JSON file (see "
                                         "clients/python/README.md, 'The experiment'), or a "
                                         "shipped config's name: 'seeds' (the seeds' run: "
                                         "Qwen2.5-0.5B, HH-RLHF, 3 seeds, 100 steps, the whole "
                                         "matrix; mxserve/configs/seeds.toml)")
    source.add_argument("--quick", action="store_true",
                        help="the built-in model and synthetic task, the whole default matrix, "
                             "2 seeds, under 10 minutes on two cores")
    parser.add_argument("--out", help="directory for results.csv, runs.csv, summary.json, "
                                      "pareto.png, curves.png, report.md, and state/ (each "
                                      "finished run, for --resume); required unless "
                                      "--preflight-only")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the run in --out at its next unfinished configuration × "
                            "seed, keeping the finished ones (same config and flags)")
    again.add_argument("--overwrite", action="store_true",
                       help="start over in a non-empty --out (without --resume or --overwrite "
                            "a non-empty --out is refused)")
    parser.add_argument("--steps", type=int, help="override the PPO steps of the config")
    parser.add_argument("--seeds", help="training seeds, e.g. 0,1,2 (default: the config's, else "
                                        "0,1,2; --quick: 0,1). Two at least give a noise floor")
    parser.add_argument("--only", help="run only these configurations (comma-separated; the "
                                       "FP16 baseline always runs)")
    parser.add_argument("--prompts", type=int, help="held-out prompts per run (eval.prompts)")
    parser.add_argument("--response-length", type=int,
                        help="tokens sampled per response (ppo.response_length)")
    parser.add_argument("--batch-size", type=int, help="prompts per PPO step (ppo.batch_size)")
    parser.add_argument("--prompt-length", type=int,
                        help="hh-rlhf: prompts cut to their last N tokens (task.max_prompt_tokens)")
    parser.add_argument("--checkpoint", help="hh-rlhf: the model's checkpoint directory "
                                             "(task.checkpoint; else $MXSERVE_CHECKPOINT, else "
                                             "the config's)")
    parser.add_argument("--data", help="hh-rlhf: the directory with HH-RLHF's train/test "
                                       "jsonl[.gz] (task.data; else $MXSERVE_HH_RLHF, else the "
                                       "config's)")
    parser.add_argument("--device", default="cpu",
                        help="'cuda' (or cuda:N): train and evaluate every configuration on the "
                             "GPU (--compute local), and run the FP16 baseline natively there "
                             "too and measure its energy: NVML's energy counter read at every "
                             "phase boundary after a device synchronise (samples beside it for "
                             "the timeline), idle power first (default: cpu, no local baseline)")
    parser.add_argument("--compute", choices=COMPUTE_MODES,
                        help="where offloaded linear layers compute: 'daemon' (on mxserved; "
                             "the default on cpu) or 'local' (here, on --device, with an exact "
                             "emulation of the daemon's numerics, no weight upload; the daemon "
                             "still chooses formats and books energy; the default on cuda)")
    parser.add_argument("--power-source", help="energy of the local baseline: 'nvml' (default "
                                               "with --device cuda) or 'replay:FILE' (a recorded "
                                               "trace, reported as replayed, never measured)")
    parser.add_argument("--preflight-only", "--dry-run", action="store_true",
                        help="print the preflight estimate (memory of this process, the daemon "
                             "and the GPU; time) and exit")
    parser.add_argument("--ignore-preflight", action="store_true",
                        help="run even when the preflight estimate does not fit")
    parser.add_argument("--daemon-weight-memory", default="8G",
                        help="mxserved's --weight-memory-bytes, for the preflight (default "
                             "%(default)s, the daemon's default)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    progress = Progress(not args.quiet)
    compute = args.compute or ("local" if args.device.startswith("cuda") else "daemon")
    try:
        if args.out is None and not args.preflight_only:
            raise ConfigError("--out: required (the directory for the results)")
        _check_compute(args.device, compute)
        data = QUICK if args.quick else None
        experiment = load_config(copy.deepcopy(data) if data else args.config)
        _apply_overrides(experiment, args)
        if args.out is not None and not args.preflight_only:
            RunState.check_out(args.out, args.resume, args.overwrite)
        power = args.power_source or ("nvml" if args.device.startswith("cuda") else None)
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA device here")
        if _preflight(experiment, args, compute, power) and args.preflight_only:
            return 0
        with Client(args.server) as client:
            summary = run_experiment(client, experiment, args.out, progress=progress,
                                     device=args.device, power_source=power, compute=compute,
                                     resume=args.resume, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError) as error:  # ConfigError, ResumeError: ValueErrors
        progress.done()
        print(f"mxserve.experiment: {error}", file=sys.stderr)
        return 2
    except MxserveError as error:
        progress.done()
        print(f"mxserve.experiment: the daemon at {args.server} answered {error}", file=sys.stderr)
        return 1
    progress.done()
    for check in summary["criteria"]:
        detail = f" ({check['detail']})" if check["detail"] else ""
        print(f"{check['level']}: {check['statement']}: {check['status']}{detail}")
    print(f"wrote {os.path.join(args.out, 'report.md')}")
    return 0


def _preflight(experiment: Experiment, args: argparse.Namespace, compute: str,
               power: Optional[str]) -> bool:
    """Prints the estimate (to stdout with --preflight-only, else as progress) and
    raises ConfigError naming what to change when it does not fit; True when it fits."""
    from mxserve import preflight

    estimate = preflight_estimate(experiment, args.device, compute,
                                  args.device != "cpu" or bool(power))
    if args.preflight_only:
        print(estimate.render())
    elif not args.quiet:
        print(estimate.render(), file=sys.stderr)
    try:
        budget = preflight.parse_bytes(args.daemon_weight_memory)
    except ValueError as error:
        raise ConfigError(f"--daemon-weight-memory: {error}") from None
    problems = estimate.check(preflight.available_memory(args.device, budget),
                              daemon_local=preflight.daemon_is_local(args.server))
    if problems and not args.ignore_preflight:
        raise ConfigError("preflight: this run does not fit:\n  " + "\n  ".join(problems) +
                          "\n(--ignore-preflight runs it anyway)")
    for problem in problems:
        print(f"mxserve.experiment: preflight (ignored): {problem}", file=sys.stderr)
    return True


if __name__ == "__main__":
    sys.exit(main())
