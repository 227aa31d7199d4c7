"""Statistics for judging a quantization policy against the FP16 baseline.

The experiment trains every configuration with S seeds (2–5) and evaluates each
trained policy on the same P held-out prompts; the cell (s, p) compares seed s's
configuration with seed s's FP16 baseline on prompt p. All statistics here take
such [S, P] arrays (one row per seed, the same prompt in the same column of every
row), so the comparison stays paired twice: by seed and by prompt.

Uncertainty comes from a hierarchical paired bootstrap (`bootstrap_means`): each
replicate draws S seeds with replacement, then P prompt indices with replacement,
one draw shared by every drawn seed (the prompts are the same for every seed, so a
prompt's cells move together and the pairing by prompt survives), and the
statistic is recomputed on the resampled cells. The interval is the percentile
interval of the replicates. Resampling seeds as well as prompts is what makes the
interval honest about training noise: a configuration that won 80 % on one seed
and 20 % on another is not known to within a few points, however many prompts
each seed saw. With S = 1 the seed draw is trivial and this is the ordinary
prompt bootstrap. Where few cells differ (all wins, two tied prompts, one win
and one tie) the bootstrap has little to resample and its interval collapses;
statistics of bounded cells (win outcomes) are therefore never narrower than
exact binomial intervals on the shares of wins and losses allow (mean_interval's
`bounds`), so such samples are `unresolved`, not a pass. Caveat: with S ≤ 5 the
seed level is coarse. A two-seed
bootstrap has three distinct seed draws, and the bootstrap variance of a mean of
S seeds is (S − 1)/S of the usual unbiased estimate (half of it for two seeds),
so the between-seed part of the interval is somewhat narrow; read intervals with
the seed count beside them, and prefer more seeds to more resamples.

Public API (all numpy; nothing here needs torch or scipy):

- `Interval`: estimate, low, high, level, n_seeds, n_prompts (and `half_width`).
- `bootstrap_means(*arrays, ...)` → replicates [B, k] with shared draws.
- `mean_interval(values)` → Interval: held-out reward, per-response KL, …
- `paired_difference(a, b)` → Interval of mean(a − b) (b may be a scalar).
- `outcomes(config_scores, baseline_scores)` → [S, P] of 1 / ½ / 0.
- `win_rate(config_scores, baseline_scores, swapped=...)` and
  `win_rate_from_outcomes(outcomes, swapped_outcomes=...)` → WinRate.
- `spearman(x, y)` and `spearman_interval(x, y)` (per-seed ρ averaged over seeds).
- `verdict(interval, threshold, better)` → Verdict (met / not met / unresolved,
  half-width, prompts needed at 80 % power).
- `bonferroni_level(k, level)` for "any of k configurations meets X".
- `normal_quantile(p)` and `normal_half_width(n, p, level)`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["Interval", "Verdict", "WinRate", "average_ranks", "bonferroni_level",
           "bootstrap_means", "mean_interval", "normal_cdf", "normal_half_width",
           "normal_quantile", "outcomes", "paired_difference", "prompts_for_power", "spearman",
           "spearman_interval", "verdict", "win_rate", "win_rate_from_outcomes"]

DEFAULT_RESAMPLES = 10_000
DEFAULT_LEVEL = 0.95

ArrayLike = Union[np.ndarray, Sequence[Sequence[float]], Sequence[float]]


# --- the normal distribution ------------------------------------------------------------


def normal_cdf(x: float) -> float:
    """Φ(x), the standard normal distribution function, from math.erfc."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def normal_quantile(p: float) -> float:
    """Φ⁻¹(p) for 0 < p < 1, by bisection on Φ (math.erfc is accurate to about one
    ulp, so the bisection converges to the quantile within ~1e-15 relative;
    robust and exact enough for interval and power arithmetic, no scipy needed).
    normal_quantile(0.975) = 1.959964, (0.8) = 0.841621, (0.995) = 2.575829."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"normal_quantile: p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    # Φ is increasing; search the side the answer is on, using the tail that
    # erfc represents accurately (p near 1 is handled as 1 − p by symmetry).
    if p > 0.5:
        return -normal_quantile(1.0 - p)
    low, high = -40.0, 0.0  # Φ(−40) ≈ 4e−350 underflows below any float p
    for _ in range(200):
        mid = 0.5 * (low + high)
        if normal_cdf(mid) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-15 * max(1.0, abs(mid)):
            break
    return 0.5 * (low + high)


def normal_half_width(n: int, p: float = 0.5, level: float = DEFAULT_LEVEL) -> float:
    """The normal-approximation half-width z·sqrt(p(1−p)/n) of a proportion
    estimated on n independent prompts. At p = ½ and 95 % this is 0.98/√n, the
    "98/√n points" rule of thumb (±6.9 points at n = 200, ±3.5 at 800)."""
    return normal_quantile(0.5 + level / 2.0) * math.sqrt(p * (1.0 - p) / n)


# --- intervals ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval [low, high] at
    `level`, computed from n_seeds × n_prompts cells."""
    estimate: float
    low: float
    high: float
    level: float = DEFAULT_LEVEL
    n_seeds: int = 1
    n_prompts: int = 0

    @property
    def half_width(self) -> float:
        """(high − low) / 2: percentile intervals need not be symmetric about the
        estimate; this is their average reach."""
        return 0.5 * (self.high - self.low)

    def shifted(self, offset: float) -> "Interval":
        """The same interval for estimate − offset (e.g. a win rate relative to ½)."""
        return dataclasses.replace(self, estimate=self.estimate - offset, low=self.low - offset,
                                   high=self.high - offset)


def _cells(values: ArrayLike, name: str) -> np.ndarray:
    """values as a finite float64 [S, P] array ([P] is read as one seed)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name}: expected an [S seeds, P prompts] array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: every cell must be finite (got nan or inf)")
    return x


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


# Replicates are drawn and reduced a block at a time, the block sized so each
# [block, P] float64 temporary stays near 96 KiB: below malloc's mmap threshold and
# in cache. Large temporaries cost page faults on every allocation, which made the
# same work several times slower. The block size is a function of P alone, so the
# draws (and every interval) are a deterministic function of (seed, S, P, B).
BLOCK_BYTES = 96 * 1024


def _block_rows(prompts: int) -> int:
    return max(4, min(1024, BLOCK_BYTES // (8 * prompts)))


def _generator(seed: Union[int, np.random.Generator, None]) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _draw_indices(rng: np.random.Generator, seeds: int, prompts: int,
                  resamples: int) -> Tuple[np.ndarray, np.ndarray]:
    """The hierarchical draw of `resamples` replicates: [B, S] seed indices, then
    [B, P] prompt indices (one prompt draw per replicate, shared by all its drawn
    seeds, which keeps the cells of a prompt together: the pairing by prompt)."""
    seed_idx = rng.integers(0, seeds, size=(resamples, seeds))
    prompt_idx = rng.integers(0, prompts, size=(resamples, prompts))
    return seed_idx, prompt_idx


def _counts(indices: np.ndarray, n: int) -> np.ndarray:
    """[B, k] indices into range(n) → [B, n] float64 counts of each index per row."""
    rows = indices.shape[0]
    flat = indices + (np.arange(rows) * n)[:, None]
    return np.bincount(flat.ravel(), minlength=rows * n).reshape(rows, n).astype(np.float64)


def _count_blocks(seeds: int, prompts: int, resamples: int,
                  seed: Union[int, np.random.Generator, None]
                  ) -> Iterator[Tuple[slice, np.ndarray, np.ndarray]]:
    """The replicates' draws as multiplicities, a block of replicates at a time:
    (which replicates, seed counts [b, S], prompt counts [b, P]). Replicate r's
    statistic on the resampled cells is a function of how often each seed and
    each prompt was drawn, so no [B, S, P] array is ever built."""
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    rng = _generator(seed)
    block = _block_rows(prompts)
    for start in range(0, resamples, block):
        size = min(block, resamples - start)
        seed_idx, prompt_idx = _draw_indices(rng, seeds, prompts, size)
        yield slice(start, start + size), _counts(seed_idx, seeds), _counts(prompt_idx, prompts)


def _replicate_means(x: np.ndarray, seed_counts: np.ndarray,
                     prompt_counts: np.ndarray) -> np.ndarray:
    """Mean over the resampled cells of each replicate, without materialising them:
    Σ_s Σ_p c_s c_p x[s, p] / (S·P), with c the multiplicities of the draw."""
    s, p = x.shape
    per_seed = prompt_counts @ x.T                 # [b, S]: Σ_p c_p x[s, p]
    return (per_seed * seed_counts).sum(axis=1) / (s * p)


def bootstrap_means(*arrays: ArrayLike, resamples: int = DEFAULT_RESAMPLES,
                    seed: Union[int, np.random.Generator, None] = 0) -> np.ndarray:
    """Hierarchical paired bootstrap replicates of the mean of each [S, P] array,
    all arrays resampled with the same draws (so differences, ratios or any other
    function of the columns is itself a paired bootstrap). Returns [B, k] for k
    arrays. `seed` seeds a numpy Generator (or is one); the result is a
    deterministic function of it."""
    cells = [_cells(a, "bootstrap_means") for a in arrays]
    if not cells:
        raise ValueError("bootstrap_means: no arrays given")
    shape = cells[0].shape
    if any(c.shape != shape for c in cells):
        raise ValueError(f"bootstrap_means: arrays differ in shape: {[c.shape for c in cells]}")
    out = np.empty((resamples, len(cells)))
    for rows, seed_counts, prompt_counts in _count_blocks(shape[0], shape[1], resamples, seed):
        for k, c in enumerate(cells):
            out[rows, k] = _replicate_means(c, seed_counts, prompt_counts)
    return out


def _percentile(estimate: float, replicates: np.ndarray, level: float, shape) -> Interval:
    _check_level(level)
    alpha = 1.0 - level
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0:
        low = high = float("nan")
    else:
        low, high = (float(v) for v in np.quantile(finite, [alpha / 2.0, 1.0 - alpha / 2.0]))
    return Interval(float(estimate), low, high, level, int(shape[0]), int(shape[1]))


def _check_bounds(bounds: Optional[Tuple[float, float]], x: np.ndarray, name: str) -> None:
    """`bounds` is None or a finite (low, high) with low < high that holds every cell."""
    if bounds is None:
        return
    if (len(bounds) != 2 or not all(math.isfinite(b) for b in bounds)
            or not bounds[0] < bounds[1]):
        raise ValueError(f"{name}: bounds must be (low, high) with finite low < high, "
                         f"got {bounds!r}")
    if ((x < bounds[0]) | (x > bounds[1])).any():
        raise ValueError(f"{name}: cells must lie within bounds {bounds!r}")


def _binomial_tail_bound(k: int, n: int, tail: float, upper: bool) -> float:
    """The Clopper–Pearson bound on a proportion from k successes in n trials:
    upper, the p with P(X ≤ k) = tail (1 for k = n); lower, the p with
    P(X ≥ k) = tail (0 for k = 0). By bisection on the binomial distribution,
    which is monotone in p (no scipy)."""
    if upper and k >= n:
        return 1.0
    if not upper and k <= 0:
        return 0.0
    # log C(n, j) for j = 0..n, once for the whole bisection.
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    j = np.arange(n + 1)
    log_choose = log_factorial[n] - log_factorial[j] - log_factorial[n - j]
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (low + high)
        pmf = np.exp(log_choose + j * math.log(mid) + (n - j) * math.log1p(-mid))
        mass = pmf[:k + 1].sum() if upper else pmf[k:].sum()
        # upper: P(X ≤ k) falls as p grows; lower: P(X ≥ k) rises.
        if (mass > tail) == upper:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def _exact_floor(interval: Interval, x: np.ndarray,
                 bounds: Optional[Tuple[float, float]]) -> Interval:
    """`interval` widened to cover what exact binomial intervals allow, for cells
    bounded by `bounds` (win outcomes: 0 loss, ½ tie, 1 win).

    A percentile bootstrap cannot see past the cells it has: from two tied
    prompts every replicate is ½, and from one win and one tie it says the drop
    is at most 0 points, so a verdict would be firm from a sample that cannot
    tell. Here each cell c (mapped to [0, 1]) counts max(0, 2c − 1) towards
    "wins" and max(0, 1 − 2c) towards "losses" (a tie counts for neither), the
    mean being ½ + (w − l)/2 for the shares w and l; the Clopper–Pearson interval
    of each share at the interval's level (rounded outwards where cells are
    fractions) bounds the mean by ½ + (w_low − l_high)/2 and ½ + (w_high − l_low)/2.
    150 wins give [0.976, 1], two ties [0.079, 0.921], 100 wins and 100 losses
    ±0.071 (the bootstrap: ±0.069). n counts cells as if independent, which seeds
    are not, so this is a floor under the hierarchical bootstrap, not instead of it."""
    if bounds is None or x.size == 0:
        return interval
    c = (x - bounds[0]) / (bounds[1] - bounds[0])
    n = int(c.size)
    wins = float(np.clip(2.0 * c - 1.0, 0.0, 1.0).sum())
    losses = float(np.clip(1.0 - 2.0 * c, 0.0, 1.0).sum())
    tail = (1.0 - interval.level) / 2.0
    eps = 1e-9
    w_low = _binomial_tail_bound(math.floor(wins + eps), n, tail, upper=False)
    w_high = _binomial_tail_bound(math.ceil(wins - eps), n, tail, upper=True)
    l_low = _binomial_tail_bound(math.floor(losses + eps), n, tail, upper=False)
    l_high = _binomial_tail_bound(math.ceil(losses - eps), n, tail, upper=True)
    span = bounds[1] - bounds[0]
    low = bounds[0] + span * (0.5 + 0.5 * (w_low - l_high))
    high = bounds[0] + span * (0.5 + 0.5 * (w_high - l_low))
    return dataclasses.replace(interval, low=min(interval.low, low), high=max(interval.high, high))


def mean_interval(values: ArrayLike, *, level: float = DEFAULT_LEVEL,
                  resamples: int = DEFAULT_RESAMPLES,
                  seed: Union[int, np.random.Generator, None] = 0,
                  bounds: Optional[Tuple[float, float]] = None) -> Interval:
    """The mean over all seeds and prompts of values[S, P] (e.g. the judge's
    held-out reward, or KL(π_q ‖ π_FP16) per response) with its hierarchical
    bootstrap interval. The estimate is the plain mean of the observed cells.

    `bounds` = (low, high), the range every cell can take (win outcomes: (0, 1)):
    the interval is then at least as wide as exact binomial intervals on the
    shares of cells above and below the middle allow (_exact_floor), which is
    what the bootstrap misses where few cells differ (two tied prompts gave
    [½, ½]). Without bounds (rewards, KL) no floor applies."""
    x = _cells(values, "mean_interval")
    _check_bounds(bounds, x, "mean_interval")
    replicates = bootstrap_means(x, resamples=resamples, seed=seed)[:, 0]
    return _exact_floor(_percentile(x.mean(), replicates, level, x.shape), x, bounds)


def paired_difference(a: ArrayLike, b: Union[ArrayLike, float], *, level: float = DEFAULT_LEVEL,
                      resamples: int = DEFAULT_RESAMPLES,
                      seed: Union[int, np.random.Generator, None] = 0,
                      bounds: Optional[Tuple[float, float]] = None) -> Interval:
    """mean(a − b) over paired cells with its hierarchical bootstrap interval.

    a and b are [S, P] arrays with the same seed in the same row and the same
    prompt in the same column (e.g. per-cell win outcomes of configuration D and
    of uniform INT8, each against its seed's FP16 baseline; or the held-out reward
    of a configuration and of the baseline; or per-response KL of two
    configurations). Resampling the differences resamples both sides with the same
    draws, which is what pairing means: shared prompt difficulty and shared seed
    luck cancel. b may be a scalar: paired_difference(outcomes, 0.5) is the win
    rate's distance from a tie. `bounds`: the range of a − b, as in mean_interval
    (two win outcomes differ by at most 1: (−1, 1))."""
    x = _cells(a, "paired_difference")
    y = np.broadcast_to(np.asarray(b, dtype=np.float64), x.shape) if np.ndim(b) == 0 \
        else _cells(b, "paired_difference")
    if y.shape != x.shape:
        raise ValueError(f"paired_difference: shapes differ: {x.shape} and {y.shape}")
    return mean_interval(x - y, level=level, resamples=resamples, seed=seed, bounds=bounds)


# --- win rate ----------------------------------------------------------------------------


def outcomes(config_scores: ArrayLike, baseline_scores: ArrayLike,
             tie_tolerance: float = 0.0) -> np.ndarray:
    """Per-cell outcome from the configuration's side: 1 when its response scored
    higher than the baseline's on the same prompt (same seed), 0 when lower, ½ when
    the scores are within `tie_tolerance` (a tie is half a win, so a configuration
    indistinguishable from the baseline has win rate exactly ½)."""
    a, b = _cells(config_scores, "outcomes"), _cells(baseline_scores, "outcomes")
    if a.shape != b.shape:
        raise ValueError(f"outcomes: shapes differ: {a.shape} and {b.shape}")
    diff = a - b
    return np.where(np.abs(diff) <= tie_tolerance, 0.5, np.where(diff > 0, 1.0, 0.0))


@dataclasses.dataclass(frozen=True)
class WinRate:
    """A win rate against the baseline and its interval. wins/ties/losses count
    judgements (two per cell when both orders were judged), so
    estimate = (wins + ties/2) / (wins + ties + losses). order_disagreements counts
    cells whose two orders gave different outcomes (a position-biased judge)."""
    interval: Interval
    wins: int
    ties: int
    losses: int
    order_disagreements: int = 0

    @property
    def estimate(self) -> float:
        return self.interval.estimate

    @property
    def drop_points(self) -> Interval:
        """The drop below a tie in percentage points, 100·(½ − win rate), as an
        interval (low and high swap: a higher win rate is a smaller drop)."""
        i = self.interval
        return dataclasses.replace(i, estimate=100.0 * (0.5 - i.estimate),
                                   low=100.0 * (0.5 - i.high), high=100.0 * (0.5 - i.low))


def win_rate_from_outcomes(outcomes: ArrayLike, swapped_outcomes: Optional[ArrayLike] = None, *,
                           level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES,
                           seed: Union[int, np.random.Generator, None] = 0) -> WinRate:
    """The win rate of per-cell outcomes in [0, 1] (1 the configuration's response
    preferred, 0 the baseline's, ½ a tie), with its hierarchical bootstrap interval.

    A pairwise judge (an LLM shown both responses) is often order-sensitive: pass
    its outcomes with the configuration's response shown first as `outcomes` and
    with the positions swapped as `swapped_outcomes`, both from the configuration's
    point of view. Each cell's outcome is then the mean of its two orders (win +
    loss = ½: a judge that just prefers a position contributes a tie), which
    cancels a constant position bias; the cell, not the judgement, is resampled, so
    the two orders stay together. A reward-model judge is order-insensitive: call
    `win_rate` with its scores, or this with `swapped_outcomes` None."""
    first = _cells(outcomes, "win_rate")
    if ((first < 0) | (first > 1)).any():
        raise ValueError("win_rate: outcomes must lie in [0, 1]")
    judged = [first]
    if swapped_outcomes is not None:
        second = _cells(swapped_outcomes, "win_rate")
        if second.shape != first.shape:
            raise ValueError(f"win_rate: shapes differ: {first.shape} and {second.shape}")
        if ((second < 0) | (second > 1)).any():
            raise ValueError("win_rate: outcomes must lie in [0, 1]")
        judged.append(second)
    cell = sum(judged) / len(judged)
    interval = mean_interval(cell, level=level, resamples=resamples, seed=seed, bounds=(0.0, 1.0))
    every = np.concatenate([j.ravel() for j in judged])
    disagreements = int((judged[0] != judged[1]).sum()) if len(judged) == 2 else 0
    return WinRate(interval, wins=int((every > 0.5).sum()), ties=int((every == 0.5).sum()),
                   losses=int((every < 0.5).sum()), order_disagreements=disagreements)


def win_rate(config_scores: ArrayLike, baseline_scores: ArrayLike, *,
             swapped: Optional[Tuple[ArrayLike, ArrayLike]] = None, tie_tolerance: float = 0.0,
             level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES,
             seed: Union[int, np.random.Generator, None] = 0) -> WinRate:
    """Win rate of a configuration against the FP16 baseline of the same seed,
    from judge scores [S, P] of their responses to the same prompts: a win where
    the configuration's score is higher, a tie (half a win) where the two are
    within `tie_tolerance`. `swapped` = (config_scores, baseline_scores) from the
    judge with the two responses' positions exchanged, for an order-sensitive
    judge that scores a pair (see win_rate_from_outcomes); a reward model scores
    each response alone and needs none."""
    first = outcomes(config_scores, baseline_scores, tie_tolerance)
    second = None if swapped is None else outcomes(swapped[0], swapped[1], tie_tolerance)
    return win_rate_from_outcomes(first, second, level=level, resamples=resamples, seed=seed)


# --- rank correlation --------------------------------------------------------------------


def average_ranks(values: ArrayLike) -> np.ndarray:
    """Ranks 1..n of a 1-D array, tied values sharing the average of their ranks."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Group boundaries in sorted order; a group of m ties at positions i..i+m−1
    # (0-based) gets the rank i + (m + 1)/2.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    sizes = np.diff(np.r_[starts, len(x)])
    group_rank = starts + (sizes + 1) / 2.0
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(group_rank, sizes)
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's ρ: the Pearson correlation of the average ranks (ties share the
    mean of their ranks, the usual tie correction). nan when either side is
    constant; needs two equally long 1-D lists of at least two values."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"spearman: expected two equally long lists of at least 2 scores, "
                         f"got shapes {a.shape} and {b.shape}")
    center = (len(a) + 1) / 2.0
    ra, rb = average_ranks(a) - center, average_ranks(b) - center
    norm = math.sqrt(float((ra ** 2).sum() * (rb ** 2).sum()))
    return float((ra * rb).sum() / norm) if norm > 0 else float("nan")


def _tie_starts(sorted_values: np.ndarray) -> Optional[np.ndarray]:
    """Where each run of equal values starts in a sorted array; None when all
    values differ (the common case for real-valued scores: no grouping needed)."""
    new_group = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    return None if new_group.all() else np.flatnonzero(new_group)


def _sorted_ranks(counts_sorted: np.ndarray, starts: Optional[np.ndarray]) -> np.ndarray:
    """Average ranks minus ½ in each replicate's resampled multiset, for elements
    given in sorted order of their values with multiplicities counts_sorted [b, P]
    (elements drawn 0 times get a rank too, which carries weight 0). Equal values,
    original ties and copies of one element alike, share the mean of their ranks:
    a group with m members after the draw, preceded by c smaller members, has rank
    c + (m + 1)/2, i.e. its cumulative count − m/2 + ½. The constant ½ is left
    out (it cancels in a correlation; the caller centres at n/2, not (n + 1)/2)."""
    if starts is None:
        ranks = np.cumsum(counts_sorted, axis=1)
        ranks -= 0.5 * counts_sorted
        return ranks
    per_group = np.add.reduceat(counts_sorted, starts, axis=1)        # [b, groups]
    ranks = np.cumsum(per_group, axis=1)
    ranks -= 0.5 * per_group
    sizes = np.diff(np.r_[starts, counts_sorted.shape[1]])
    return np.repeat(ranks, sizes, axis=1)


def _rank_plan(x: np.ndarray, y: np.ndarray):
    """What the replicates of one seed share: x's sort order, y's order within it,
    and where ties start in each (computed once, not per block)."""
    ox = np.argsort(x, kind="mergesort")
    xs, ys = x[ox], y[ox]
    oy = np.argsort(ys, kind="mergesort")
    return ox, oy, _tie_starts(xs), _tie_starts(ys[oy])


def _spearman_replicates(x: np.ndarray, y: np.ndarray, counts: np.ndarray,
                         plan=None) -> np.ndarray:
    """ρ of each replicate's resample of the pairs (x[p], y[p]) with multiplicities
    counts [b, P], equal to `spearman` on the explicitly resampled lists: the
    count-weighted Pearson correlation of the resampled average ranks. With r the
    rank − ½ (see _sorted_ranks), the weighted mean of r is n/2 for n = Σ counts,
    so the centred sums are Σ c·r·r' − n·(n/2)². Everything runs in x's sorted
    order; y's ranks are computed in y's order and brought back by one
    permutation."""
    ox, oy, x_ties, y_ties = plan if plan is not None else _rank_plan(x, y)
    cx = counts[:, ox]
    cy = cx[:, oy]
    rx = _sorted_ranks(cx, x_ties)
    ry_in_y = _sorted_ranks(cy, y_ties)
    ry = np.empty_like(ry_in_y)
    ry[:, oy] = ry_in_y
    n = counts.sum(axis=1)
    offset = n * (n / 2.0) ** 2
    weighted = cx * rx
    sxy = np.einsum("ij,ij->i", weighted, ry) - offset
    sxx = np.einsum("ij,ij->i", weighted, rx) - offset
    cy *= ry_in_y
    syy = np.einsum("ij,ij->i", cy, ry_in_y) - offset
    norm = np.sqrt(np.maximum(sxx, 0.0) * np.maximum(syy, 0.0))
    # A constant resample has Σ c·(r − mean)² = 0 up to rounding of exact numbers.
    defined = norm > 1e-9 * np.maximum(offset, 1.0)
    return np.where(defined, sxy / np.where(defined, norm, 1.0), np.nan)


def spearman_interval(x: ArrayLike, y: ArrayLike, *, level: float = DEFAULT_LEVEL,
                      resamples: int = DEFAULT_RESAMPLES,
                      seed: Union[int, np.random.Generator, None] = 0) -> Interval:
    """Spearman ρ between two scorings of the same cells (e.g. the configuration's
    own quantized reward model and the FP16 judge on the configuration's held-out
    responses), [S, P] each, with a hierarchical bootstrap interval.

    The statistic is the per-seed ρ (over that seed's P prompts) averaged over
    seeds, not one ρ of all S·P cells pooled. Each seed's responses come from a
    differently trained policy; if seeds differ in their reward level, pooling
    rewards both scorers for agreeing which seed is better (a between-seed
    correlation), which inflates ρ and is not the question. The question is
    whether the quantized scorer ranks responses within a run as the FP16 judge
    does, which is the per-seed ρ. The bootstrap recomputes each seed's ρ on the
    replicate's prompt draw (ties in the resample take average ranks, exactly as
    on explicitly resampled lists), then averages those of the drawn seeds.
    Replicates where a resample is constant (ρ undefined) are left out; with
    realistic P they do not occur. Cost: ranks are recomputed per replicate, so
    this is the slowest statistic here, ~0.9 s of CPU for S = 5, P = 800,
    B = 10 000 (0.2 s at B = 2000) measured on a loaded 2-core machine, against
    ~0.06 s for a mean."""
    a, b = _cells(x, "spearman_interval"), _cells(y, "spearman_interval")
    if a.shape != b.shape:
        raise ValueError(f"spearman_interval: shapes differ: {a.shape} and {b.shape}")
    s, p = a.shape
    if p < 2:
        raise ValueError("spearman_interval: needs at least 2 prompts per seed")
    estimate = float(np.mean([spearman(a[i], b[i]) for i in range(s)]))
    plans = [_rank_plan(a[i], b[i]) for i in range(s)]
    replicates = np.empty(resamples)
    for rows, seed_counts, prompt_counts in _count_blocks(s, p, resamples, seed):
        per_seed = np.stack([_spearman_replicates(a[i], b[i], prompt_counts, plans[i])
                             for i in range(s)], axis=1)           # [b, S]
        # Seeds not drawn weigh 0 even where their ρ is undefined (nan · 0 is nan).
        replicates[rows] = (np.where(seed_counts > 0, per_seed, 0.0) * seed_counts).sum(axis=1) / s
    return _percentile(estimate, replicates, level, a.shape)


# --- verdicts and multiple comparisons ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    """status: "met", "not met" or "unresolved". half_width: the interval's.
    prompts_needed: per seed, the prompt count at which an effect the size of
    the current |estimate − threshold| would be resolved at the interval's level
    with `power` (normal approximation; None when the estimate sits on the
    threshold, where no finite count resolves it)."""
    status: str
    threshold: float
    better: str
    half_width: float
    prompts_needed: Optional[int]
    power: float = 0.8

    @property
    def met(self) -> bool:
        return self.status == "met"


def prompts_for_power(interval: Interval, threshold: float, power: float = 0.8) -> Optional[int]:
    """Per seed, the prompts needed to tell the current estimate from `threshold`
    (two-sided at the interval's level, with `power`), by the normal
    approximation: the interval's standard error is se ≈ half_width / z_{1−α/2}
    at its n prompts and shrinks as 1/√n, so an effect δ = |estimate − threshold|
    is detected when n' = n · ((z_{1−α/2} + z_{power}) · se / δ)². Seeds are held
    at the interval's count (more seeds also shrink se; this counts prompts
    only). None when δ = 0."""
    delta = abs(interval.estimate - threshold)
    if delta == 0 or not math.isfinite(delta):
        return None
    z_level = normal_quantile(0.5 + interval.level / 2.0)
    se = interval.half_width / z_level
    needed = interval.n_prompts * ((z_level + normal_quantile(power)) * se / delta) ** 2
    return int(math.ceil(needed))


def verdict(interval: Interval, threshold: float, better: str = "above",
            power: float = 0.8) -> Verdict:
    """Three-valued judgement of a criterion "the statistic is better than
    `threshold`" (better="above": higher is better, e.g. win rate > 0.45;
    "below": lower is better, e.g. KL < 0.1 or a win-rate drop < 10 points).

    "met" only when the whole interval is strictly on the good side, "not met"
    when the whole interval is on the bad side (touching the threshold counts as
    bad: no value in it meets a strict criterion), otherwise "unresolved": the
    data cannot tell, and `prompts_needed` says how many prompts per seed would
    (see prompts_for_power). Reporting "unresolved" rather than the side the point
    estimate falls on is the point: a 47 % win rate ±3.5 is not a pass."""
    if better not in ("above", "below"):
        raise ValueError(f"verdict: better must be 'above' or 'below', got {better!r}")
    if better == "above":
        status = "met" if interval.low > threshold else \
            "not met" if interval.high <= threshold else "unresolved"
    else:
        status = "met" if interval.high < threshold else \
            "not met" if interval.low >= threshold else "unresolved"
    return Verdict(status, threshold, better, interval.half_width,
                   prompts_for_power(interval, threshold, power), power)


def bonferroni_level(k: int, level: float = DEFAULT_LEVEL) -> float:
    """The per-comparison confidence level 1 − α/k for k comparisons at family
    level `level` = 1 − α (Bonferroni).

    Use it for criteria over several configurations, e.g. "some quantized policy
    reaches > 1.5× speedup with < 10 % win-rate drop": computing each of the k
    candidates' intervals at 95 % and declaring success when any one passes would
    find a pass by chance about k times as often as 5 %. Computing each at
    bonferroni_level(k) keeps the chance of any false "met" in the family below
    α, whatever the dependence between configurations (they share the baseline,
    so they are dependent; Bonferroni needs no independence). It is
    conservative: with k = 9 each interval is at 99.44 % (z ≈ 2.77 instead of
    1.96). A criterion about one pre-named configuration (policy D) is a single
    comparison and needs no adjustment."""
    if k < 1:
        raise ValueError(f"bonferroni_level: k must be at least 1, got {k}")
    _check_level(level)
    return 1.0 - (1.0 - level) / k
