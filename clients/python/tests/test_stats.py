"""mxserve.stats (hierarchical paired bootstrap, win rate, Spearman, verdicts) and
ppo.mismatch_metrics (verl's rollout-correction health metrics): known answers.
Needs numpy (and torch for the mismatch metrics); no daemon."""

import math
import time

import pytest

np = pytest.importorskip("numpy")

from mxserve import stats  # noqa: E402


# --- the normal quantile ------------------------------------------------------------------


def test_normal_quantile_known_values():
    assert stats.normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert stats.normal_quantile(0.8) == pytest.approx(0.841621, abs=1e-6)
    assert stats.normal_quantile(0.995) == pytest.approx(2.575829, abs=1e-6)
    assert stats.normal_quantile(0.5) == 0.0
    assert stats.normal_quantile(0.025) == pytest.approx(-1.959964, abs=1e-6)
    # Deep tail: Φ⁻¹(1e-10) = −6.361341 (tables); and Φ(Φ⁻¹(p)) = p.
    assert stats.normal_quantile(1e-10) == pytest.approx(-6.361341, abs=1e-6)
    for p in (1e-6, 0.1, 0.3, 0.7, 0.999):
        assert stats.normal_cdf(stats.normal_quantile(p)) == pytest.approx(p, rel=1e-12)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError):
            stats.normal_quantile(bad)


def test_the_98_over_root_n_rule():
    # ORIGIN: a 50 % win rate on n prompts has a 95 % half-width of ≈ 98/√n points.
    for n, points in ((200, 6.9), (800, 3.5)):
        half = 100 * stats.normal_half_width(n)
        assert half == pytest.approx(98 / math.sqrt(n), rel=1e-4)
        assert half == pytest.approx(points, abs=0.05)


# --- win rate -------------------------------------------------------------------------------


def test_all_wins_give_one_and_the_exact_binomial_floor():
    # Every bootstrap replicate of 150 wins is 1.0; what 150 wins rule out is a
    # loss rate above 1 − 0.025^(1/150) (Clopper–Pearson, zero events, 95 %).
    config = np.full((3, 50), 2.0)
    baseline = np.zeros((3, 50))
    w = stats.win_rate(config, baseline, resamples=500)
    assert w.estimate == 1.0
    assert w.interval.low == pytest.approx(0.025 ** (1 / 150), abs=1e-12)
    assert w.interval.low == pytest.approx(0.975707, abs=1e-6)
    assert w.interval.high == 1.0
    assert (w.wins, w.ties, w.losses) == (150, 0, 0)
    assert (w.interval.n_seeds, w.interval.n_prompts) == (3, 50)
    assert w.drop_points.estimate == -50.0
    assert stats.verdict(w.interval, 0.45, "above").status == "met"


def test_a_few_identical_cells_are_unresolved_not_a_verdict():
    # One seed, two tied prompts: the bootstrap says [0.5, 0.5]; two cells can
    # rule out only a share of differing cells above q = 1 − √0.025.
    w = stats.win_rate([[1.0, 2.0]], [[1.0, 2.0]], resamples=200)
    q = 1 - 0.025 ** 0.5
    assert (w.interval.low, w.interval.high) == pytest.approx((0.5 - q / 2, 0.5 + q / 2))
    assert w.interval.low == pytest.approx(0.079057, abs=1e-6)
    drop = w.drop_points
    assert stats.verdict(drop, 5.0, "below").status == "unresolved"
    assert stats.verdict(w.interval, 0.5, "below").status == "unresolved"
    # Ten losses: the win rate is at most 1 − 0.025^(1/10).
    losses = stats.win_rate_from_outcomes(np.zeros((1, 10)), resamples=200)
    assert losses.interval.low == 0.0
    assert losses.interval.high == pytest.approx(1 - 0.025 ** 0.1, abs=1e-12)
    assert losses.interval.high == pytest.approx(0.308497, abs=1e-6)
    # At another level the floor follows it (99 %: α/2 = 0.005).
    at99 = stats.win_rate_from_outcomes(np.ones((2, 5)), level=0.99, resamples=200)
    assert at99.interval.low == pytest.approx(0.005 ** 0.1, abs=1e-12)


def test_few_differing_cells_are_unresolved_and_the_floor_is_monotone():
    # One win and one tie: the bootstrap said the win rate is at least ½ (a drop
    # of at most 0 points: "met" for < 5); the loss share two cells allow reaches
    # 1 − √0.025.
    w = stats.win_rate_from_outcomes([[1.0, 0.5]], resamples=500)
    assert w.interval.low == pytest.approx(0.5 + (0.0 - (1 - 0.025 ** 0.5)) / 2 + 0.0063,
                                           abs=2e-3)
    assert stats.verdict(w.drop_points, 5.0, "below").status == "unresolved"
    # One tie among 149 wins lowers the bound below 150 wins' (it had raised it).
    all_wins = stats.win_rate_from_outcomes(np.ones((1, 150)), resamples=500).interval
    one_tie = stats.win_rate_from_outcomes(np.r_[np.ones(149), 0.5][None, :],
                                           resamples=500).interval
    assert one_tie.low < all_wins.low
    # 100 wins and 100 losses: the Clopper–Pearson interval of 100/200,
    # [0.4287, 0.5713], a little wider than the bootstrap's ±0.069.
    even = stats.win_rate_from_outcomes(np.r_[np.ones(100), np.zeros(100)][None, :],
                                        resamples=2000).interval
    assert (even.low, even.high) == pytest.approx((0.428658, 0.571342), abs=1e-5)


def test_the_floor_widens_only_where_the_bootstrap_is_narrower():
    rng = np.random.default_rng(3)
    varied = rng.integers(0, 2, size=(2, 40)).astype(float)
    floored = stats.mean_interval(varied, resamples=300, bounds=(0.0, 1.0))
    plain = stats.mean_interval(varied, resamples=300)
    assert floored.low <= plain.low and floored.high >= plain.high
    assert floored.half_width < 1.3 * plain.half_width
    # Two seeds that disagree: the hierarchical bootstrap is far wider than any
    # binomial interval of the pooled cells, and stays as it is.
    split = np.stack([np.r_[np.ones(160), np.zeros(40)], np.r_[np.ones(40), np.zeros(160)]])
    assert stats.mean_interval(split, resamples=500, bounds=(0.0, 1.0)) == \
        stats.mean_interval(split, resamples=500)
    with pytest.raises(ValueError, match=r"cells must lie within bounds \(0.0, 1.0\)"):
        stats.mean_interval([[0.5, 1.5]], resamples=10, bounds=(0.0, 1.0))
    constant = np.full((1, 4), 7.5)  # a reward: no bounds, no floor
    assert (stats.mean_interval(constant, resamples=100).low,
            stats.mean_interval(constant, resamples=100).high) == (7.5, 7.5)
    # Paired outcome differences lie in [−1, 1]: four equal differences of 0.
    d = stats.paired_difference(np.ones((1, 4)), np.ones((1, 4)), resamples=100,
                                bounds=(-1.0, 1.0))
    q = 1 - 0.025 ** 0.25
    assert (d.low, d.high) == pytest.approx((-q, q))
    assert stats.verdict(d, 0.0, "above").status == "unresolved"
    for bad in [(1.0, 0.0), (0.0, float("inf")), (0.0,), (0.5, 0.5)]:
        with pytest.raises(ValueError, match="bounds must be"):
            stats.mean_interval(varied, resamples=10, bounds=bad)


def test_ties_count_half():
    # Outcomes: win, tie, loss, tie, win → (2 + 2·½) / 5 = 0.6.
    w = stats.win_rate([[1, 2, 3, 4, 9]], [[0, 2, 5, 4, 1]], resamples=200)
    assert w.estimate == pytest.approx(0.6)
    assert (w.wins, w.ties, w.losses) == (2, 2, 1)
    # Within a tolerance, near-equal scores tie: win(1 vs 0.95) becomes a tie.
    o = stats.outcomes([[1.0, 3.0]], [[0.95, 1.0]], tie_tolerance=0.1)
    assert o.tolist() == [[0.5, 1.0]]


def test_prompt_bootstrap_half_width_matches_the_normal_approximation():
    # S = 1, P = 800 iid win/loss outcomes at p = ½: the bootstrap half-width is
    # the binomial 1.96·sqrt(p̂(1−p̂)/P) ≈ 0.0346, within 10 %.
    rng = np.random.default_rng(7)
    wins = rng.integers(0, 2, size=(1, 800)).astype(float)
    w = stats.win_rate_from_outcomes(wins, resamples=10_000, seed=1)
    expected = 1.96 * math.sqrt(0.25 / 800)
    assert expected == pytest.approx(0.0346, abs=1e-4)
    assert w.interval.half_width == pytest.approx(expected, rel=0.10)
    # And at n = 200 the half-width is the ORIGIN's ±6.9 points, within 10 %.
    w200 = stats.win_rate_from_outcomes(wins[:, :200], resamples=10_000, seed=1)
    assert 100 * w200.interval.half_width == pytest.approx(6.9, rel=0.10)


def test_two_disagreeing_seeds_widen_the_interval():
    # Seed 0 wins 80 %, seed 1 wins 20 %; the same 400 outcomes pooled as one seed
    # know nothing of the seeds and give a narrow prompt-only interval.
    seed0 = np.r_[np.ones(160), np.zeros(40)]
    seed1 = np.r_[np.ones(40), np.zeros(160)]
    hierarchical = stats.win_rate_from_outcomes(np.stack([seed0, seed1]), resamples=4000)
    pooled = stats.win_rate_from_outcomes(np.r_[seed0, seed1][None, :], resamples=4000)
    assert hierarchical.estimate == pooled.estimate == pytest.approx(0.5)
    assert pooled.interval.half_width < 0.06
    assert hierarchical.interval.half_width > 3 * pooled.interval.half_width
    # A quarter of the replicates draw seed 0 twice (≈ 0.8), a quarter seed 1
    # twice (≈ 0.2): the 95 % interval reaches both.
    assert hierarchical.interval.low < 0.3 and hierarchical.interval.high > 0.7


def test_position_swapped_judging_averages_the_two_orders():
    # A judge that always prefers the first position: config wins when shown
    # first, loses when shown second; averaged, every cell is a tie.
    first = np.ones((2, 10))
    swapped = np.zeros((2, 10))
    w = stats.win_rate_from_outcomes(first, swapped, resamples=300)
    assert w.estimate == 0.5
    assert (w.wins, w.ties, w.losses) == (20, 0, 20)
    assert w.order_disagreements == 20
    # Twenty ties and nothing else: the floor for twenty identical cells.
    q = 1 - 0.025 ** (1 / 20)
    assert (w.interval.low, w.interval.high) == pytest.approx((0.5 - q / 2, 0.5 + q / 2))
    # From scores: (config, baseline) in each order.
    w2 = stats.win_rate([[3.0, 1.0]], [[1.0, 1.0]], swapped=([[3.0, 2.0]], [[1.0, 1.0]]),
                        resamples=100)
    # Cell 0: win, win → 1; cell 1: tie, win → 0.75; mean 0.875.
    assert w2.estimate == pytest.approx(0.875)
    assert (w2.wins, w2.ties, w2.losses, w2.order_disagreements) == (3, 1, 0, 1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stats.win_rate_from_outcomes([[1.5]])


# --- the bootstrap itself ---------------------------------------------------------------------


def test_vectorised_replicates_equal_explicit_resampling():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 7))
    seed_idx, prompt_idx = stats._draw_indices(np.random.default_rng(11), 3, 7, 40)
    fast = stats._replicate_means(x, stats._counts(seed_idx, 3), stats._counts(prompt_idx, 7))
    # One replicate: the drawn seeds' rows, each at the same drawn prompt columns.
    slow = [x[np.ix_(s, p)].mean() for s, p in zip(seed_idx, prompt_idx)]
    assert fast == pytest.approx(slow, rel=1e-12)


def test_bootstrap_is_deterministic_for_a_seed():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(4, 100))
    a = stats.mean_interval(x, resamples=2000, seed=9)
    b = stats.mean_interval(x, resamples=2000, seed=9)
    c = stats.mean_interval(x, resamples=2000, seed=10)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.estimate == c.estimate == pytest.approx(x.mean())
    assert a.low < a.estimate < a.high


def test_mean_interval_level_and_checks():
    rng = np.random.default_rng(2)
    x = rng.normal(loc=1.0, size=(2, 300))
    i95 = stats.mean_interval(x, resamples=3000)
    i99 = stats.mean_interval(x, level=0.99, resamples=3000)
    assert i99.low < i95.low and i99.high > i95.high and i99.level == 0.99
    with pytest.raises(ValueError, match="finite"):
        stats.mean_interval([[1.0, float("nan")]])
    with pytest.raises(ValueError, match="level"):
        stats.mean_interval(x, level=1.0)


def test_paired_difference_cancels_shared_prompt_difficulty():
    # Prompt difficulty varies widely and both configurations share it; the
    # configuration is better by exactly 0.1 everywhere plus small noise.
    rng = np.random.default_rng(4)
    difficulty = rng.normal(scale=5.0, size=(1, 400))
    b = np.repeat(difficulty, 3, axis=0) + rng.normal(scale=0.05, size=(3, 400))
    a = b + 0.1 + rng.normal(scale=0.05, size=(3, 400))
    d = stats.paired_difference(a, b, resamples=3000)
    assert d.estimate == pytest.approx(0.1, abs=0.01)
    assert d.low > 0.09 and d.high < 0.11
    # Unpaired, the two means' intervals would overlap entirely.
    assert stats.mean_interval(a, resamples=3000).half_width > 10 * d.half_width
    # Against a scalar: the win rate's distance from ½.
    o = np.r_[np.ones(30), np.zeros(10)][None, :]
    assert stats.paired_difference(o, 0.5, resamples=200).estimate == pytest.approx(0.25)
    shifted = stats.win_rate_from_outcomes(o, resamples=200).interval.shifted(0.5)
    assert shifted.estimate == pytest.approx(0.25)


def test_bootstrap_means_share_draws_across_arrays():
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=(3, 50)), rng.normal(size=(3, 50))
    reps = stats.bootstrap_means(a, b, a - b, resamples=500)
    assert reps.shape == (500, 3)
    assert reps[:, 2] == pytest.approx(reps[:, 0] - reps[:, 1], abs=1e-12)


def test_bootstrap_is_fast_enough():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(5, 800))
    start = time.perf_counter()
    stats.win_rate(scores, rng.normal(size=(5, 800)), resamples=10_000)
    assert time.perf_counter() - start < 1.0
    start = time.perf_counter()
    stats.spearman_interval(scores, scores + rng.normal(size=(5, 800)), resamples=2000)
    assert time.perf_counter() - start < 2.0


# --- Spearman -------------------------------------------------------------------------------


def test_spearman_with_ties_by_hand():
    # x = [1, 2, 2, 3] → ranks [1, 2.5, 2.5, 4], centred [−1.5, 0, 0, 1.5];
    # y = [1, 3, 2, 4] → ranks [1, 3, 2, 4], centred [−1.5, .5, −.5, 1.5];
    # ρ = 4.5 / sqrt(4.5 · 5).
    assert stats.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    # Ties on both sides: x = [1, 1, 2, 3, 3] → ranks [1.5, 1.5, 3, 4.5, 4.5],
    # centred [−1.5, −1.5, 0, 1.5, 1.5]; y = [2, 1, 1, 3, 4] → ranks
    # [3, 1.5, 1.5, 4, 5], centred [0, −1.5, −1.5, 1, 2]. Σxy = 0 + 2.25 + 0 +
    # 1.5 + 3 = 6.75; Σx² = 9; Σy² = 0 + 2.25 + 2.25 + 1 + 4 = 9.5.
    assert stats.spearman([1, 1, 2, 3, 3], [2, 1, 1, 3, 4]) == \
        pytest.approx(6.75 / math.sqrt(9 * 9.5))
    assert stats.average_ranks([10, 20, 10, 30, 10]).tolist() == [2, 4, 2, 5, 2]
    assert stats.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError):
        stats.spearman([1, 2], [1, 2, 3])


def test_resampled_spearman_equals_spearman_of_the_resample():
    # With ties in the data and duplicates from the draw, each replicate's ρ is
    # exactly spearman() of the explicitly resampled lists.
    rng = np.random.default_rng(6)
    x = np.round(rng.normal(size=25))
    y = np.round(x + rng.normal(size=25))
    idx = np.random.default_rng(1).integers(0, 25, size=(60, 25))
    fast = stats._spearman_replicates(x, y, stats._counts(idx, 25))
    slow = [stats.spearman(x[i], y[i]) for i in idx]
    assert np.allclose(fast, slow, rtol=0, atol=1e-12, equal_nan=True)


def test_spearman_interval_is_per_seed_and_covers_the_estimate():
    rng = np.random.default_rng(12)
    judge = rng.normal(size=(3, 200))
    # Seed offsets: pooled, the offsets alone would correlate the two scorings.
    offsets = np.array([[0.0], [10.0], [20.0]])
    quantized = judge + rng.normal(scale=1.0, size=(3, 200)) + offsets
    i = stats.spearman_interval(quantized, judge + offsets, resamples=2000)
    per_seed = np.mean([stats.spearman(quantized[s], judge[s]) for s in range(3)])
    assert i.estimate == pytest.approx(per_seed)
    assert i.low < i.estimate < i.high
    pooled = stats.spearman((quantized).ravel(), (judge + offsets).ravel())
    assert pooled > i.high  # the between-seed agreement inflates a pooled ρ
    # Identical scorings: ρ = 1 in every replicate.
    same = stats.spearman_interval(judge, judge, resamples=200)
    assert (same.estimate, same.low, same.high) == (pytest.approx(1.0),) * 3


# --- verdicts and multiple comparisons ------------------------------------------------------


def test_verdicts_above_below_and_straddling():
    above = stats.Interval(0.52, 0.47, 0.57, 0.95, 3, 200)
    assert stats.verdict(above, 0.45).status == "met"
    assert stats.verdict(above, 0.60).status == "not met"
    assert stats.verdict(above, 0.45, better="below").status == "not met"
    assert stats.verdict(above, 0.60, better="below").status == "met"
    # Touching the threshold is not wholly on the good side.
    assert stats.verdict(above, 0.47).status == "unresolved"
    assert stats.verdict(above, 0.57).status == "not met"
    with pytest.raises(ValueError, match="better"):
        stats.verdict(above, 0.5, better="higher")


def test_unresolved_verdict_counts_the_prompts_that_would_resolve_it():
    # Estimate 0.47 in [0.44, 0.50] on 200 prompts, criterion > 0.45: unresolved.
    # By hand: se = 0.03 / 1.959964 = 0.015306; δ = 0.02;
    # n = 200 · ((1.959964 + 0.841621) · 0.015306 / 0.02)² = 919.44 → 920.
    i = stats.Interval(0.47, 0.44, 0.50, 0.95, 3, 200)
    v = stats.verdict(i, 0.45)
    assert v.status == "unresolved" and not v.met
    assert v.half_width == pytest.approx(0.03)
    assert 200 * ((1.959964 + 0.841621) * (0.03 / 1.959964) / 0.02) ** 2 == \
        pytest.approx(919.44, abs=0.01)
    assert v.prompts_needed == 920
    # On the threshold no finite count resolves it.
    assert stats.verdict(stats.Interval(0.45, 0.40, 0.50, 0.95, 1, 200), 0.45).prompts_needed \
        is None


def test_bonferroni_level_for_nine_configurations():
    assert stats.bonferroni_level(9) == pytest.approx(1 - 0.05 / 9)
    assert stats.bonferroni_level(9) == pytest.approx(0.994444, abs=1e-6)
    assert stats.bonferroni_level(1) == pytest.approx(0.95)
    # z for a two-sided 99.44 % interval: Φ⁻¹(1 − 0.05/18) ≈ 2.7729.
    assert stats.normal_quantile(0.5 + stats.bonferroni_level(9) / 2) == \
        pytest.approx(2.7729, abs=1e-4)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 300))
    wide = stats.mean_interval(x, level=stats.bonferroni_level(9), resamples=4000)
    assert wide.half_width > stats.mean_interval(x, resamples=4000).half_width
    with pytest.raises(ValueError):
        stats.bonferroni_level(0)


# --- rollout–learner mismatch metrics (verl's names) ----------------------------------------


def test_mismatch_metrics_by_hand():
    torch = pytest.importorskip("torch")
    from mxserve.rlhf import ppo

    # Two sequences of three tokens; the second's last token is padding (its
    # ratio e^5 must not count). Valid ratios w = π_learner/π_rollout:
    # [1, 3, 1/4] and [0.6, 1], cap 2 (band [1/2, 2]).
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -5.0]])
    learner = torch.tensor([[-1.0, -2.0 + math.log(3), -0.5 - math.log(4)],
                            [-1.0 + math.log(0.6), -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    m = ppo.mismatch_metrics(rollout, learner, mask, cap=2.0)
    p = "rollout_corr/"
    rel = dict(rel=1e-5)  # float32 inputs
    # Untruncated weights: mean (1 + 3 + .25 + .6 + 1)/5, extremes .25 and 3.
    assert m[p + "rollout_is_mean"] == pytest.approx(5.85 / 5, **rel)
    assert m[p + "rollout_is_min"] == pytest.approx(0.25, **rel)
    assert m[p + "rollout_is_max"] == pytest.approx(3.0, **rel)
    # Above the cap: the 3; below 1/cap: the 1/4.
    assert m[p + "rollout_is_ratio_fraction_high"] == pytest.approx(0.2)
    assert m[p + "rollout_is_ratio_fraction_low"] == pytest.approx(0.2)
    # Banded to [1/2, 2]: [1, 2, .5, .6, 1], mean 1.02, E[w'²] = 6.61/5 = 1.322.
    assert m[p + "rollout_is_std"] == pytest.approx(math.sqrt(1.322 - 1.02 ** 2), **rel)
    assert m[p + "rollout_is_eff_sample_size"] == pytest.approx(1.02 ** 2 / 1.322, **rel)
    # K1 = mean(−log w) = −(ln 3 + ln ¼ + ln 0.6)/5 = ln(20/9)/5.
    assert m[p + "kl"] == pytest.approx(math.log(20 / 9) / 5, **rel)
    # K3 = mean(w − 1 − ln w): 0, 2 − ln 3, −¾ + ln 4, −0.4 + ln(5/3), 0.
    k3 = (2 - math.log(3)) + (-0.75 + math.log(4)) + (-0.4 + math.log(5 / 3))
    assert m[p + "k3_kl"] == pytest.approx(k3 / 5, **rel)
    # Per-sequence mean log-probs: learner (−3.5 − ln(4/3))/3 and −1 + ln(0.6)/2;
    # rollout −3.5/3 and −1.
    learner_seq = [(-3.5 - math.log(4 / 3)) / 3, -1 + math.log(0.6) / 2]
    rollout_seq = [-3.5 / 3, -1.0]
    assert m[p + "training_ppl"] == pytest.approx(sum(math.exp(-v) for v in learner_seq) / 2,
                                                  **rel)
    assert m[p + "rollout_ppl"] == pytest.approx(sum(math.exp(-v) for v in rollout_seq) / 2,
                                                 **rel)
    assert m[p + "training_log_ppl"] == pytest.approx(-sum(learner_seq) / 2, **rel)
    assert m[p + "rollout_log_ppl"] == pytest.approx(-sum(rollout_seq) / 2, **rel)
    # Gap per sequence: ln(4/3)/3 and ln(5/3)/2, both positive (the learner finds
    # the sampled text less likely than the sampler did).
    gaps = [math.log(4 / 3) / 3, math.log(5 / 3) / 2]
    assert m[p + "log_ppl_diff"] == pytest.approx(sum(gaps) / 2, **rel)
    assert m[p + "log_ppl_abs_diff"] == pytest.approx(sum(gaps) / 2, **rel)
    assert m[p + "ppl_ratio"] == pytest.approx(((4 / 3) ** (1 / 3) + (5 / 3) ** 0.5) / 2, **rel)
    # χ²: mean(w²) − 1 = (1 + 9 + 1/16 + 0.36 + 1)/5 − 1; sequences: products
    # 3/4 and 0.6, squared and averaged, minus 1.
    assert m[p + "chi2_token"] == pytest.approx(11.4225 / 5 - 1, **rel)
    assert m[p + "chi2_seq"] == pytest.approx((0.5625 + 0.36) / 2 - 1, **rel)
    assert len(m) == 18 and all(k.startswith(p) for k in m)


def test_mismatch_metrics_identical_policies_and_checks():
    torch = pytest.importorskip("torch")
    from mxserve.rlhf import ppo

    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.6, 0.3]]))
    mask = torch.ones(2, 3)
    m = ppo.mismatch_metrics(logp, logp.clone(), mask, prefix="")
    assert m["rollout_is_mean"] == m["rollout_is_min"] == m["rollout_is_max"] == 1.0
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1.0)
    assert m["rollout_is_std"] == 0.0
    assert m["kl"] == 0.0 and m["k3_kl"] == 0.0 and m["ppl_ratio"] == 1.0
    assert m["training_ppl"] == m["rollout_ppl"]
    with pytest.raises(ValueError, match="no token"):
        ppo.mismatch_metrics(logp, logp, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="shapes"):
        ppo.mismatch_metrics(logp, logp[:, :2], mask)


def test_a_local_ppo_step_reports_the_mismatch_metrics():
    torch = pytest.importorskip("torch")
    from mxserve.rlhf import trainer as rlhf
    from mxserve.rlhf.models import ModelConfig, build_model

    tiny = dict(arch="qwen2", vocab_size=24, hidden_size=32, num_layers=2, num_heads=4,
                num_kv_heads=2, intermediate_size=48, max_positions=64, norm_eps=1e-6,
                tie_word_embeddings=True, eos_token_id=1)

    def lm(seed):
        torch.manual_seed(seed)
        return build_model(ModelConfig(**tiny)).eval()

    config = rlhf.PPOConfig(batch_size=4, response_length=4, learning_rate=1e-3, is_level="none")
    trainer = rlhf.PPOTrainer(None, lm(0), rlhf.RewardModel(lm(2)), config, eos_id=1, pad_id=0,
                              seed=0)
    metrics = trainer.step([[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2], [14, 2]])
    # Locally the sampler and the learner are the same FP32 arithmetic: no mismatch,
    # and the metrics are there even without a correction ("none").
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["rollout_corr/ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_corr/training_ppl"] > 1.0
    assert "is/ess" not in metrics  # the correction's own statistics need a correction
