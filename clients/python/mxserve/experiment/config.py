"""The experiment's configuration: the matrix, its schema, and `load_config`.

A config (TOML, JSON, a dict, or a shipped name such as `seeds` under configs/)
becomes an `Experiment`; everything wrong with it is a `ConfigError` raised before
any training."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional

import torch

from mxserve import _wire
from mxserve._wire import PHASES
from mxserve.experiment.report import NOISE_FLOOR, UNTRAINED
from mxserve.rlhf.trainer import PPOConfig
from mxserve.types import PROFILE_SCORES
from mxserve.v1 import profiles_pb2

__all__ = ["BASELINE_POLICY", "DEFAULT_MATRIX", "QUICK", "ConfigError", "Configuration",
           "Experiment", "check_seeds", "load_config", "shipped_config"]


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
    {"name": "NV-B", "policy": "NV-balanced"},
    {"name": "MX-budget", "generate": {"kind": "budget", "candidates": ["MXFP4", "MXFP8", "FP16"],
                                       "high": "FP16", "metric": "energy",
                                       "relative_budget": 0.5}},
    # The rollout phase under one budget, two generators: the knapsack over profile
    # scores and the RL search (mxserve.torch.search), which checks the whole model
    # after each choice where the knapsack adds per-layer scores.
    {"name": "budget-rollout", "generate": {"kind": "budget", "phases": ["rollout"],
                                            "candidates": ["MXFP4", "MXFP8", "FP16"],
                                            "high": "FP16", "metric": "energy",
                                            "relative_budget": 0.5}},
    {"name": "RL-rollout", "generate": {"kind": "rl", "phases": ["rollout"],
                                        "candidates": ["MXFP4", "MXFP8", "FP16"], "high": "FP16",
                                        "relative_budget": 0.5, "episodes": 24, "seed": 0}},
]

# Each phase alone: one phase in a low format on every layer, the other two in FP16,
# so the report can say per phase what it tolerates ("which phase benefits most").
PHASE_ALONE_FORMATS = ("MXFP4", "NVFP4", "MXFP8", "INT8")
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
# kind "rl": mxserve.torch.search's recipe (run here, not by the daemon).
_RL_KEYS = {"kind", "high", "candidates", "phases", "relative_budget", "budget_bits",
            "budget_joules", "episodes", "seed", "search_seeds"}


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


# What a generated policy's recipe may name: the wire enums' names (mxserve._wire).
_GENERATION_KINDS = _wire.enum_names(profiles_pb2.GenerationKind)  # fraction, budget, tolerance
_COST_METRICS = _wire.enum_names(profiles_pb2.CostMetric)          # energy, time, bits

_KIND_NAMES = {int: "an integer", float: "a finite number", bool: "true or false",
               str: "a string", list: "a list"}


def _check_generate(where: str, spec: Any) -> Dict[str, Any]:
    """A generated policy's recipe, checked here so a typo costs no training: the
    daemon checks the numbers against the profile later."""
    kind = spec.get("kind", "fraction") if isinstance(spec, Mapping) else None
    if kind == "rl":
        return _check_rl(where, spec)
    spec = _check_keys(where, spec, _GENERATE_KEYS)
    if kind not in _GENERATION_KINDS:
        raise ConfigError(f"{where}.kind: expected {_wire.either(_GENERATION_KINDS + ('rl',))}, "
                          f"got {kind!r}")
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
    if spec.get("metric", "energy") not in _COST_METRICS:
        raise ConfigError(f"{where}.metric: expected {_wire.either(_COST_METRICS)}, got "
                          f"{spec['metric']!r}")
    if spec.get("score", "auto") not in PROFILE_SCORES:
        raise ConfigError(f"{where}.score: expected one of {', '.join(PROFILE_SCORES)}, "
                          f"got {spec['score']!r}")
    return spec


def _check_rl(where: str, spec: Mapping) -> Dict[str, Any]:
    """kind "rl": the search's phases (default rollout), candidate formats (default
    the search's), budget (relative_budget, budget_bits, budget_joules: positive
    numbers), episodes and seed, search_seeds (searches per phase, seeds seed,
    seed + 1, ...: the best return is kept, every one reported), and `high`, the
    format of the phases not searched."""
    spec = _check_keys(where, spec, _RL_KEYS)
    for key in ("relative_budget", "budget_bits", "budget_joules"):
        if key in spec:
            _check_value(f"{where}.{key}", spec[key], float, 0)
            if not spec[key] > 0:
                raise ConfigError(f"{where}.{key}: expected a positive number, got {spec[key]!r}")
    if "budget_bits" in spec and ("relative_budget" in spec or "budget_joules" in spec):
        raise ConfigError(f"{where}.budget_bits: give a bits budget or a joules budget "
                          "(relative_budget, budget_joules), not both")
    _check_value(f"{where}.episodes", spec.get("episodes", 1), int, 1)
    _check_value(f"{where}.seed", spec.get("seed", 0), int, 0)
    _check_value(f"{where}.search_seeds", spec.get("search_seeds", 1), int, 1)
    if "high" in spec:
        _check_format(f"{where}.high", spec["high"])
    candidates = _check_value(f"{where}.candidates", spec.get("candidates", ["FP16"]), list)
    if not candidates:
        raise ConfigError(f"{where}.candidates: expected at least one format")
    for i, fmt in enumerate(candidates):
        _check_format(f"{where}.candidates[{i}]", fmt)
    for i, phase in enumerate(_check_value(f"{where}.phases", spec.get("phases", []), list)):
        _check_phase(f"{where}.phases[{i}]", phase)
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


def check_seeds(where: str, seeds: Any) -> List[int]:
    """Seeds as the config and --seeds take them: a non-empty list of distinct
    integers in [0, 10^6). A repeated seed would be the same run twice under one run
    tag: its energy booked twice, and a noise floor of a run against itself."""
    if not isinstance(seeds, list) or not seeds or \
            not all(isinstance(s, int) and 0 <= s < 10**6 for s in seeds):
        raise ConfigError(f"{where}: expected a non-empty list of integers in [0, 10^6), "
                          f"got {seeds!r}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"{where}: each seed may appear once; {repeated} repeated in {seeds!r}")
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

    seeds = check_seeds("seeds", data.get("seeds", DEFAULT_SEEDS))
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
