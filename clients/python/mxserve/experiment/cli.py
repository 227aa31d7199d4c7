"""The command line of `python3 -m mxserve.experiment`: flags over the config,
the preflight, and the run."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
from typing import List, Optional

import torch

from mxserve.client import Client, MxserveError
from mxserve.experiment.config import (PATH_ENVIRONMENT, QUICK, ConfigError, Experiment, check_seeds,
                                       load_config)
from mxserve.experiment.run import Progress, check_compute, run_experiment
from mxserve.experiment.state import RunState
from mxserve.rlhf import tasks
from mxserve.rlhf.power import PowerSourceError, check_power_source
from mxserve.torch import COMPUTE_MODES

__all__ = ["main", "preflight_estimate"]


def _at_least_one(flag: str, value: int) -> int:
    if value < 1:
        raise ConfigError(f"{flag}: expected at least 1, got {value}")
    return value


def _check_device(device: str) -> None:
    """cpu, cuda or cuda:N, refused before the preflight (torch would refuse another
    only when the run starts, with --out already written)."""
    kind, colon, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (colon and (kind == "cpu" or not index.isdigit())):
        raise ConfigError(f"--device: expected cpu, cuda or cuda:N, got {device!r}")


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
        experiment.seeds = check_seeds("--seeds", seeds)
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
                              + ("; `python3 -m mxserve.rlhf.checkpoint` writes a random-init one "
                                 "for a trial" if key == "checkpoint" else ""))


def preflight_estimate(experiment: Experiment, device: str, compute: str,
                       local_baseline: bool):
    """The preflight estimate (`mxserve.experiment.preflight`) for this experiment's model
    and matrix."""
    from mxserve.experiment import preflight
    from mxserve.rlhf.models import ModelConfig, read_model_config

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
                                         "matrix; mxserve/experiment/configs/seeds.toml)")
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
        _check_device(args.device)
        check_compute(args.device, compute)
        data = QUICK if args.quick else None
        experiment = load_config(copy.deepcopy(data) if data else args.config)
        _apply_overrides(experiment, args)
        if args.out is not None and not args.preflight_only:
            RunState.check_out(args.out, args.resume, args.overwrite)
        power = args.power_source or ("nvml" if args.device.startswith("cuda") else None)
        if power is not None:
            check_power_source(power)
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA device here")
        if _preflight(experiment, args, compute, power) and args.preflight_only:
            return 0
        with Client(args.server) as client:
            summary = run_experiment(client, experiment, args.out, progress=progress,
                                     device=args.device, power_source=power, compute=compute,
                                     resume=args.resume, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError, PowerSourceError) as error:  # ConfigError and
        # ResumeError are ValueErrors; PowerSourceError: NVML missing when the run opens it
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
    from mxserve.experiment import preflight

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
