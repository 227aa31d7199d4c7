"""What an experiment's runs mean: per-configuration aggregates with intervals, the
noise floor, each phase alone, energy ranges, three-valued verdicts, and the files
a reviewer reads (results.csv, runs.csv, summary.json, pareto.png, curves.png,
report.md).

Every quality figure is paired: a configuration's seed s is judged against the FP16
baseline of the same seed s, on the same held-out prompts, and its interval is a
hierarchical bootstrap over seeds and prompts (`mxserve.stats`). Energy is the FPGA
model's estimate (the daemon's ledger) with a range over the model's parameter box
(`mxserve.energy_model`), or a GPU's measurement, labelled as such.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mxserve import stats
from mxserve._wire import PHASES

if TYPE_CHECKING:  # a type only: run.py imports this module
    from mxserve.experiment.run import RunResult

__all__ = ["LEVEL", "criteria", "energy_ranges", "energy_total", "pareto_front", "summarize",
           "write_outputs"]

LEVEL = 0.95
RESAMPLES = 2000
NOISE_FLOOR = "noise-floor"
UNTRAINED = "untrained"
# The criteria's thresholds (../shared/ORIGIN.md, "Success criteria").
MEASURABLE_SAVING_PCT = 1.0
# Configurations that choose formats per layer (the rest are uniform or one phase).
ADAPTIVE = ("INT8-A", "INT8-B", "INT8-C", "INT8-D", "MX-B", "MX-D", "MX-budget")
# The rollout–learner mismatch metrics (verl's names, `ppo.mismatch_metrics`) averaged
# over a run's steps.
MISMATCH_PREFIX = "rollout_corr/"
MISMATCH_KEYS = tuple(MISMATCH_PREFIX + k for k in (
    "rollout_is_mean", "rollout_is_std", "rollout_is_min", "rollout_is_max",
    "rollout_is_eff_sample_size", "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low", "kl", "k3_kl", "training_ppl", "rollout_ppl",
    "log_ppl_diff"))


# --- small helpers -----------------------------------------------------------------------


def _as_dict(run: Any) -> Dict[str, Any]:
    """A run as summary.json holds it: RunResults become dicts once, here, so the
    aggregation reads fresh runs and reloaded ones alike."""
    return run if isinstance(run, dict) else dataclasses.asdict(run)


def energy_total(run: Dict[str, Any], source: str) -> float:
    """A run's joules from `source` over the three phases."""
    return phase_sum(run["energy"], source)


def phase_sum(energy: Dict[str, Dict[str, float]], source: str) -> float:
    """{phase: {source: joules}} summed over the phases for one source."""
    return sum(energy.get(p, {}).get(source, 0.0) for p in PHASES)


def _model_seconds(run: Any) -> float:
    busy = run["busy_seconds"]
    return sum(busy.get(p, {}).get("fpga_model", 0.0) for p in PHASES)


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def _std(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if len(values) < 2:
        return 0.0 if values else float("nan")
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _cells(runs: Sequence[Any], name: str) -> Optional[np.ndarray]:
    """The per-prompt list `name` of each run stacked as [runs, prompts], or None
    when a run lacks it."""
    rows = [r.get(name) for r in runs]
    if not rows or any(not row for row in rows) or len({len(row) for row in rows}) != 1:
        return None
    return np.asarray(rows, dtype=np.float64)


def _interval_fields(prefix: str, interval: Optional[stats.Interval]) -> Dict[str, float]:
    if interval is None:
        return {}
    return {prefix: interval.estimate, f"{prefix}_lo": interval.low, f"{prefix}_hi": interval.high}


# --- aggregation -------------------------------------------------------------------------


def _pairs(group: Sequence[Any], baselines: Dict[Tuple[int, int], Any]):
    """The group's runs and their same-seed baselines, in seed order."""
    paired = [(r, baselines.get((r["seed"], r["repetition"]))) for r in group]
    paired = [(r, b) for r, b in paired if b is not None]
    paired.sort(key=lambda rb: (rb[0]["seed"], rb[0]["repetition"]))
    return [r for r, _ in paired], [b for _, b in paired]


def _quality(row: Dict[str, Any], runs: Sequence[Any], reference_judge: Optional[np.ndarray],
             kls: Optional[np.ndarray], level: float) -> None:
    """Win rate (against the paired reference's judge scores), held-out reward, KL
    and reward ρ, each with its interval, into `row`."""
    judge = _cells(runs, "judge_scores")
    if judge is None:
        return
    row.update(_interval_fields("held_out_reward",
                                stats.mean_interval(judge, level=level, resamples=RESAMPLES)))
    if reference_judge is not None and reference_judge.shape == judge.shape:
        win = stats.win_rate(judge, reference_judge, level=level, resamples=RESAMPLES)
        row.update(_interval_fields("win_rate", win.interval))
        row.update({"wins": win.wins, "ties": win.ties, "losses": win.losses})
        drop = win.drop_points
        row.update({"win_rate_drop_pp": drop.estimate, "win_rate_drop_pp_lo": drop.low,
                    "win_rate_drop_pp_hi": drop.high})
        row["_outcomes"] = stats.outcomes(judge, reference_judge)
    if kls is not None and kls.shape == judge.shape:
        row.update(_interval_fields("kl_vs_fp16",
                                    stats.mean_interval(kls, level=level, resamples=RESAMPLES)))
    own = _cells(runs, "reward_scores")
    if own is not None and own.shape == judge.shape and judge.shape[1] > 1:
        row.update(_interval_fields("reward_spearman",
                                    stats.spearman_interval(own, judge, level=level,
                                                            resamples=RESAMPLES)))
    row["prompts"], row["seeds"] = judge.shape[1], judge.shape[0]


def _energy(row: Dict[str, Any], group: Sequence[Any], base_runs: Sequence[Any]) -> None:
    """Per source and phase: mean and std over the group's runs; savings against the
    baseline's mean; the FPGA model's speedup."""
    for source in ("fpga_model", "fpga", "gpu_baseline", "gpu_baseline_sampled"):
        totals = [energy_total(r, source) for r in group]
        if not any(totals):
            continue
        row[f"energy_{source}_J"] = _mean(totals)
        row[f"energy_{source}_J_std"] = _std(totals)
        for phase in PHASES:
            values = [r["energy"][phase].get(source, 0.0) for r in group]
            row[f"energy_{source}_{phase}_J"] = _mean(values)
            row[f"energy_{source}_{phase}_J_std"] = _std(values)
    energy = row.get("energy_fpga_model_J")
    base_energy = _mean([energy_total(r, "fpga_model") for r in base_runs])
    if energy is None or not base_energy:
        return
    row["energy_saving_pct"] = 100.0 * (1.0 - energy / base_energy)
    for phase in PHASES:
        base_phase = _mean([r["energy"][phase].get("fpga_model", 0.0) for r in base_runs])
        if base_phase:
            row[f"energy_saving_{phase}_pct"] = 100.0 * (
                1.0 - row[f"energy_fpga_model_{phase}_J"] / base_phase)
    seconds = _mean([_model_seconds(r) for r in group])
    row["model_seconds"] = seconds
    row["speedup_model"] = _mean([_model_seconds(r) for r in base_runs]) / seconds \
        if seconds else float("nan")


def _mismatch(row: Dict[str, Any], group: Sequence[Any]) -> None:
    """verl's rollout–learner mismatch metrics, the mean over every step of every run."""
    curves = [c for r in group for c in r["curves"]]
    for key in MISMATCH_KEYS:
        values = [c[key] for c in curves if key in c]
        if values:
            row[key] = _mean(values)


def summarize(runs: List[Any], baseline: str, level: float = LEVEL,
              energy_ranges: Optional[Dict[str, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """One row per configuration (the baseline first, then the noise floor and the
    untrained policy, then the rest in run order): energy means over seeds, and every
    quality figure with its interval against the same seed's FP16 baseline."""
    runs = [_as_dict(r) for r in runs]
    by_config: Dict[str, List[Dict[str, Any]]] = {}
    for run in runs:
        by_config.setdefault(run["configuration"], []).append(run)
    base_runs = sorted(by_config[baseline], key=lambda r: (r["seed"],
                                                           r["repetition"]))
    baselines = {(r["seed"], r["repetition"]): r for r in base_runs}
    rows: List[Dict[str, Any]] = []
    for name, group in by_config.items():
        first = group[0]
        row: Dict[str, Any] = {"configuration": name, "policy": first["policy"],
                               "kind": first["kind"], "where": first["where"],
                               "runs": len(group)}
        if first.get("energy_label"):
            row["energy_label"] = first.get("energy_label")
            idle = [r.get("idle_watts") for r in group if r.get("idle_watts") is not None]
            if idle:
                row["idle_watts"] = _mean(idle)
            row["energy_counter"] = bool(first.get("energy_counter"))
        _energy(row, group, base_runs)
        mine, theirs = _pairs(group, baselines)
        reference = _cells(theirs, "judge_scores")
        kls = None if name == baseline else _cells(mine, "kls")
        _quality(row, mine, reference, kls, level)
        if name == baseline:
            # Each seed's baseline against itself: a tie and KL 0 by identity, not
            # estimates (the floor that a sample of ties gets does not apply).
            row["kl_vs_fp16"], row["kl_vs_fp16_lo"], row["kl_vs_fp16_hi"] = 0.0, 0.0, 0.0
            if "win_rate" in row:
                row["win_rate"], row["win_rate_lo"], row["win_rate_hi"] = 0.5, 0.5, 0.5
                row["win_rate_drop_pp"] = row["win_rate_drop_pp_lo"] = 0.0
                row["win_rate_drop_pp_hi"] = 0.0
        _mismatch(row, group)
        if energy_ranges and name in energy_ranges:
            row.update(energy_ranges[name])
        rows.append(row)
        if name == baseline:
            floor = _noise_floor(base_runs, level)
            if floor is not None:
                rows.append(floor)
    return rows


def _noise_floor(base_runs: Sequence[Any], level: float) -> Optional[Dict[str, Any]]:
    """The FP16 baseline of each later seed judged against the previous seed's: how
    far two runs of the same configuration land apart by training noise alone."""
    later = [r for r in base_runs if r.get("noise_vs_seed") is not None]
    if not later:
        return None
    by_seed = {r["seed"]: r for r in base_runs}
    previous = [by_seed[r.get("noise_vs_seed")] for r in later]
    row: Dict[str, Any] = {
        "configuration": NOISE_FLOOR, "kind": "noise-floor", "where": later[0]["where"],
        "runs": len(later),
        "policy": "FP16 seed " + ", ".join(f"{r['seed']} vs {r['noise_vs_seed']}"
                                          for r in later)}
    _quality(row, later, _cells(previous, "judge_scores"), _cells(later, "noise_kls"), level)
    # Both sides score in FP16: a reward ρ here would be 1 by construction.
    for key in ("reward_spearman", "reward_spearman_lo", "reward_spearman_hi"):
        row.pop(key, None)
    return row


# --- verdicts ----------------------------------------------------------------------------


@dataclasses.dataclass
class Criterion:
    level: str
    statement: str
    status: str                      # "met", "not met", "unresolved"
    detail: str = ""                 # half-width, prompts needed, correction

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _combine(*statuses: str) -> str:
    """All parts met → met; any part not met → not met; else unresolved."""
    if any(s == "not met" for s in statuses):
        return "not met"
    return "met" if all(s == "met" for s in statuses) else "unresolved"


def _any(statuses: Sequence[str]) -> str:
    """"Any of k" meets it: met if one is met, unresolved if one still may be, else
    (none, or all not met) not met."""
    return "met" if "met" in statuses else \
        "unresolved" if "unresolved" in statuses else "not met"


def _range_status(low: Optional[float], high: Optional[float], threshold: float) -> str:
    """A saving over the energy model's parameter box against `threshold` (%):
    met only when the whole range is above it."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "unresolved"
    return "met" if low > threshold else "not met" if high <= threshold else "unresolved"


def _drop_interval(row: Dict[str, Any]) -> Optional[stats.Interval]:
    if "win_rate_drop_pp" not in row:
        return None
    return stats.Interval(row["win_rate_drop_pp"], row["win_rate_drop_pp_lo"],
                          row["win_rate_drop_pp_hi"], LEVEL, row.get("seeds", 1),
                          row.get("prompts", 0))


def _saving_bounds(row: Dict[str, Any]) -> Tuple[Optional[float], Optional[float]]:
    """The saving's range over the energy model's parameter box, or the nominal
    saving at both ends when no range was computed."""
    nominal = row.get("energy_saving_pct")
    return row.get("energy_saving_pct_min", nominal), row.get("energy_saving_pct_max", nominal)


def _describe(v: stats.Verdict, unit: str = "") -> str:
    need = f"; about {v.prompts_needed} prompts per seed would resolve it (80 % power)" \
        if v.status == "unresolved" and v.prompts_needed else ""
    return f"interval half-width {v.half_width:.3g}{unit}{need}"


def criteria(rows: List[Dict[str, Any]], baseline: str = "FP16",
             level: float = LEVEL) -> List[Criterion]:
    """ORIGIN.md's success criteria, each met / not met / unresolved by its whole
    interval: quality by the bootstrap interval of the win-rate drop, energy by the
    saving's range over the energy model's parameter box. A criterion any of k
    configurations may meet tests each at the Bonferroni level 1 − α/k."""
    by_name = {r["configuration"]: r for r in rows}
    quantized = [r for r in rows if r.get("kind") == "trained" and r["configuration"] != baseline
                 and "energy_saving_pct" in r]
    checks: List[Criterion] = []

    if quantized:
        best = max(quantized, key=lambda r: _saving_bounds(r)[0])
        low, high = _saving_bounds(best)
        checks.append(Criterion(
            "minimum", f"one policy saves measurable energy (> {MEASURABLE_SAVING_PCT:.0f} %): "
                       f"{best['configuration']} saves {best['energy_saving_pct']:.1f} % "
                       f"(range {low:.1f} to {high:.1f} % over the energy model's parameters)",
            _range_status(low, high, MEASURABLE_SAVING_PCT)))

    d = by_name.get("MX-D")
    if d is not None and _drop_interval(d) is not None:
        low, high = _saving_bounds(d)
        drop = _drop_interval(d)
        for level_name, need_saving, max_drop in (("target", 30.0, 10.0), ("stretch", 50.0, 5.0)):
            quality = stats.verdict(drop, max_drop, "below")
            energy = _range_status(low, high, need_saving)
            checks.append(Criterion(
                level_name,
                f"policy D: {d['energy_saving_pct']:.1f} % energy saving (range {low:.1f} to "
                f"{high:.1f} %: {energy}), win-rate drop {drop.estimate:+.1f} pp "
                f"[{drop.low:+.1f}, {drop.high:+.1f}] ({quality.status}); needs > "
                f"{need_saving:.0f} % with < {max_drop:.0f} pp",
                _combine(energy, quality.status), _describe(quality, " pp")))

    fast = [r for r in quantized if r.get("speedup_model", 0) > 1.5 and "win_rate_drop_pp" in r]
    if quantized:
        k = max(len(fast), 1)
        corrected = stats.bonferroni_level(k, level)
        results = []
        for r in fast:
            drop = _corrected_drop(r, corrected)
            results.append((r["configuration"], stats.verdict(drop, 10.0, "below")))
        status = _any([v.status for _, v in results])
        listed = ", ".join(f"{n} ({v.status})" for n, v in results) or "none reaches 1.5×"
        checks.append(Criterion(
            "target (first formulation)",
            f"> 1.5× speedup (FPGA model) with < 10 pp win-rate drop, any of {len(fast)}: {listed}",
            status, f"each at the Bonferroni level {100 * corrected:.2f} %"))

    uniform = by_name.get("INT8-uniform")
    adaptive = [by_name[n] for n in ADAPTIVE if n in by_name and "_outcomes" in by_name[n]]
    if uniform is not None and "_outcomes" in uniform and adaptive:
        corrected = stats.bonferroni_level(len(adaptive), level)
        results = []
        for r in adaptive:
            diff = stats.paired_difference(r["_outcomes"], uniform["_outcomes"], level=corrected,
                                           resamples=RESAMPLES, bounds=(-1.0, 1.0))
            cheaper = r.get("energy_saving_pct", -1.0) >= 0.0
            status = stats.verdict(diff, 0.0, "above").status if cheaper else "not met"
            results.append((r["configuration"], diff, status))
        status = _any([s for *_, s in results])
        listed = ", ".join(f"{n} {d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
                           for n, d, _ in results)
        checks.append(Criterion(
            "target (first formulation)",
            f"layer-adaptive beats uniform INT8 on win rate (Δ against INT8-uniform, paired): "
            f"{listed}", status,
            f"{len(adaptive)} configurations, each at the Bonferroni level "
            f"{100 * corrected:.2f} %; an adaptive policy must also cost no more than FP16"))

    untrained = by_name.get(UNTRAINED)
    if untrained is not None and "win_rate" in untrained:
        interval = stats.Interval(untrained["win_rate"], untrained["win_rate_lo"],
                                  untrained["win_rate_hi"], level, untrained.get("seeds", 1),
                                  untrained.get("prompts", 0))
        v = stats.verdict(interval, 0.5, "below")
        checks.append(Criterion(
            "sanity", f"PPO learned: the untrained policy wins {interval.estimate:.3f} "
                      f"[{interval.low:.3f}, {interval.high:.3f}] against the trained FP16 "
                      "baseline (below 0.5 if training helped)", v.status, _describe(v)))
    return checks


def _corrected_drop(row: Dict[str, Any], level: float) -> stats.Interval:
    """The win-rate drop of `row` with its interval recomputed at `level`."""
    outcomes = row["_outcomes"]
    win = stats.win_rate_from_outcomes(outcomes, level=level, resamples=RESAMPLES)
    return win.drop_points


# --- outputs -----------------------------------------------------------------------------


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


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.{digits}f}"
    return str(value)


def _ci(row: Dict[str, Any], key: str, digits: int = 3) -> str:
    """"estimate [low, high]" of an interval field, or "–"."""
    if key not in row or row[key] is None or (isinstance(row[key], float) and math.isnan(row[key])):
        return "–"
    if f"{key}_lo" not in row:
        return _fmt(row[key], digits)
    return f"{row[key]:.{digits}f} [{row[key + '_lo']:.{digits}f}, {row[key + '_hi']:.{digits}f}]"


def _pm(row: Dict[str, Any], key: str, digits: int = 3) -> str:
    if key not in row:
        return "–"
    std = row.get(f"{key}_std", 0.0)
    return f"{row[key]:.{digits}g} ± {std:.1g}" if std else f"{row[key]:.{digits}g}"


def _saving(row: Dict[str, Any], phase: Optional[str] = None) -> str:
    key = "energy_saving_pct" if phase is None else f"energy_saving_{phase}_pct"
    if key not in row:
        return "–"
    low, high = row.get(f"{key}_min"), row.get(f"{key}_max")
    if low is None or high is None:
        return f"{row[key]:.1f}"
    return f"{row[key]:.1f} ({low:.0f} to {high:.0f})"


def _plain(row: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def write_outputs(out: str, experiment: Any, task: Any, runs: List[Any],
                  info: Dict[str, Any], baseline: str,
                  energy_ranges: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, Any]:
    os.makedirs(out, exist_ok=True)
    runs = [_as_dict(r) for r in runs]
    rows = summarize(runs, baseline, energy_ranges=energy_ranges)
    checks = criteria(rows, baseline)
    columns: List[str] = []
    for row in rows:
        columns += [k for k in _plain(row) if k not in columns]
    with open(os.path.join(out, "results.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                             for k, v in _plain(row).items()})
    with open(os.path.join(out, "runs.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["configuration", "policy", "kind", "seed", "repetition", "run_tag", "where",
                         "fpga_model_J", "gpu_baseline_J", "gpu_baseline_sampled_J",
                         "energy_label", "held_out_reward", "win_rate", "kl_vs_fp16",
                         "reward_spearman", *MISMATCH_KEYS])
        for r in runs:
            steps = r["curves"]
            mismatch = [_mean([c[k] for c in steps if k in c]) for k in MISMATCH_KEYS]
            writer.writerow([r["configuration"], r["policy"], r["kind"],
                             r["seed"], r["repetition"], r["run_tag"],
                             r["where"], f"{energy_total(r, 'fpga_model'):.6g}",
                             f"{energy_total(r, 'gpu_baseline'):.6g}",
                             f"{energy_total(r, 'gpu_baseline_sampled'):.6g}",
                             r.get("energy_label"), f"{r['held_out_reward']:.6g}",
                             f"{r['win_rate']:.6g}", f"{r['kl_vs_fp16']:.6g}",
                             f"{r['reward_spearman']:.6g}",
                             *(f"{v:.6g}" for v in mismatch)])
    summary = {"experiment": experiment.name, "task": task.description, "task_setup": task.setup,
               "ppo": dataclasses.asdict(experiment.ppo), "steps": experiment.steps,
               "seeds": experiment.seeds, "repetitions": experiment.repetitions,
               "eval_prompts": min(experiment.eval_prompts, len(task.test_prompts)),
               "statistics": {"level": LEVEL, "resamples": RESAMPLES,
                              "method": "hierarchical percentile bootstrap: seeds, then "
                                        "prompts (one prompt draw shared by the drawn seeds)",
                              "kl": "exact KL(π_q ‖ π_FP16) over the vocabulary at the sampling "
                                    "temperature, on the configuration's own responses, summed "
                                    "over response tokens; π_FP16 is the same seed's baseline"},
               **info, "configurations": [_plain(r) for r in rows],
               "criteria": [c.as_dict() for c in checks],
               "runs": runs}
    with open(os.path.join(out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1, default=float, allow_nan=True)
    _plots(rows, runs, out, baseline)
    _report(out, experiment, task, rows, checks, info, baseline)
    return summary


def _plots(rows, runs, out: str, baseline: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if "energy_saving_pct" in r and "win_rate_drop_pp" in r
             and r.get("kind") == "trained"]
    points = [(r["energy_saving_pct"], r["win_rate_drop_pp"]) for r in shown]
    front = pareto_front(points)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, (row, (x, y)) in enumerate(zip(shown, points)):
        xerr = [[x - row.get("energy_saving_pct_min", x)], [row.get("energy_saving_pct_max", x) - x]]
        yerr = [[y - row["win_rate_drop_pp_lo"]], [row["win_rate_drop_pp_hi"] - y]]
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="o", markersize=5, capsize=2,
                    elinewidth=0.8, color="tab:red" if i in front else "tab:blue", zorder=3)
        ax.annotate(row["configuration"], (x, y), textcoords="offset points", xytext=(5, 4),
                    fontsize=7)
    if front:
        ax.plot([points[i][0] for i in front], [points[i][1] for i in front], color="tab:red",
                linewidth=1, label="Pareto front (point estimates)", zorder=2)
    floor = next((r for r in rows if r["configuration"] == NOISE_FLOOR), None)
    if floor is not None and "win_rate_drop_pp_lo" in floor:
        ax.axhspan(floor["win_rate_drop_pp_lo"], floor["win_rate_drop_pp_hi"], color="grey",
                   alpha=0.15, label="noise floor (FP16 vs FP16, other seed), 95 %")
    ax.axhline(10, color="grey", linestyle=":", linewidth=1, label="target: < 10 pp drop")
    ax.axvline(30, color="grey", linestyle="--", linewidth=1, label="target: > 30 % saving")
    ax.set_xlabel("energy saving vs FP16, % (FPGA model; bars: parameter range)")
    ax.set_ylabel("win-rate drop vs FP16, pp (bars: 95 % bootstrap)")
    ax.set_title("Energy saving vs alignment quality")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pareto.png"), dpi=120)
    plt.close(fig)

    keys = [("objective/rlhf_reward", "RLHF reward"), ("objective/kl", "KL to reference"),
            (MISMATCH_PREFIX + "rollout_is_mean", "rollout IS weight mean (verl)"),
            (MISMATCH_PREFIX + "k3_kl", "K3 KL(rollout ‖ learner) (verl)")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    first_seed = min(r["seed"] for r in runs)
    for (key, title), ax in zip(keys, axes.ravel()):
        for run in runs:
            curves = run["curves"]
            if run["repetition"] == 0 and run["seed"] == first_seed and curves \
                    and key in curves[0]:
                ax.plot([c["step"] for c in curves], [c[key] for c in curves],
                        label=run["configuration"], linewidth=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("PPO step")
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=6, ncol=2)
    fig.suptitle(f"Training curves (seed {first_seed})")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


# config.PHASE_ALONE_FORMATS' order (not imported: config imports this module's callers).
_PHASE_FORMAT_ORDER = ("MXFP4", "NVFP4", "MXFP8", "INT8")


def _phase_table(rows: List[Dict[str, Any]], baseline: str) -> List[str]:
    """Rows phases, columns formats: Δ win rate, KL and ρ with intervals and that
    phase's energy saving, for the configurations that quantize one phase alone."""
    by_name = {r["configuration"]: r for r in rows}
    formats = sorted({name.split("-", 1)[1] for name in by_name
                      if name.split("-", 1)[0] in PHASES and "-" in name},
                     key=lambda f: _PHASE_FORMAT_ORDER.index(f)
                     if f in _PHASE_FORMAT_ORDER else 9)
    if not formats:
        return []
    lines = ["## Each phase alone", "",
             "One phase in the format on every layer, the other two in FP16. Cells: Δ win "
             "rate against FP16 (same seed), KL(π_q ‖ π_FP16), reward ρ, each with its 95 % "
             "interval; then that phase's FPGA-model energy saving (range over the model's "
             "parameters).", "",
             "| phase | " + " | ".join(formats) + " |", "|---|" + "---|" * len(formats)]
    for phase in PHASES:
        cells = []
        for fmt in formats:
            r = by_name.get(f"{phase}-{fmt}")
            if r is None or "win_rate" not in r:
                cells.append("–")
                continue
            delta = f"{r['win_rate'] - 0.5:+.3f} [{r['win_rate_lo'] - 0.5:+.3f}, " \
                    f"{r['win_rate_hi'] - 0.5:+.3f}]"
            cells.append(f"Δwin {delta}<br>KL {_ci(r, 'kl_vs_fp16')}<br>ρ "
                         f"{_ci(r, 'reward_spearman')}<br>saving {_saving(r, phase)} %")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return lines + [""]


def _energy_section(rows: List[Dict[str, Any]], baseline: str) -> List[str]:
    base = next((r for r in rows if r["configuration"] == baseline), None)
    if base is None or "energy_fpga_model_J" not in base:
        return []
    total = base["energy_fpga_model_J"]
    lines = ["## Where the joules go", "",
             f"The FP16 baseline's training run, FPGA model: {total:.4g} J in all; "
             + ", ".join(f"{p} {base[f'energy_fpga_model_{p}_J']:.3g} J "
                         f"({100 * base[f'energy_fpga_model_{p}_J'] / total:.0f} %)"
                         for p in PHASES) + ".", ""]
    sensitive = [r for r in rows if r.get("energy_sensitive_parameters")]
    # Each configuration's range has its own box (the parameters its formats
    # touch): name the ones the tables show, not the baseline's.
    methods: Dict[str, List[str]] = {}
    for r in rows:
        if r["configuration"] != baseline and "energy_saving_pct_min" in r \
                and r.get("energy_range_method"):
            methods.setdefault(r["energy_range_method"], []).append(r["configuration"])
    if methods:
        method = "; ".join(m if len(methods) == 1 else f"{', '.join(c)}: {m}"
                           for m, c in methods.items())
        lines += ["Savings in the tables are the nominal figure with its range over the "
                  f"energy model's parameter box (fpga/model/energy_model.json, 'ranges'; "
                  f"{method}): the configuration and the baseline are evaluated under the same "
                  "parameters, so the range is that of the ratio.", ""]
    if sensitive:
        lines += ["| configuration | saving % (range) | rollout | reward | update | most "
                  "sensitive to |", "|---|---|---|---|---|---|"]
        for r in sensitive:
            lines.append(f"| {r['configuration']} | {_saving(r)} | "
                         + " | ".join(_saving(r, p) for p in PHASES)
                         + f" | {r['energy_sensitive_parameters']} |")
        lines.append("")
    gpu = [r for r in rows if "energy_gpu_baseline_J" in r]
    for r in gpu:
        label = r.get("energy_label", "measured")
        what = "a REPLAYED power trace (not a measurement of this run)" if label == "replayed" \
            else "measured on the GPU"
        line = f"GPU baseline `{r['configuration']}` ({what}): {r['energy_gpu_baseline_J']:.4g} J"
        if "energy_gpu_baseline_sampled_J" in r:
            sampled = r["energy_gpu_baseline_sampled_J"]
            counter = r["energy_gpu_baseline_J"]
            line += (f" from NVML's energy counter read at each phase boundary; the integrated "
                     f"power samples give {sampled:.4g} J ({100 * (sampled / counter - 1):+.1f} %)")
        elif label != "replayed":
            line += " from integrated power samples (this GPU has no energy counter)"
        per_phase = ", ".join(f"{p} {r.get(f'energy_gpu_baseline_{p}_J', 0.0):.4g} J"
                              for p in PHASES)
        idle = f" Idle power before the run: {r['idle_watts']:.1f} W (included in the " \
               "joules above, not subtracted)." if r.get("idle_watts") is not None else ""
        lines += [line + f"; per phase {per_phase}.{idle}", ""]
    return lines


def _report(out, experiment, task, rows, checks: List[Criterion], info, baseline) -> None:
    seeds = ", ".join(str(s) for s in experiment.seeds)
    prompts = min(experiment.eval_prompts, len(task.test_prompts))
    floor = next((r for r in rows if r["configuration"] == NOISE_FLOOR), None)
    lines = [f"# Experiment `{experiment.name}`", "",
             f"{task.description}. PPO {experiment.steps} steps × batch "
             f"{experiment.ppo.batch_size}, responses up to {experiment.ppo.response_length} "
             f"tokens; **seeds {seeds}** × {experiment.repetitions} repetition(s); "
             f"**{prompts} held-out prompts** per seed.", "",
             f"Ran at commit `{info.get('commit', '?')}` on {info.get('machine', '?')}, daemon "
             f"backend `{info.get('backend', '?')}`, device `{info.get('device', 'cpu')}`, "
             f"compute `{info.get('compute', 'daemon')}`, "
             f"{info.get('duration_s', 0):.0f} s in all ({info.get('date', '')}).", "",
             "**How to read it.** Every quality figure pairs a configuration's seed s with the "
             "FP16 baseline of the same seed on the same prompts. Brackets are 95 % intervals "
             f"from a hierarchical bootstrap ({RESAMPLES} resamples: seeds, then prompts). Win "
             "rate: the judge (the task's reward model in FP16, which scores each response "
             "alone, so the order of a pair cannot matter) prefers this configuration's "
             "response; ties count half; W/T/L are the counts. KL: exact KL(π_q ‖ π_FP16) over "
             "the vocabulary at the sampling temperature, on the configuration's own responses, "
             "summed over response tokens and averaged over responses. ρ: Spearman rank "
             "correlation of the configuration's reward-model scores (its reward formats) with "
             "the judge's, per seed, averaged. Energy and FPGA time are **FPGA-model "
             "estimates** (the daemon's model of the MX datapath, its parameters in "
             "fpga/model/energy_model.json), mean ± std over seeds; quality is exact for the "
             "FPGA (the emulation is bit-identical to its datapath)."]
    if floor is not None and "win_rate_lo" in floor:
        lines += ["", f"**Noise floor**: the FP16 baseline of one seed against another's wins "
                      f"{floor['win_rate']:.3f} [{floor['win_rate_lo']:.3f}, "
                      f"{floor['win_rate_hi']:.3f}] with KL {_ci(floor, 'kl_vs_fp16')}: a "
                      "configuration's difference smaller than this is training noise, not its "
                      "formats."]
    lines += ["", "| configuration | policy | energy (J) | saving % (range) | rollout / reward / "
              "update saving % | FPGA-model speedup | held-out reward | win rate vs FP16 | W/T/L | "
              "KL(π‖π_FP16) | reward ρ |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        phase_savings = " / ".join(_fmt(r.get(f"energy_saving_{p}_pct"), 0) for p in PHASES)
        wtl = f"{r['wins']}/{r['ties']}/{r['losses']}" if "wins" in r else "–"
        policy = f"`{r['policy']}`" if r.get("policy") else ""
        lines.append(
            f"| {r['configuration']} | {policy} | {_pm(r, 'energy_fpga_model_J', 4)} | "
            f"{_saving(r)} | {phase_savings} | {_fmt(r.get('speedup_model'))}× | "
            f"{_ci(r, 'held_out_reward')} | {_ci(r, 'win_rate')} | {wtl} | "
            f"{_ci(r, 'kl_vs_fp16', 4)} | {_ci(r, 'reward_spearman')} |")
    lines += ["", f"`{UNTRAINED}` is the initial policy, evaluated without any PPO step "
                  f"(against each seed's trained FP16 baseline); `{NOISE_FLOOR}` is the FP16 "
                  "baseline of a later seed against the previous seed's.", ""]
    lines += _phase_table(rows, baseline)
    lines += _energy_section(rows, baseline)
    mismatch = [r for r in rows if MISMATCH_PREFIX + "rollout_is_mean" in r]
    if mismatch:
        lines += ["## Rollout–learner mismatch (verl's metrics, mean over steps and seeds)", "",
                  "Token-level importance weight w = π_learner / π_rollout on the rollout's "
                  "tokens (before truncation at the cap); ESS as a share of the tokens; K1 and "
                  "K3 estimate KL(π_rollout ‖ π_learner); the log-perplexity gap is rollout "
                  "minus learner. verl warns when the mean leaves [0.5, 2], ESS < 0.3 or "
                  "|KL| > 0.1.", "",
                  "| configuration | is mean | is min / max | ESS | > cap | K1 KL | K3 KL | "
                  "log-ppl gap |", "|---|---|---|---|---|---|---|---|"]
        for r in mismatch:
            m = {k[len(MISMATCH_PREFIX):]: v for k, v in r.items() if k.startswith(MISMATCH_PREFIX)}
            lines.append(f"| {r['configuration']} | {_fmt(m.get('rollout_is_mean'), 4)} | "
                         f"{_fmt(m.get('rollout_is_min'), 3)} / {_fmt(m.get('rollout_is_max'), 3)} | "
                         f"{_fmt(m.get('rollout_is_eff_sample_size'), 3)} | "
                         f"{_fmt(m.get('rollout_is_ratio_fraction_high'), 4)} | "
                         f"{_fmt(m.get('kl'), 5)} | {_fmt(m.get('k3_kl'), 5)} | "
                         f"{_fmt(m.get('log_ppl_diff'), 4)} |")
        lines.append("")
    lines += ["## Success criteria (../shared/ORIGIN.md)", "",
              "`met` only when the whole interval (quality: 95 % bootstrap; energy: the range "
              "over the energy model's parameters) meets the criterion, `not met` when the "
              "whole interval misses it, else `unresolved`.", ""]
    for c in checks:
        detail = f" ({c.detail})" if c.detail else ""
        lines.append(f"- **{c.level}** — {c.statement}: **{c.status}**{detail}")
    lines += ["", "![Pareto](pareto.png)", "", "![Curves](curves.png)", ""]
    with open(os.path.join(out, "report.md"), "w") as handle:
        handle.write("\n".join(lines))


def energy_ranges(runs: List[RunResult], baseline: str) -> Optional[Dict[str, Dict[str, Any]]]:
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
