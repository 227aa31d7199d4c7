"""mxserve.rlhf.gpu_baseline without a GPU: replayed power traces, and NVML's ctypes
binding against a stand-in libnvidia-ml built by the test. The arithmetic runs on
the CPU in FP32; what is checked is the streaming and the energy bookkeeping."""

import csv
import json
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")

import mxserve  # noqa: E402
from conftest import python_env  # noqa: E402
from mxserve.rlhf.gpu_baseline import GpuBaseline, LayerShape, load_workload  # noqa: E402
from mxserve.rlhf.power import NvmlPower, PowerSourceError, ReplayPower  # noqa: E402

TINY = [{"phase": "rollout", "m": 8, "n": 64, "k": 64, "repeat": 2},
        {"phase": "reward", "m": 32, "n": 64, "k": 64},
        {"phase": "update", "m": 32, "n": 64, "k": 64}]


def trapezoids(rows):
    """{phase: joules}: each pair's trapezoid goes to the later row's phase."""
    out = {}
    for (t0, w0, _), (t1, w1, phase) in zip(rows, rows[1:]):
        out[phase] = out.get(phase, 0.0) + (t1 - t0) * (w0 + w1) / 2
    return out


def write_trace(path, rows):
    path.write_text("timestamp,watts,phase\n" +
                    "".join(f"{t},{w},{p or ''}\n" for t, w, p in rows))


def run_cli(daemon, tmp_path, *args):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(TINY))
    return subprocess.run(
        [sys.executable, "-m", "mxserve.gpu_baseline", "--server", daemon.address,
         "--device", "cpu", "--workload", str(workload), *args],
        capture_output=True, text=True, timeout=120, env=python_env())


def test_replayed_power_is_accounted_per_phase(daemon, client, tmp_path):
    # 1.5 s of samples, 10 Hz, a ramp from 100 W to 175 W; the run lasts ~2.4 s, so
    # every sample is played back.
    rows = [(5000.0 + 0.1 * i, 100.0 + 5 * i, None) for i in range(16)]
    write_trace(tmp_path / "trace.csv", rows)
    out, log = tmp_path / "summary.json", tmp_path / "samples.csv"
    done = run_cli(daemon, tmp_path, "--power-source", f"replay:{tmp_path / 'trace.csv'}",
                   "--steps", "2", "--min-phase-seconds", "0.4", "--source", "gpu_replay",
                   "--out", str(out), "--samples-out", str(log))
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["samples"] == summary["samples_accepted"] == 16
    assert summary["power_source"].startswith("replay:")
    # A replay is labelled as one wherever it appears: never a measurement.
    assert summary["energy_label"] == "replayed"
    assert "REPLAYED power trace, not a measurement" in done.stderr  # the table

    # What was sent: the trace's watts at the trace's spacing, each tagged with the
    # phase running then.
    with open(log) as f:
        sent = [(float(r["timestamp"]), float(r["watts"]), r["phase"]) for r in csv.DictReader(f)]
    assert [w for _, w, _ in sent] == [w for _, w, _ in rows]
    assert [round(t - sent[0][0], 6) for t, _, _ in sent] == \
        [round(t - rows[0][0], 6) for t, _, _ in rows]
    assert [p for _, _, p in sent][0] == "rollout" and {p for _, _, p in sent} <= \
        {"rollout", "reward", "update"}

    # The daemon's report: per phase the trapezoids of exactly those samples, and in
    # all the integral of the whole trace (1.5 s × 137.5 W).
    report = client.energy_report().by_phase("gpu_replay")
    expected = trapezoids(sent)
    assert set(report) == set(expected)
    for phase, joules in expected.items():
        assert report[phase].joules == pytest.approx(joules, rel=1e-9)
        assert summary["phases"][phase]["joules"] == pytest.approx(joules, rel=1e-9)
        assert summary["phases"][phase]["joules_local"] == pytest.approx(joules, rel=1e-9)
    assert sum(e.joules for e in report.values()) == pytest.approx(206.25, rel=1e-6)
    assert summary["total_joules"] == pytest.approx(206.25, rel=1e-6)
    for phase in ("rollout", "reward", "update"):
        assert summary["phases"][phase]["seconds"] >= 0.8  # 2 steps × --min-phase-seconds
        assert summary["phases"][phase]["flops"] > 0
    # The table: a replayed trace has no energy counter, so the samples are the energy.
    assert "rollout" in done.stderr and "sampled J" in done.stderr
    assert "energy by integrated samples (no counter); idle not measured" in done.stderr
    assert summary["energy_counter"] is False and summary["intervals"] == 0
    for phase in ("rollout", "reward", "update"):
        assert summary["phases"][phase]["counter_joules"] is None
        assert summary["phases"][phase]["sampled_joules"] == summary["phases"][phase]["joules"]


def test_a_run_tag_reads_only_its_own_samples(daemon, client, tmp_path):
    # Another client reports the same source (another device) untagged while the
    # runner runs: with --run, the summary counts the runner's samples only.
    rows = [(7000.0 + 0.1 * i, 120.0 + 4 * i, None) for i in range(12)]
    write_trace(tmp_path / "trace.csv", rows)
    stop = threading.Event()

    def other_client():
        def samples():
            while not stop.is_set():
                yield mxserve.PowerSample("gpu_tagged", "other:0", "rollout", time.time(), 300.0,
                                          run="")
                time.sleep(0.05)
        client.report_power(samples())

    other = threading.Thread(target=other_client)
    other.start()
    try:
        out, log = tmp_path / "summary.json", tmp_path / "samples.csv"
        done = run_cli(daemon, tmp_path, "--power-source", f"replay:{tmp_path / 'trace.csv'}",
                       "--steps", "1", "--min-phase-seconds", "0.5", "--source", "gpu_tagged",
                       "--run", "gpu-test/run-1", "--out", str(out), "--samples-out", str(log))
    finally:
        stop.set()
        other.join()
    assert done.returncode == 0, done.stderr
    assert "run gpu-test/run-1" in done.stderr  # the table's first line
    summary = json.loads(out.read_text())
    assert summary["run"] == "gpu-test/run-1"
    assert summary["samples"] == summary["samples_accepted"] == 12
    with open(log) as f:
        sent = [(float(r["timestamp"]), float(r["watts"]), r["phase"]) for r in csv.DictReader(f)]
    expected = trapezoids(sent)
    report = client.energy_report(run="gpu-test/run-1").by_phase("gpu_tagged")
    assert set(report) == set(expected)
    for phase, joules in expected.items():
        assert report[phase].joules == pytest.approx(joules, rel=1e-9)
        assert summary["phases"][phase]["joules"] == pytest.approx(joules, rel=1e-9)
    # 1.1 s × 142 W of the trace; the other client's 300 W are in the total only.
    assert summary["total_joules"] == pytest.approx(156.2, rel=1e-6)
    assert client.energy_report().joules(source="gpu_tagged") > summary["total_joules"] + 100

    done = run_cli(daemon, tmp_path, "--power-source", f"replay:{tmp_path / 'trace.csv'}",
                   "--run", "a b")
    assert done.returncode == 2
    assert "--run: expected 1-64 characters of [A-Za-z0-9_.:/-], got 'a b'" in done.stderr


def test_a_trace_with_phases_replays_exactly(daemon, client, tmp_path):
    phases = ["rollout"] * 4 + ["reward"] * 3 + ["update"] * 5
    rows = [(0.05 * i + 1.0, 40.0 + (i % 3) * 25.5, phases[i]) for i in range(12)]
    write_trace(tmp_path / "trace.csv", rows)
    done = run_cli(daemon, tmp_path, "--power-source", f"replay:{tmp_path / 'trace.csv'}",
                   "--steps", "1", "--min-phase-seconds", "0.3", "--source", "gpu_phased",
                   "--out", str(tmp_path / "s.json"))
    assert done.returncode == 0, done.stderr
    report = client.energy_report().by_phase("gpu_phased")
    expected = trapezoids(rows)  # from the file alone
    assert {p: pytest.approx(j, rel=1e-6) for p, j in expected.items()} == \
        {p: e.joules for p, e in report.items()}


def test_callable_workloads_run_per_phase(client, tmp_path):
    write_trace(tmp_path / "trace.csv", [(0.0, 10.0, None), (0.1, 10.0, None)])
    calls = []
    runner = GpuBaseline(client, ReplayPower(str(tmp_path / "trace.csv")), device="cpu",
                         source="gpu_callable")
    def work(phase):
        calls.append((phase, runner.phase))
        time.sleep(0.06)  # the whole run outlasts the 0.1 s trace
        return 1e6

    summary = runner.run(work, steps=2, phases=["rollout", "update"])
    assert calls == [("rollout", "rollout"), ("update", "update")] * 2
    assert summary["phases"]["update"]["flops"] == 2e6
    assert set(summary["phases"]) == {"rollout", "update"}
    assert summary["samples"] == 2
    # The same source runs again: the trace plays from its start once more.
    again = runner.run(lambda phase: time.sleep(0.15), steps=1, phases=["reward"])
    assert again["samples"] == 2
    assert again["phases"]["reward"]["joules"] == pytest.approx(1.0, rel=1e-5)  # 0.1 s × 10 W


FAKE_NVML = r"""
#include <time.h>
typedef void* nvmlDevice_t;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
static double start;
static int fake_device;
int nvmlInit_v2(void) { start = now(); return 0; }
int nvmlShutdown(void) { return 0; }
const char* nvmlErrorString(int code) { return code == 2 ? "Invalid Argument" : "Unknown"; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device) {
  if (index != 0) return 2;
  *device = &fake_device; return 0; }
int nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned length) {
  const char* s = "Fake GPU"; unsigned i = 0;
  for (; s[i] && i + 1 < length; ++i) name[i] = s[i];
  name[i] = 0; return 0; }
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned* milliwatts) { *milliwatts = 150000; return 0; }
int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long* millijoules) {
  *millijoules = (unsigned long long)((now() - start) * 150000.0); return 0; }
"""


@pytest.fixture
def fake_nvml(tmp_path):
    source = tmp_path / "fake_nvml.c"
    source.write_text(FAKE_NVML)
    library = tmp_path / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                   check=True)
    return str(library)


def test_nvml_binding_against_a_stand_in_library(client, fake_nvml):
    power = NvmlPower(index=0, interval=0.05, library=fake_nvml)
    assert power.device_name == "Fake GPU" and power.watts() == 150.0
    with pytest.raises(PowerSourceError, match=r"nvmlDeviceGetHandleByIndex_v2\(3\) failed: "
                                               r"Invalid Argument \(NVML error 2\)"):
        NvmlPower(index=3, library=fake_nvml)
    runner = GpuBaseline(client, power, device="cpu", source="gpu_fake_nvml",
                         min_phase_seconds=0.25)
    summary = runner.run([LayerShape("rollout", 8, 64, 64)], steps=1)
    # This stand-in has an energy counter (no instant field): the joules are the
    # counter's, 150 W × the time between the first and last counter read, which
    # bracket the run's wall time; the samples go to gpu_fake_nvml_sampled.
    assert summary["energy_counter"] and summary["power_reading"] == "average"
    assert summary["sampled_source"] == "gpu_fake_nvml_sampled"
    assert summary["idle_watts"] == pytest.approx(150.0, abs=0.1)
    span = summary["wall_seconds"] + 0.02
    total = sum(p["joules"] for p in summary["phases"].values())
    assert summary["samples"] >= 10
    assert total == pytest.approx(summary["total_joules"], rel=1e-12)
    assert 150 * (span - 0.1) <= total <= 150 * span
    assert client.energy_report().joules(source="gpu_fake_nvml") == pytest.approx(total,
                                                                                  rel=1e-9)
    assert power.energy_joules() > 0


def test_bad_inputs_exit_2_with_the_reason(daemon, tmp_path):
    write_trace(tmp_path / "trace.csv", [(2.0, 10.0, None), (1.0, 10.0, None)])
    done = run_cli(daemon, tmp_path, "--power-source", f"replay:{tmp_path / 'trace.csv'}")
    assert done.returncode == 2
    assert "trace.csv:3: timestamp 1.0 is earlier than the previous row's 2.0" in done.stderr

    done = run_cli(daemon, tmp_path, "--power-source", "replay:/no/such.csv")
    assert done.returncode == 2 and "cannot read /no/such.csv" in done.stderr

    (tmp_path / "bad.csv").write_text("0,10\n1,-5\n")
    done = run_cli(daemon, tmp_path, "--power-source", f"replay:{tmp_path / 'bad.csv'}")
    assert done.returncode == 2 and "bad.csv:2: expected a finite timestamp and watts >= 0" \
        in done.stderr

    done = run_cli(daemon, tmp_path, "--power-source", "watts-meter")
    assert done.returncode == 2 and "--power-source: expected 'nvml'" in done.stderr

    (tmp_path / "w.json").write_text('[{"phase": "training", "m": 1, "n": 1, "k": 1}]')
    with pytest.raises(ValueError, match="unknown phase 'training'"):
        load_workload(str(tmp_path / "w.json"))


def test_no_gpu_is_a_clear_error(daemon, tmp_path):
    write_trace(tmp_path / "trace.csv", [(0.0, 10.0, None)])
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(TINY))
    done = subprocess.run(
        [sys.executable, "-m", "mxserve.gpu_baseline", "--server", daemon.address,
         "--device", "cuda:0", "--power-source", f"replay:{tmp_path / 'trace.csv'}",
         "--workload", str(workload)], capture_output=True, text=True, timeout=120,
        env=python_env())
    import torch
    if torch.cuda.is_available():
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert "CUDA is not available to torch; run with --device cpu" in done.stderr
