"""mxserve.energy_model without a daemon: the port of EstimateGemm against figures
worked out by hand, the parameter file's ranges and their checks, and the saving
range where the answer is known. (test_energy_ledger.py checks the port against
the daemon itself.)"""

import itertools
import json
import math

import pytest

from mxserve import energy_model as em
from mxserve.energy_model import WorkKey

MXFP4, FP16, INT8, MXFP8 = "MXFP4_E2M1", "FP16", "INT8", "MXFP8_E4M3"


@pytest.fixture(scope="module")
def shipped():
    return em.load_energy_model()


def shipped_doc():
    return json.loads(em.DEFAULT_PATH.read_text())


# --- estimate_gemm by hand -------------------------------------------------------------
# Shipped parameters: 300 MHz, 8 × 128 PEs, 38.4 GB/s, 31.2 pJ/B, 25 W.


def test_mxfp4_decode_step_by_hand(shipped):
    # tests/fpga/energy_model_test.cc's case (Qwen2.5-0.5B up projection, M 8):
    # 1 row tile · 38 W tiles · 28 blocks · 32/4 = 8,512 cycles; bytes W 4864 · 476
    # (28 blocks of 16 B + 28 scales) + X 8 · 476 · 38 + Y 8 · 4864 · 4 = 2,615,616,
    # 68.115 µs at 38.4 GB/s (port-bound); joules 34,865,152 · 1 pJ +
    # 2,615,616 · 31.2 pJ + 25 W · 68.115 µs.
    e = em.estimate_gemm(shipped, MXFP4, MXFP4, 8, 4864, 896)
    assert e.macs == 34865152.0
    assert e.cycles == 8512.0
    assert e.bytes == 2615616.0
    assert e.seconds == pytest.approx(6.8115e-05, rel=1e-12)
    assert e.joules == pytest.approx(0.0018193473712, rel=1e-12)


def test_fp16_decode_step_by_hand(shipped):
    # q projection, M 8, N = K = 896: 7 W tiles · 28 blocks · 32 / 1 lane = 6,272
    # cycles (20.9 µs). Bytes: W 896 · 1792 = 1,605,632; X 8 · 1792 = 14,336 per W
    # tile, · 7 = 100,352; Y 8 · 896 · 4 = 28,672; 1,734,656 in all, 45.173 µs:
    # port-bound. Joules: 6,422,528 MACs · 5 pJ = 32.11264 µJ, + 1,734,656 B ·
    # 31.2 pJ = 54.1212672 µJ, + 25 W · 45.17333 µs = 1129.33333 µJ.
    e = em.estimate_gemm(shipped, FP16, FP16, 8, 896, 896)
    assert e.macs == 6422528.0
    assert e.cycles == 6272.0
    assert e.bytes == 1734656.0
    assert e.seconds == pytest.approx(1734656 / 38.4e9, rel=1e-15)
    assert e.joules == pytest.approx(32.11264e-6 + 54.1212672e-6 + 1129.333333333e-6, rel=1e-12)


def test_int8_prefill_with_ragged_k_by_hand(shipped):
    # M 64, N 256, K 100: 8 row tiles · 2 W tiles · 4 blocks (K padded to 128) ·
    # 32 / 2 lanes = 1,024 cycles, 3.4133 µs. Bytes: INT8 rows are K bytes plus an
    # FP32 scale: W 256 · 104 = 26,624; X 64 · 104 = 6,656, · 2 W tiles = 13,312;
    # Y 64 · 256 · 4 = 65,536; 105,472 in all, 2.7467 µs: compute-bound. Joules:
    # 1,638,400 · 1.5 pJ = 2.4576 µJ, + 105,472 · 31.2 pJ = 3.2907264 µJ, + 25 W ·
    # 3.41333 µs = 85.33333 µJ.
    e = em.estimate_gemm(shipped, INT8, INT8, 64, 256, 100)
    assert e.cycles == 1024.0
    assert e.bytes == 105472.0
    assert e.seconds == pytest.approx(1024 / 3e8, rel=1e-15)
    assert e.joules == pytest.approx(2.4576e-6 + 3.2907264e-6 + 85.333333333e-6, rel=1e-12)


def test_a_mixed_pair_runs_at_the_slower_rate_and_the_higher_energy(shipped):
    # MXFP4 X with FP16 W, M 8, N 128, K 64: FP16's 1 lane, FP16's 5 pJ. Cycles 1 ·
    # 1 · 2 blocks · 32 = 64. Bytes: X 8 · (2 · 16 + 2 scales) = 272, W 128 · 128 =
    # 16,384, Y 4,096: 20,752, port-bound (540.4 ns).
    e = em.estimate_gemm(shipped, MXFP4, FP16, 8, 128, 64)
    assert e.cycles == 64.0
    assert e.bytes == 20752.0
    assert e.joules == pytest.approx(65536 * 5e-12 + 20752 * 31.2e-12 + 25 * 20752 / 38.4e9,
                                     rel=1e-12)


def test_lo_bcq_by_hand(shipped):
    # LO_BCQ X and W, M 8, N 128, K 64: INT8's 2 lanes, 1.8 pJ (the lookup
    # before the multiplier). Cycles 1 · 1 · 2 blocks · 32 / 2 = 32. Bytes: a row
    # of 64 is one array, 32 B of codes + 8 of scale and selectors: X 8 · 40 =
    # 320, W 128 · 40 = 5,120, Y 8 · 128 · 4 = 4,096; 9,536, port-bound.
    e = em.estimate_gemm(shipped, "LO_BCQ", "LO_BCQ", 8, 128, 64)
    assert e.cycles == 32.0
    assert e.bytes == 9536.0
    assert e.joules == pytest.approx(65536 * 1.8e-12 + 9536 * 31.2e-12 + 25 * 9536 / 38.4e9,
                                     rel=1e-12)


def test_packed_bytes_follow_mx_row_layout():
    # One row of K = 33: MX rounds up to 2 blocks (+2 scale bytes); others are exact.
    assert em.packed_bytes("MXFP4_E2M1", 1, 33) == 2 * 16 + 2
    assert em.packed_bytes("MXFP6_E3M2", 1, 33) == 2 * 24 + 2
    assert em.packed_bytes("MXINT8", 1, 33) == 2 * 32 + 2
    assert em.packed_bytes("INT8", 3, 33) == 3 * (33 + 4)
    assert em.packed_bytes("BF16", 1, 33) == 66
    assert em.packed_bytes("FP32", 2, 33) == 264


# --- ledgers ------------------------------------------------------------------------------


def test_phase_joules_counts_each_entry_and_recast_keeps_the_shapes(shipped):
    fwd = WorkKey("rollout", "r", MXFP4, MXFP4, 8, 4864, 896, "forward")
    gi = ("update", "r", FP16, FP16, 8, 896, 896, "grad_input")  # a plain tuple works too
    joules = em.phase_joules({fwd: 3, gi: 2}, shipped)
    assert joules["rollout"] == pytest.approx(3 * 0.0018193473712, rel=1e-12)
    assert joules["update"] == pytest.approx(2 * 0.0012155672405333333, rel=1e-12)
    fp16 = em.recast({fwd: 3, gi: 2}, FP16)
    assert em.work_counts(fp16) == {fwd._replace(x_format=FP16, w_format=FP16): 3,
                                    WorkKey(*gi): 2}
    with pytest.raises(ValueError, match="unknown format 'FP8'"):
        em.recast({fwd: 1}, "FP8")


def test_work_rows_are_json_and_price_as_the_counts_do(shipped):
    a = WorkKey("rollout", "r", MXFP4, MXFP4, 8, 4864, 896, "forward")
    b = WorkKey("update", "r", FP16, FP16, 8, 896, 896, "grad_input")
    rows = em.work_rows({b: 2, a: 3})
    # Sorted by key, one row per GEMM, and through JSON unchanged.
    assert rows == [{"phase": "rollout", "run": "r", "x_format": MXFP4, "w_format": MXFP4,
                     "m": 8, "n": 4864, "k": 896, "kind": "forward", "count": 3},
                    {**b._asdict(), "count": 2}]
    assert json.loads(json.dumps(rows)) == rows
    assert em.phase_joules(rows, shipped) == em.phase_joules({a: 3, b: 2}, shipped)
    # Merging sums the counts of equal GEMMs (two sessions, say).
    assert em.work_counts(em.merge_work(rows, {a: 1}, [])) == {a: 4, b: 2}
    with pytest.raises(ValueError, match="work: a row without 'count'"):
        em.phase_joules([a._asdict()], shipped)


# --- the parameter file -------------------------------------------------------------------


def test_every_parameter_of_the_shipped_file_has_a_range(shipped):
    names = [r.name for r in shipped.ranges]
    assert names[:4] == ["clock_hz", "hbm_bytes_per_second", "energy_per_byte_pj",
                         "static_power_watts"]
    for parameter in ("macs_per_pe_cycle", "energy_per_mac_pj"):
        groups = [r for r in shipped.ranges if r.parameter == parameter]
        covered = sorted(f for r in groups for f in r.formats)
        assert covered == sorted(em.FORMATS)
    for r in shipped.ranges:
        assert 0 < r.low <= r.nominal <= r.high and r.source.strip()
    assert shipped.range("static_power_watts").low == 15.0
    assert shipped.range("energy_per_mac_pj[float]").formats == ("BF16", "FP16", "FP32", "NF4",
                                                                 "BNB_FP4")


def test_scaled_moves_a_scalar_or_a_whole_group(shipped):
    p = shipped.scaled({"clock_hz": 1.5, "energy_per_mac_pj[mx_integer]": 2.0})
    assert p.clock_hz == 4.5e8
    assert p.energy_per_mac_pj["MXFP4_E2M1"] == 2.0 and p.energy_per_mac_pj["MXINT8"] == 3.0
    assert p.energy_per_mac_pj["FP16"] == 5.0
    assert shipped.clock_hz == 3e8  # a new object; the loaded one is unchanged


def parse(doc):
    return em.parse_energy_model(json.dumps(doc), "test.json")


def test_bad_ranges_are_rejected_naming_the_field():
    doc = shipped_doc()
    doc["ranges"]["static_power_watts"]["low"] = 30
    with pytest.raises(em.EnergyModelError,
                       match=r"test.json: energy_model.ranges.static_power_watts: expected low "
                             r"<= 25 <= high, got low 30 and high 40"):
        parse(doc)
    doc = shipped_doc()
    doc["ranges"]["energy_per_mac_pj"]["int8"]["formats"] = []
    with pytest.raises(em.EnergyModelError, match=r"ranges.energy_per_mac_pj.int8.formats"):
        parse(doc)
    doc = shipped_doc()
    del doc["ranges"]["macs_per_pe_cycle"]["int8"]
    with pytest.raises(em.EnergyModelError, match=r"ranges.macs_per_pe_cycle: no group holds INT8"):
        parse(doc)
    doc = shipped_doc()
    doc["ranges"]["energy_per_mac_pj"]["float"]["formats"].append("MXFP4_E2M1")
    with pytest.raises(em.EnergyModelError, match=r"MXFP4_E2M1 is already in group 'mx_integer'"):
        parse(doc)
    doc = shipped_doc()
    doc["ranges"]["clock_hz"]["hi"] = 5e8
    with pytest.raises(em.EnergyModelError, match=r"ranges.clock_hz.hi: unknown key"):
        parse(doc)
    doc = shipped_doc()
    del doc["ranges"]["hbm_bytes_per_second"]
    with pytest.raises(em.EnergyModelError, match=r"ranges.hbm_bytes_per_second: missing"):
        parse(doc)
    doc = shipped_doc()
    doc["ranges"]["energy_per_byte_pj"]["source"] = " "
    with pytest.raises(em.EnergyModelError, match=r"ranges.energy_per_byte_pj.source"):
        parse(doc)


def test_nominal_values_are_checked_as_the_daemon_checks_them():
    doc = shipped_doc()
    del doc["macs_per_pe_cycle"]["FP16"]
    with pytest.raises(em.EnergyModelError, match=r"energy_model.macs_per_pe_cycle.FP16: missing"):
        parse(doc)
    doc = shipped_doc()
    doc["energy_per_mac_pj"]["FP8"] = 1.0
    with pytest.raises(em.EnergyModelError, match=r"energy_model.energy_per_mac_pj.FP8: unknown"):
        parse(doc)
    doc = shipped_doc()
    doc["static_power_watts"] = -1
    with pytest.raises(em.EnergyModelError, match=r"static_power_watts: expected a positive"):
        parse(doc)


def test_a_file_without_ranges_loads_but_has_no_saving_range(shipped):
    doc = shipped_doc()
    del doc["ranges"]
    p = parse(doc)
    assert p.ranges == () and p.clock_hz == shipped.clock_hz
    work = {WorkKey("rollout", "", FP16, FP16, 8, 128, 64, "forward"): 1}
    with pytest.raises(em.EnergyModelError, match=r"test.json: no \"ranges\" object"):
        em.saving_range(work, work, p)


def test_a_missing_file_names_where_it_was_looked_for(tmp_path):
    with pytest.raises(em.EnergyModelError, match=r"nowhere.json': cannot read"):
        em.load_energy_model(tmp_path / "nowhere.json")


# --- saving_range ---------------------------------------------------------------------------


def only_static_power_varies():
    """The shipped file with every range pinned to its nominal but static power's."""
    doc = shipped_doc()
    for p in ("clock_hz", "hbm_bytes_per_second", "energy_per_byte_pj"):
        doc["ranges"][p].update(low=doc[p], high=doc[p])
    for p in ("macs_per_pe_cycle", "energy_per_mac_pj"):
        for name, group in doc["ranges"][p].items():
            if not name.startswith("_"):
                group.update(low_factor=1, high_factor=1)
    return parse(doc)


def test_saving_range_with_only_static_power_varying_by_hand():
    # Config: the MXFP4 decode step above, dynamic D_c = 34,865,152 · 1 pJ +
    # 2,615,616 · 31.2 pJ = 116.4723712 µJ over t_c = 68.115 µs. Baseline: the same
    # GEMM in FP16: 34,048 cycles (113.5 µs) against 9,416,704 bytes (245.2267 µs):
    # D_b = 34,865,152 · 5 pJ + 9,416,704 · 31.2 pJ = 468.1269248 µJ over
    # t_b = 9,416,704 / 38.4e9 s. Saving(S) = 100 (1 − (D_c + S t_c)/(D_b + S t_b)),
    # monotone in S (a ratio of two linear functions), and decreasing here since
    # t_c D_b > D_c t_b: the max at 15 W, the min at 40 W.
    d_c, t_c = 116.4723712e-6, 68.115e-6
    d_b, t_b = 468.1269248e-6, 9416704 / 38.4e9

    def saving(s):
        return 100 * (1 - (d_c + s * t_c) / (d_b + s * t_b))

    params = only_static_power_varies()
    config = {WorkKey("rollout", "", MXFP4, MXFP4, 8, 4864, 896, "forward"): 1}
    report = em.saving_range(config, em.recast(config, FP16), params)
    assert report.free_parameters == ["static_power_watts"]
    assert report.method.startswith("all 2 corners of the 1-parameter box")
    rollout = report.phases["rollout"]
    assert rollout.nominal == pytest.approx(saving(25), rel=1e-12)
    assert rollout.max == pytest.approx(saving(15), rel=1e-12)
    assert rollout.min == pytest.approx(saving(40), rel=1e-12)
    # Static power dominates both sides here, so 15-40 W moves the saving little.
    assert (saving(40), saving(25), saving(15)) == pytest.approx((72.356, 72.429, 72.551),
                                                                 abs=5e-4)
    assert rollout.config_joules == pytest.approx(d_c + 25 * t_c, rel=1e-12)
    assert rollout.baseline_joules == pytest.approx(d_b + 25 * t_b, rel=1e-12)
    [swing] = rollout.swings
    assert (swing.parameter, swing.low, swing.high) == ("static_power_watts", 15.0, 40.0)
    assert swing.saving_at_low == pytest.approx(saving(15), rel=1e-12)
    assert swing.swing == pytest.approx(saving(15) - saving(40), rel=1e-12)
    assert report.phases["total"].nominal == pytest.approx(saving(25), rel=1e-12)


QWEN_LAYERS = [(896, 896), (128, 896), (128, 896), (896, 896), (4864, 896), (4864, 896),
               (896, 4864)]  # (out, in) of one Qwen2.5-0.5B block


def qwen_work():
    """A rollout of decode steps in MXFP4 and an update (forward, grad_input,
    grad_weight at 512 tokens) in MXFP8, per block of Qwen2.5-0.5B."""
    work = {}
    for n, k in QWEN_LAYERS:
        work[WorkKey("rollout", "a", MXFP4, MXFP4, 8, n, k, "forward")] = 64
        work[WorkKey("update", "a", MXFP8, MXFP8, 512, n, k, "forward")] = 4
        work[WorkKey("update", "a", MXFP8, MXFP8, 512, k, n, "grad_input")] = 4
        work[WorkKey("update", "a", MXFP8, MXFP8, n, k, 512, "grad_weight")] = 4
    return work


def test_the_shipped_box_brackets_the_nominal_and_its_corners(shipped):
    config = qwen_work()
    baseline = em.recast(config, FP16)
    report = em.saving_range(config, baseline, shipped, samples=256)
    # Neither ledger runs INT8, so its groups stay out of the box: 10 parameters.
    assert report.fixed_parameters == ["macs_per_pe_cycle[int8]", "energy_per_mac_pj[int8]"]
    assert len(report.free_parameters) == 10
    assert report.method == ("all 1024 corners of the 10-parameter box plus 256 log-uniform "
                             "interior points (seed 0)")
    assert report.draws == 1 + 2 * 10 + 1024 + 256
    nominal_c, nominal_b = em.phase_joules(config, shipped), em.phase_joules(baseline, shipped)
    for phase in ("rollout", "update", "total"):
        r = report.phases[phase]
        assert r.min < r.nominal < r.max
        c = sum(nominal_c.values()) if phase == "total" else nominal_c[phase]
        b = sum(nominal_b.values()) if phase == "total" else nominal_b[phase]
        # The vectorized pricing is estimate_gemm's.
        assert r.nominal == pytest.approx(100 * (1 - c / b), rel=1e-12)
        assert r.config_joules == pytest.approx(c, rel=1e-12)
        swings = [s.swing for s in r.swings]
        assert swings == sorted(swings, reverse=True) and swings[0] > 0
    # Every corner, priced one estimate_gemm at a time, lies within [min, max];
    # the extremes of the report are attained somewhere, so at least as wide.
    names = report.free_parameters
    total = report.phases["total"]
    lowest, highest = math.inf, -math.inf
    for corner in itertools.product((0, 1), repeat=len(names)):
        p = shipped.scaled({name: (shipped.range(name).high_factor if hi else
                                   shipped.range(name).low_factor)
                            for name, hi in zip(names, corner)})
        s = 100 * (1 - sum(em.phase_joules(config, p).values()) /
                   sum(em.phase_joules(baseline, p).values()))
        lowest, highest = min(lowest, s), max(highest, s)
    assert total.min <= lowest + 1e-9 and highest - 1e-9 <= total.max
    assert total.min == pytest.approx(lowest, abs=0.5)  # the corners are (near) the extremes
    # One-at-a-time: static power's swing at its low, priced directly.
    static = next(s for s in total.swings if s.parameter == "static_power_watts")
    p = shipped.scaled({"static_power_watts": 15 / 25})
    direct = 100 * (1 - sum(em.phase_joules(config, p).values()) /
                    sum(em.phase_joules(baseline, p).values()))
    assert static.saving_at_low == pytest.approx(direct, rel=1e-12)
    assert total.most_sensitive(2) == [s.parameter for s in total.swings[:2]]
    assert json.loads(json.dumps(report.to_dict()))["phases"]["total"]["swings"][0]["swing"] > 0


def test_a_larger_box_is_sampled_by_latin_hypercube_with_its_seed(shipped):
    config = qwen_work()
    baseline = em.recast(config, FP16)
    a = em.saving_range(config, baseline, shipped, max_corner_parameters=4, samples=200, seed=7)
    b = em.saving_range(config, baseline, shipped, max_corner_parameters=4, samples=200, seed=7)
    c = em.saving_range(config, baseline, shipped, max_corner_parameters=4, samples=200, seed=8)
    assert a.method.startswith("Latin hypercube of 200 points over the 10-parameter box")
    assert "seed 7" in a.method and a.seed == 7
    assert a.draws == 1 + 2 * 10 + 200
    assert a.to_dict() == b.to_dict()
    assert c.seed == 8 and "seed 8" in c.method
    full = em.saving_range(config, baseline, shipped, samples=0)
    for phase, r in a.phases.items():
        assert r.min <= r.nominal <= r.max
        # A sample of the box: inside what its corners span (for this work).
        assert full.phases[phase].min - 1e-9 <= r.min and r.max <= full.phases[phase].max + 1e-9
    # Same nominal and swings whatever covers the box.
    assert a.phases["total"].nominal == full.phases["total"].nominal
    assert [s.parameter for s in a.phases["total"].swings] == \
        [s.parameter for s in full.phases["total"].swings]
    assert full.seed is None and full.method == "all 1024 corners of the 10-parameter box"


def test_a_phase_without_baseline_energy_has_no_saving(shipped):
    config = {WorkKey("reward", "", MXFP4, MXFP4, 8, 128, 64, "forward"): 1,
              WorkKey("rollout", "", MXFP4, MXFP4, 8, 128, 64, "forward"): 1}
    baseline = {WorkKey("rollout", "", FP16, FP16, 8, 128, 64, "forward"): 1}
    report = em.saving_range(config, baseline, shipped, samples=16)
    assert report.phases["reward"].nominal is None and report.phases["reward"].min is None
    assert report.phases["rollout"].nominal is not None
    # The total still compares everything: the config's reward work counts against it.
    assert report.phases["total"].nominal < report.phases["rollout"].nominal


def test_the_fpga_readme_example_is_what_saving_range_reports(shipped):
    # fpga/README.md, "Parameter ranges", quotes these figures.
    work = qwen_work()
    report = em.saving_range(work, em.recast(work, FP16), shipped)
    rollout, update = report.phases["rollout"], report.phases["update"]
    assert [round(v, 1) for v in (rollout.nominal, rollout.min, rollout.max)] == [72.9, 57.9, 84.1]
    assert rollout.most_sensitive(2) == ["energy_per_mac_pj[float]",
                                         "energy_per_mac_pj[mx_integer]"]
    assert [round(v, 1) for v in (update.nominal, update.min, update.max)] == [3.2, -99.6, 54.9]
    assert update.most_sensitive(2) == ["macs_per_pe_cycle[mx_wide]", "macs_per_pe_cycle[float]"]
