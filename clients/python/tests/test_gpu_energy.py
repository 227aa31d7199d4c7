"""GPU energy by counter: mxserve.rlhf.power's NVML binding and gpu_baseline's EnergyMeter
against tests/fake_nvml.c, a stand-in libnvidia-ml that plays a known power trace on
the wall clock (its energy counter the exact integral, nvmlDeviceGetPowerUsage a
one-second moving average, the instant field the trace itself), and a real daemon.

What is checked: the counter joules the daemon books per phase (Telemetry.ReportEnergy,
source gpu_baseline) are the trace's integral over each phase; the samples
(gpu_baseline_sampled) miss a short burst as NVML's averaged reading does; the
summary shows both and their difference; idle power is measured; a GPU without a
counter falls back to samples under gpu_baseline; the daemon refuses bad intervals.
"""

import dataclasses
import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

import mxserve  # noqa: E402
from conftest import HERE, python_env  # noqa: E402
from mxserve.rlhf.gpu_baseline import EnergyMeter, GpuBaseline, summary_table  # noqa: E402
from mxserve.rlhf.gpu_baseline import main as gpu_baseline_main  # noqa: E402
from mxserve.rlhf.power import NvmlPower  # noqa: E402

# Idle, then a 0.3 s burst at 400 W (rollout, the short phase), 1 s at 100 W
# (reward), 0.6 s at 300 W (update), idle again. Offsets from the trace's origin.
IDLE_W = 60.0
STEPS = [(-3600.0, IDLE_W), (0.0, 400.0), (0.3, 100.0), (1.3, 300.0), (1.9, IDLE_W)]
PHASE_ENDS = {"rollout": 0.3, "reward": 1.3, "update": 1.9}
def skew_joules(watts, read_seconds, ends=1):
    """What a meter's dating can move `ends` interval ends' joules at `watts`: each end
    is dated at the middle of a clock bracket at most `read_seconds` wide (and the
    fake counter rounds each read to the millijoule). A read takes microseconds; a
    bracket past 50 ms would make the bound too loose to test anything."""
    assert 0 <= read_seconds < 0.05, read_seconds
    return (watts * read_seconds / 2 + 1e-3) * ends


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake_nvml")
    library = out / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(library),
                    str(HERE / "fake_nvml.c")], check=True)
    return str(library)


@pytest.fixture
def trace(tmp_path, monkeypatch, fake_nvml):
    """Writes the trace with its origin `lead` seconds from now and points the fake
    (and NvmlPower's default library) at it; returns (origin, integral(t0, t1))."""
    def make(lead, steps=STEPS, **flags):
        origin = time.time() + lead
        path = tmp_path / "trace.txt"
        path.write_text("# unix_seconds watts\n" +
                        "".join(f"{origin + t!r} {w!r}\n" for t, w in steps))
        monkeypatch.setenv("MXSERVE_FAKE_NVML_TRACE", str(path))
        monkeypatch.setenv("MXSERVE_NVML_LIBRARY", fake_nvml)
        for name in ("NO_COUNTER", "NO_INSTANT"):
            monkeypatch.setenv(f"MXSERVE_FAKE_NVML_{name}", "1" if flags.get(name.lower()) else "0")
        points = [(origin + t, w) for t, w in steps]

        def integral(t0, t1):
            joules = 0.0
            for (a, w), (b, _) in zip(points, points[1:] + [(float("inf"), 0.0)]):
                lo, hi = max(a, t0), min(b, t1)
                if hi > lo:
                    joules += (hi - lo) * w
            return joules
        return origin, integral
    return make


def sleeper(origin):
    """A workload whose phases end at the trace's steps (on the wall clock)."""
    def work(phase):
        time.sleep(max(0.0, origin + PHASE_ENDS[phase] - time.time()))
        return 0.0
    return work


def test_nvml_reads_the_instant_field_and_falls_back_to_the_average(trace):
    origin, integral = trace(-0.5, [(-10.0, 100.0), (0.0, 300.0)])  # stepped up 0.5 s ago
    power = NvmlPower(index=0)  # the library from MXSERVE_NVML_LIBRARY
    assert power.device_name == "Fake Traced GPU"
    assert power.power_reading == "instant" and power.has_energy_counter
    assert power.watts() == 300.0
    t0, e0, t0_after = time.time(), power.energy_joules(), time.time()
    time.sleep(0.2)
    t1_before, e1, t1 = time.time(), power.energy_joules(), time.time()
    # The counter is the trace's integral (to the millijoule) between the two reads,
    # each somewhere inside its clock bracket.
    assert integral(t0_after, t1_before) - 2e-3 <= e1 - e0 <= integral(t0, t1) + 2e-3
    power.close()

    trace(-0.5, [(-10.0, 100.0), (0.0, 300.0)], no_instant=True)
    averaged = NvmlPower(index=0)
    assert averaged.power_reading == "average"
    # Half of the last second at 100 W, half at 300 W, read a moment later.
    assert 195.0 <= averaged.watts() <= 240.0
    averaged.close()

    trace(-0.5, no_counter=True)
    assert NvmlPower(index=0).energy_joules() is None


def test_counter_joules_per_phase_are_the_traces_integral(client, trace):
    # The averaged reading (no instant field), as NVML gives it on many drivers: the
    # samples lag the 0.3 s burst, the counter does not.
    origin, integral = trace(1.0, no_instant=True)
    power = NvmlPower(index=0, interval=0.05)
    runner = GpuBaseline(client, power, device="cpu", source="gpu_baseline", run="energy/t1",
                         idle_seconds=0.3)
    summary = runner.run(sleeper(origin), steps=1)
    power.close()
    assert summary["energy_counter"] is True
    assert summary["sampled_source"] == "gpu_baseline_sampled"
    assert summary["power_reading"] == "average"
    # Idle: measured before the origin, where the trace is flat.
    assert summary["idle_watts"] == pytest.approx(IDLE_W, rel=0.01)

    intervals = summary["intervals_log"]
    assert [p for p, *_ in intervals] == ["rollout", "reward", "update"]
    for (_, _, end, _), (_, start, _, _) in zip(intervals, intervals[1:]):
        assert start == end  # contiguous: every joule of the run lands in one phase
    report = client.energy_report(run="energy/t1")
    counter = report.by_phase("gpu_baseline")
    sampled = report.by_phase("gpu_baseline_sampled")
    # The meter dates a read at the middle of the clock reads around it; a
    # preemption between them (a loaded CI machine) widens that bracket, and the
    # summary says by how much.
    skew = skew_joules(400.0, summary["counter_read_max_seconds"], ends=2)
    for phase, start, end, joules in intervals:
        expected = integral(start, end)
        assert joules == pytest.approx(expected, abs=skew), phase
        assert counter[phase].joules == pytest.approx(expected, abs=skew), phase
        assert counter[phase].busy_seconds == pytest.approx(end - start, abs=1e-6)
        assert summary["phases"][phase]["counter_joules"] == pytest.approx(counter[phase].joules)
        assert summary["phases"][phase]["joules"] == pytest.approx(counter[phase].joules)
        assert summary["phases"][phase]["sampled_joules"] == pytest.approx(sampled[phase].joules)
        assert summary["phases"][phase]["difference_joules"] == pytest.approx(
            sampled[phase].joules - counter[phase].joules)
    # The phases as the trace has them (boundaries land within a few ms of its steps).
    assert counter["reward"].joules == pytest.approx(100.0, abs=8)
    assert counter["update"].joules == pytest.approx(180.0, abs=8)
    # The rollout: idle until the origin, then the burst's 120 J.
    rollout_start = intervals[0][1]
    assert counter["rollout"].joules == pytest.approx(
        IDLE_W * (origin - rollout_start) + 120.0, abs=8)
    # The samples integrate the one-second average: the burst is mostly missed
    # (about 33 J of its 120 J), and its tail leaks into the reward phase.
    rollout = summary["phases"]["rollout"]
    assert rollout["difference_pct"] < -30
    assert rollout["difference_pct"] == pytest.approx(
        100 * (sampled["rollout"].joules - counter["rollout"].joules) / counter["rollout"].joules)
    assert sampled["reward"].joules > counter["reward"].joules + 20
    assert summary["total_counter_joules"] == pytest.approx(
        sum(e.joules for e in counter.values()))
    assert summary["total_sampled_joules"] == pytest.approx(
        sum(e.joules for e in sampled.values()))
    # The table shows both, the difference and the idle power.
    table = summary_table(summary)
    assert "counter J" in table and "sampled J" in table and "diff %" in table
    assert "idle 60.0 W" in table and "total" in table


def test_without_a_counter_the_samples_are_gpu_baseline(client, trace):
    origin, integral = trace(0.8, no_counter=True)
    power = NvmlPower(index=0, interval=0.05)
    assert not power.has_energy_counter
    runner = GpuBaseline(client, power, device="cpu", run="energy/nocounter", idle_seconds=0.2)
    summary = runner.run(sleeper(origin), steps=1)
    power.close()
    assert summary["energy_counter"] is False
    assert summary["sampled_source"] == "gpu_baseline" and summary["intervals"] == 0
    assert summary["idle_watts"] == pytest.approx(IDLE_W)  # the instant field, flat
    report = client.energy_report(run="energy/nocounter")
    assert report.by_phase("gpu_baseline_sampled") == {}
    booked = report.by_phase("gpu_baseline")
    assert set(booked) == {"rollout", "reward", "update"}
    for phase, entry in booked.items():
        p = summary["phases"][phase]
        assert p["counter_joules"] is None and p["difference_pct"] is None
        assert p["joules"] == p["sampled_joules"] == pytest.approx(entry.joules)
        assert p["joules_local"] == pytest.approx(entry.joules, rel=1e-9)
    # With the instant field the samples follow the trace: 10 Hz trapezoids of
    # step changes are off by at most a sample period's worth of each step.
    assert booked["reward"].joules == pytest.approx(100.0, abs=25)


def test_the_cli_reports_counter_sampled_and_idle(daemon, client, trace, tmp_path, capsys):
    origin, integral = trace(-5.0, [(-3600.0, 250.0)])  # a flat 250 W
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps([{"phase": p, "m": 8, "n": 32, "k": 32}
                                    for p in ("rollout", "reward", "update")]))
    out = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, "-m", "mxserve.gpu_baseline", "--server", daemon.address,
         "--device", "cpu", "--workload", str(workload), "--power-source", "nvml",
         "--interval", "0.05", "--steps", "1", "--min-phase-seconds", "0.3",
         "--idle-seconds", "0.2", "--run", "energy/cli", "--out", str(out)],
        capture_output=True, text=True, timeout=120, env=python_env())
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["energy_counter"] is True
    assert summary["idle_watts"] == pytest.approx(250.0, rel=0.01)
    assert summary["power_reading"] == "instant"
    # Each end of an interval is dated at the middle of the clock reads around its
    # counter read: exact to half that bracket (microseconds; longer where the
    # reader was preempted between them on a loaded machine, up to the 50 ms
    # skew_joules takes).
    skew = skew_joules(250.0, summary["counter_read_max_seconds"], ends=2)
    assert summary["counter_read_max_seconds"] > 0
    report = client.energy_report(run="energy/cli")
    for phase in ("rollout", "reward", "update"):
        p = summary["phases"][phase]
        entry = report.by_phase("gpu_baseline")[phase]
        # Flat power: the counter gives 250 W × the phase's booked time.
        assert p["counter_joules"] == pytest.approx(entry.joules)
        assert entry.joules == pytest.approx(250.0 * entry.busy_seconds, abs=skew)
        assert p["sampled_joules"] == pytest.approx(
            report.by_phase("gpu_baseline_sampled")[phase].joules)
    for interval in summary["intervals_log"]:
        assert interval["joules"] == pytest.approx(
            integral(interval["start"], interval["end"]), abs=skew)
    # The idle figure printed is the summary's, which the counter's dating may
    # move off 250.0 in its first decimal on a loaded machine (asserted above).
    assert (f"energy by NVML's counter, samples as gpu_baseline_sampled; "
            f"idle {summary['idle_watts']:.1f} W") in done.stderr
    assert "counter J" in done.stderr and "diff %" in done.stderr

    # Refused before anything runs (in this process: a second interpreter start
    # would cost seconds).
    with pytest.raises(SystemExit) as exit_:
        gpu_baseline_main(["--server", daemon.address, "--idle-seconds", "nan"])
    assert exit_.value.code == 2
    assert "--idle-seconds: expected 0 to 60, got nan" in capsys.readouterr().err


def test_meter_books_long_phases_in_pieces_and_checks_its_arguments(client, trace):
    trace(-5.0, [(-3600.0, 80.0)])
    power = NvmlPower(index=0, interval=0.05)
    meter = EnergyMeter(client, power, "cuda:7", run="energy/pieces", idle_seconds=0,
                        flush_seconds=0.2, phase="update")
    meter.start()
    time.sleep(0.7)
    meter.boundary("update")  # the same phase: nothing to close
    meter.stop()
    power.close()
    assert meter.idle_watts is None
    assert len(meter.intervals) >= 3 and {p for p, *_ in meter.intervals} == {"update"}
    assert meter.result.intervals_accepted == len(meter.intervals)
    total = sum(j for *_, j in meter.intervals)
    span = meter.intervals[-1][2] - meter.intervals[0][1]
    # Back to back, the pieces' dating errors cancel but at the two ends (a
    # microsecond, or a preempted read's milliseconds), while a lost or doubled
    # 0.2 s piece would be 16 J.
    assert total == pytest.approx(80.0 * span, abs=skew_joules(80.0, meter.max_read_seconds, 2))
    assert client.energy_report(run="energy/pieces").joules("gpu_baseline", "update") == \
        pytest.approx(total, rel=1e-9)
    with pytest.raises(ValueError, match="flush_seconds: expected 0 < s <= 3600"):
        EnergyMeter(client, power, "cuda:7", flush_seconds=7200)
    with pytest.raises(ValueError, match="idle_seconds: expected a finite number >= 0"):
        EnergyMeter(client, power, "cuda:7", idle_seconds=-1)


def test_report_energy_refuses_bad_intervals_and_keeps_the_good(client):
    now = time.time()
    good = mxserve.EnergyInterval("gpu_client", "cuda:0", "reward", now - 2, now - 1, 250.0,
                                  run="energy/client")
    result = client.report_energy([good])
    assert result.intervals_accepted == 1 and result.joules_added == 250.0
    too_much = mxserve.EnergyInterval("gpu_client", "cuda:0", "reward", now - 1, now, 1e9)
    with pytest.raises(mxserve.MxserveError) as error:
        client.report_energy([dataclasses.replace(good, start=now - 4, end=now - 3), too_much])
    assert error.value.code.name == "INVALID_ARGUMENT"
    assert "intervals[1].joules: expected 0 to 12500 (--max-power-watts 10000 W" in str(error.value)
    backwards = ("gpu_client", "cuda:0", "update", now - 1, now - 2, 1.0)  # a plain tuple
    with pytest.raises(mxserve.MxserveError, match=r"intervals\[0\]\.end_seconds: expected "
                                                   r"start_seconds"):
        client.report_energy([backwards])
    with pytest.raises(ValueError, match=r"intervals\[0\]\.run"):
        client.report_energy([("gpu_client", "cuda:0", "update", now - 1, now, 1.0, "a b")])
    # The good intervals of both streams stay booked, nothing of the refused ones.
    assert client.energy_report(run="energy/client").joules("gpu_client", "reward") == 500.0


def test_the_experiments_local_baseline_reads_the_counter_at_the_trainers_phases(client, trace):
    from mxserve.experiment import run as experiment
    from test_rlhf import PROMPTS, _trainer

    trace(-5.0, [(-3600.0, 120.0)])  # flat: each phase's joules are 120 W × its time
    make = experiment._sampler_factory(client, "nvml", "cpu", "energy/ppo")
    trainer = _trainer(None)
    meter = make(lambda: trainer.current_phase)
    assert isinstance(meter, EnergyMeter) and meter.has_counter
    assert meter.sampled_source == "gpu_baseline_sampled"
    entered = []

    def hook(phase):  # what _run_one installs, with a record of the calls
        entered.append(phase)
        meter.boundary(phase)
    trainer.phase_hook = hook
    meter.idle_seconds = 0.1
    meter.start()
    trainer.step(PROMPTS)
    meter.stop()
    # One interval per phase switch, in the trainer's order, back to back.
    sequence = ["rollout"] + entered  # the meter starts in the trainer's first phase
    switches = [p for i, p in enumerate(sequence) if i == 0 or p != sequence[i - 1]]
    assert [p for p, *_ in meter.intervals] == switches
    assert {"rollout", "reward", "update"} <= set(switches)
    report = client.energy_report(run="energy/ppo")
    booked = report.by_phase("gpu_baseline")
    for phase, entry in booked.items():
        ends = 2 * sum(p == phase for p, *_ in meter.intervals)
        assert entry.joules == pytest.approx(
            120.0 * entry.busy_seconds, abs=skew_joules(120.0, meter.max_read_seconds, ends)), phase
        # The phase's intervals hold all of its wall time (and the host work after it).
        assert entry.busy_seconds >= trainer.wall[phase] - 1e-3, phase
    assert set(report.by_phase("gpu_baseline_sampled")) <= {"rollout", "reward", "update"}
    assert meter.idle_watts == pytest.approx(120.0, rel=0.02)  # a 0.1 s window


def test_the_experiment_report_shows_counter_sampled_and_idle(daemon, trace, tmp_path):
    # `--power-source nvml` with the fake library: the locally run FP16 baseline
    # (FP16-cpu here; FP16-cuda on a GPU) books each trainer phase's counter joules
    # under gpu_baseline and its samples under gpu_baseline_sampled, and the report
    # shows both beside the idle power measured before the run.
    import csv
    import os

    trace(-5.0, [(-3600.0, 150.0)])  # flat: every phase's joules are 150 W × its time
    out = tmp_path / "out"
    env = python_env(**{k: os.environ[k] for k in os.environ if k.startswith("MXSERVE_")})
    done = subprocess.run([sys.executable, "-m", "mxserve.experiment", "--server", daemon.address,
                           "--quiet", "--quick", "--steps", "2", "--seeds", "0", "--only", "MX-A",
                           "--power-source", "nvml", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["configuration"]: r for r in csv.DictReader(open(out / "results.csv"))}
    local = rows["FP16-cpu"]
    assert local["energy_label"] == "measured" and local["energy_counter"] == "True"
    assert float(local["idle_watts"]) == pytest.approx(150.0, rel=0.01)
    summary = json.loads((out / "summary.json").read_text())
    run = next(r for r in summary["runs"] if r["configuration"] == "FP16-cpu")
    assert run["counter_read_max_seconds"] > 0
    for phase in ("rollout", "reward", "update"):
        counter = run["energy"][phase]["gpu_baseline"]
        ends = 2 * run["counter_intervals"][phase]
        assert counter == pytest.approx(
            150.0 * run["busy_seconds"][phase]["gpu_baseline"],
            abs=skew_joules(150.0, run["counter_read_max_seconds"], ends)), phase
    # Samples 0.1 s apart may miss a short phase altogether (the reward phase of this
    # tiny model takes milliseconds): that is why the counter books the energy.
    assert sum(run["energy"][p].get("gpu_baseline_sampled", 0.0) for p in run["energy"]) > 0
    report = (out / "report.md").read_text()
    assert "measured on the GPU" in report and "NVML's energy counter" in report
    assert "integrated power samples give" in report and "Idle power before the run: 150.0 W" \
        in report
