"""GPU baseline: the same RLHF work on a GPU in FP16, with its measured energy reported
to mxserved (source `gpu_baseline`), so the daemon's energy report compares the two.

    python3 -m mxserve.gpu_baseline --server 127.0.0.1:50051 --steps 5 --out gpu.json

The workload is a list of layer GEMMs per phase (default: the 168 linear layers of
Qwen2.5-0.5B; rollout a decode step of M=8 rows, reward a forward of M=512, update
forward and backward at M=512) or a callable.

What is measured how (`EnergyMeter`):
- Phase energy, where the GPU has an energy counter (NVML's
  `nvmlDeviceGetTotalEnergyConsumption`, Volta and newer): at every phase boundary
  the device is synchronised (the phase's queued kernels finish inside it), the
  counter read, and the phase's joules, the counter's difference since the previous
  boundary, sent through Telemetry.ReportEnergy under `gpu_baseline`. NVML's
  `nvmlDeviceGetPowerUsage` is a one-second moving average on Ampere and newer, so
  integrating it misses short phases (an H200's 0.8 s update phase came out 40 %
  low); the counter does not. It updates about every 100 ms: phases well under a
  second are noisy, use --min-phase-seconds to repeat their work.
- Power samples, about ten a second (NVML's instant power field where the driver
  has it, else nvmlDeviceGetPowerUsage; or `--power-source replay:FILE`, CSV
  timestamp,watts[,phase], where there is no GPU), each tagged with the phase
  running when it was taken, streamed through Telemetry.ReportPower. With a counter
  they go under `gpu_baseline_sampled` (the timeline, and the sampled energy the
  summary compares with the counter's); without one (pre-Volta, NVML says not
  supported, a replayed trace) under `gpu_baseline`, integrated by the daemon
  (trapezoids, into the later sample's phase). Never both under one source.
- Idle power: before the run the device is left alone for --idle-seconds and its
  power measured (counter difference over time, else the mean reading).

The summary (JSON with --out, a table on stderr) has per phase and in total the
counter's joules, the samples' joules and their difference (J and %), and the idle
watts. With `--run TAG` every sample and interval carries the run tag, the daemon
books the energy under that run, and the summary reads the run's own energy report:
other clients' energy under the same sources does not count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

from mxserve import _wire
from mxserve.client import Client, MxserveError
from mxserve.security import add_connection_arguments, connection_kwargs
from mxserve.rlhf.power import PowerSourceError, open_power_source, trapezoid_joules
from mxserve.types import EnergyInterval, PowerSample

SOURCE = "gpu_baseline"
# Where the power samples go when the counter gives SOURCE its joules.
SAMPLED_SOURCE = SOURCE + "_sampled"
# The longest interval the daemon books (ReportEnergy).
MAX_INTERVAL_SECONDS = 3600.0


@dataclass(frozen=True)
class LayerShape:
    """One linear layer's GEMM in a phase: Y[M, N] = X[M, K]·Wᵀ. In the update phase
    it is run forward and backward (grad_input and grad_weight): three GEMMs."""
    phase: str
    m: int
    n: int
    k: int
    repeat: int = 1


# Qwen2.5-0.5B: 24 blocks × (q, k, v, o, gate, up, down), as (N, K).
QWEN25_05B = [(896, 896), (128, 896), (128, 896), (896, 896), (4864, 896), (4864, 896),
              (896, 4864)]
QWEN25_05B_BLOCKS = 24


def qwen_workload(rollout_m: int = 8, reward_m: int = 512, update_m: int = 512) -> List[LayerShape]:
    shapes = []
    for phase, m in (("rollout", rollout_m), ("reward", reward_m), ("update", update_m)):
        if m > 0:
            shapes += [LayerShape(phase, m, n, k, QWEN25_05B_BLOCKS) for n, k in QWEN25_05B]
    return shapes


def load_workload(path: str) -> List[LayerShape]:
    """JSON: [{"phase": "rollout", "m": 8, "n": 896, "k": 896, "repeat": 24}, ...]."""
    try:
        entries = json.loads(open(path).read())
        shapes = [LayerShape(_wire.phase_name(_wire.phase_to_wire(e["phase"])), int(e["m"]),
                             int(e["n"]), int(e["k"]), int(e.get("repeat", 1))) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--workload {path}: expected a JSON list of "
                         f"{{phase, m, n, k[, repeat]}}: {error}") from None
    for s in shapes:
        if min(s.m, s.n, s.k, s.repeat) < 1:
            raise ValueError(f"--workload {path}: m, n, k and repeat must be >= 1, got {s}")
    return shapes


class _Sampler:
    """Reads a power source on its own thread and streams each sample to the daemon
    (Telemetry.ReportPower) as it comes, tagged with the runner's current phase."""

    def __init__(self, client: Client, power, device: str, source: str,
                 current_phase: Callable[[], str], run: str = ""):
        self.client, self.power, self.device, self.source = client, power, device, source
        self.run = run
        self._current_phase = current_phase
        self.sent: List[tuple] = []  # (timestamp, watts, phase), as sent
        self.result = None
        self.error: Optional[BaseException] = None
        self._outbox: "queue.Queue" = queue.Queue()
        self._stopping = threading.Event()
        self._reader = threading.Thread(target=self._sample, name="power-sampler", daemon=True)
        self._streamer = threading.Thread(target=self._stream, name="power-stream", daemon=True)

    def start(self) -> None:
        self.power.start()
        self._streamer.start()
        self._reader.start()

    def _sample(self) -> None:
        try:
            while not self._stopping.is_set():
                sample = self.power.read()
                if sample is None:
                    break
                timestamp, watts, phase = sample
                sample = (timestamp, watts, phase or self._current_phase())
                self.sent.append(sample)
                self._outbox.put(PowerSample(self.source, self.device, sample[2], timestamp, watts,
                                             run=self.run))
        except BaseException as error:  # surfaced by stop()
            self.error = error
        finally:
            self._outbox.put(None)

    def _stream(self) -> None:
        def samples():
            while (sample := self._outbox.get()) is not None:
                yield sample
        try:
            self.result = self.client.report_power(samples(), timeout=None)
        except BaseException as error:
            self.error = error
            self.power.stop()
            self._stopping.set()

    def stop(self) -> None:
        """Stops sampling and ends the stream once every sample taken was sent.
        Energy counts up to the last sample, at most one interval before now."""
        self._stopping.set()
        self.power.stop()
        self._reader.join()
        self._streamer.join()
        if self.error is not None:
            raise self.error


def _difference(sampled: float, counter: Optional[float]) -> dict:
    """Sampled minus counter joules, and that as a % of the counter's (None where
    there is no counter, or it read 0)."""
    if counter is None:
        return {"difference_joules": None, "difference_pct": None}
    return {"difference_joules": sampled - counter,
            "difference_pct": 100.0 * (sampled - counter) / counter if counter else None}


class EnergyMeter:
    """A device's energy per phase, by its energy counter where it has one.

        meter = EnergyMeter(client, power, "cuda:0", run="exp1/gpu",
                            synchronize=torch.cuda.synchronize)
        meter.start("rollout")     # idle power, then the first counter read
        ...                        # rollout work
        meter.boundary("reward")   # synchronise, read, book rollout's joules
        ...
        meter.stop()               # the last phase's joules; streams closed

    With a counter (`power.energy_joules()` not None: NVML on Volta and newer), each
    phase's joules are the counter's difference between its boundaries, each read
    right after `synchronize()` so that the phase's queued GPU work is inside it,
    and go to the daemon through Telemetry.ReportEnergy under `source`
    ("gpu_baseline", the authoritative energy); the power samples stream meanwhile
    (ReportPower) under `sampled_source` ("gpu_baseline_sampled": the timeline, and
    what integrating samples would have said). Without a counter the samples go
    under `source`, as the only measurement, and no intervals are sent: the daemon
    never holds two measurements of one device under one source.

    `idle_seconds` before the run the device is left alone and its idle power
    measured (counter difference / time, else the mean of power readings; None for
    a source with neither, or 0 s). A phase longer than `flush_seconds` is booked
    in pieces (the daemon takes intervals of at most an hour); pieces need no
    synchronise, the phase being the same on both sides. `intervals` lists every
    (phase, start, end, joules) sent; `counter_joules` sums them per phase.
    """

    def __init__(self, client: Client, power, device: str, run: str = "", *,
                 synchronize: Optional[Callable[[], None]] = None, idle_seconds: float = 0.5,
                 source: str = SOURCE, sampled_source: Optional[str] = None,
                 flush_seconds: float = 60.0, phase: str = "rollout"):
        if not (idle_seconds >= 0 and math.isfinite(idle_seconds)):
            raise ValueError(f"idle_seconds: expected a finite number >= 0, got {idle_seconds}")
        if not (0 < flush_seconds <= MAX_INTERVAL_SECONDS):
            raise ValueError(f"flush_seconds: expected 0 < s <= {MAX_INTERVAL_SECONDS}, "
                             f"got {flush_seconds}")
        self.client, self.power, self.device, self.run = client, power, device, run
        self.source = source
        self._synchronize = synchronize or (lambda: None)
        self.idle_seconds, self.flush_seconds = idle_seconds, flush_seconds
        self._phase = _wire.phase_name(_wire.phase_to_wire(phase))
        read = getattr(power, "energy_joules", None)
        self._read_counter = read if callable(read) else (lambda: None)
        self.has_counter = self._read_counter() is not None
        self.sampled_source = (sampled_source or f"{source}_sampled") if self.has_counter \
            else source
        self.idle_watts: Optional[float] = None
        self.intervals: List[tuple] = []  # (phase, start, end, joules), as sent
        self.counter_joules: Dict[str, float] = {}
        self.result = None  # the ReportEnergy answer, after stop()
        self.sampler: Optional[_Sampler] = None
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._mark: Optional[tuple] = None  # (unix time, counter joules) of the last read
        # The widest clock bracket around a counter read: a read is dated at its
        # bracket's middle, so an interval's joules are exact to within this many
        # seconds of its power (a preempted read on a loaded machine widens it).
        self.max_read_seconds = 0.0
        self._outbox: "queue.Queue" = queue.Queue()
        self._done = threading.Event()
        self._threads: List[threading.Thread] = []

    @property
    def phase(self) -> str:
        return self._phase

    def _read(self) -> tuple:
        # The counter's time is the middle of the clock reads around it: a read takes
        # microseconds, and at 700 W each 10 µs of skew is 7 mJ.
        before = time.time()
        joules = self._read_counter()
        after = time.time()
        self.max_read_seconds = max(self.max_read_seconds, after - before)
        return (before + after) / 2, joules

    def measure_idle(self) -> Optional[float]:
        """The device's power while nothing runs, over `idle_seconds`."""
        if self.idle_seconds <= 0:
            return None
        self._synchronize()
        if self.has_counter:
            t0, e0 = self._read()
            time.sleep(self.idle_seconds)
            t1, e1 = self._read()
            if e0 is None or e1 is None or t1 <= t0 or e1 < e0:
                return None
            return (e1 - e0) / (t1 - t0)
        watts = getattr(self.power, "watts", None)
        if not callable(watts):
            return None  # a replayed trace: no idle reading to take
        readings, end = [], time.monotonic() + self.idle_seconds
        while True:
            readings.append(watts())
            if time.monotonic() >= end:
                break
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return sum(readings) / len(readings)

    def start(self, phase: Optional[str] = None) -> None:
        """Measures idle power, then starts the samples and (with a counter) the
        first interval, in `phase` (default: the one given at construction)."""
        if phase is not None:
            self._phase = _wire.phase_name(_wire.phase_to_wire(phase))
        self.idle_watts = self.measure_idle()
        self.sampler = _Sampler(self.client, self.power, self.device, self.sampled_source,
                                lambda: self._phase, self.run)
        self.sampler.start()
        if self.has_counter:
            streamer = threading.Thread(target=self._stream, name="energy-stream", daemon=True)
            flusher = threading.Thread(target=self._flush, name="energy-flush", daemon=True)
            self._threads = [streamer, flusher]
            for thread in self._threads:
                thread.start()
            # Last, so that starting the streams (tens of ms) is not the phase's.
            self._synchronize()
            with self._lock:
                self._mark = self._read()

    def _book(self, mark: tuple) -> None:
        """Books the running phase from the last read to `mark` (with the lock held)."""
        (t0, e0), (t1, e1) = self._mark, mark
        self._mark = mark
        if e0 is None or e1 is None:
            return
        if e1 < e0 or t1 < t0:
            # The counter went back (a driver reload) or the clock did: that stretch
            # is unknown, and the daemon would refuse it and end the stream.
            print(f"gpu_baseline: energy counter or clock went back ({e0:.3f} -> {e1:.3f} J, "
                  f"{t0:.3f} -> {t1:.3f} s); {self._phase} loses that interval",
                  file=sys.stderr)
            return
        interval = (self._phase, t0, t1, e1 - e0)
        self.intervals.append(interval)
        self.counter_joules[self._phase] = self.counter_joules.get(self._phase, 0.0) + e1 - e0
        self._outbox.put(EnergyInterval(self.source, self.device, self._phase, t0, t1, e1 - e0,
                                        run=self.run))

    def boundary(self, phase: str) -> None:
        """The device moves on to `phase`: the previous phase's work is finished
        (synchronize), the counter read, and the previous phase's interval reported.
        The same phase again changes nothing."""
        phase = _wire.phase_name(_wire.phase_to_wire(phase))
        if phase == self._phase:
            return
        if not self.has_counter or self._mark is None:
            self._phase = phase  # the samples carry it from now on
            return
        self._synchronize()
        with self._lock:
            self._book(self._read())
            self._phase = phase

    def _flush(self) -> None:
        while not self._done.wait(self.flush_seconds / 4):
            with self._lock:
                if self._mark is not None and time.time() - self._mark[0] >= self.flush_seconds:
                    self._book(self._read())

    def _stream(self) -> None:
        def intervals():
            while (interval := self._outbox.get()) is not None:
                yield interval
        try:
            self.result = self.client.report_energy(intervals(), timeout=None)
        except BaseException as error:  # surfaced by stop()
            self.error = error

    def stop(self) -> None:
        """Books the last phase (after a synchronize), ends both streams once all
        was sent, and raises what either stream met."""
        try:
            if self.has_counter and self._mark is not None:
                self._synchronize()
                with self._lock:
                    self._book(self._read())
                    self._mark = None
        finally:
            self._done.set()
            self._outbox.put(None)
            for thread in self._threads:
                thread.join()
            if self.sampler is not None:
                self.sampler.stop()
        if self.error is not None:
            raise self.error

    def close_quietly(self) -> None:
        """stop() for an error path: the caller's exception is the one to see."""
        with contextlib.suppress(Exception):
            self.stop()


class GpuBaseline:
    """Runs a workload on a torch device and streams the device's power to mxserved.

        runner = GpuBaseline(client, power=open_power_source("nvml"), run="exp1/gpu")
        summary = runner.run(qwen_workload(), steps=5)

    `run`: the run tag of every power sample (default: the `client.run(...)` scope
    the runner was made in, else untagged); when set, the summary's joules come
    from that run's energy report.
    """

    def __init__(self, client: Client, power, device: str = "cuda:0", dtype=None,
                 source: str = SOURCE, min_phase_seconds: float = 0.0, seed: int = 0,
                 run: Optional[str] = None, idle_seconds: float = 0.5):
        import torch  # optional for the rest of the package
        self.torch = torch
        self.client, self.power, self.source = client, power, source
        # The sampler streams from its own threads, where no scope is current:
        # the tag is fixed here.
        self.run_tag = _wire.run_to_wire(run if run is not None else client.current_run)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available to torch; run with --device cpu and "
                               "--power-source replay:FILE to exercise the bookkeeping")
        # FP16 on the GPU (the baseline); FP32 on a CPU, where torch has no FP16 GEMM.
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        self.min_phase_seconds = min_phase_seconds
        self.idle_seconds = idle_seconds
        self._phase = "rollout"
        self._meter: Optional[EnergyMeter] = None
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self._tensors: Dict[tuple, tuple] = {}

    @property
    def phase(self) -> str:
        return self._phase

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _operands(self, shape: LayerShape, index: int):
        # Each repeat has its own weights, so they stream from memory as a model's do.
        key = (shape.m, shape.n, shape.k, index)
        if key not in self._tensors:
            def random(*size):
                return self.torch.randn(*size, generator=self._generator).to(self.device,
                                                                             self.dtype)
            self._tensors[key] = (random(shape.m, shape.k), random(shape.n, shape.k),
                                  random(shape.m, shape.n))
        return self._tensors[key]

    def _run_shape(self, shape: LayerShape) -> float:
        """Runs one entry; returns its FLOPs."""
        flops = 0.0
        for index in range(shape.repeat):
            x, w, dy = self._operands(shape, index)
            x @ w.t()
            flops += 2.0 * shape.m * shape.n * shape.k
            if shape.phase == "update":
                dy @ w       # grad_input
                dy.t() @ x   # grad_weight
                flops += 4.0 * shape.m * shape.n * shape.k
        return flops

    def _run_steps(self, workload, steps, phases, stats) -> None:
        for _ in range(steps):
            for phase in phases:
                # The meter closes the previous phase first (synchronise, counter).
                self._meter.boundary(phase)
                self._phase = phase
                begin = time.monotonic()
                while True:
                    if callable(workload):
                        stats[phase]["flops"] += float(workload(phase) or 0.0)
                    else:
                        for shape in workload:
                            if shape.phase == phase:
                                stats[phase]["flops"] += self._run_shape(shape)
                    self._synchronize()
                    stats[phase]["runs"] += 1
                    if time.monotonic() - begin >= self.min_phase_seconds:
                        break
                stats[phase]["seconds"] += time.monotonic() - begin

    def run(self, workload: Union[Sequence[LayerShape], Callable[[str], Optional[float]]],
            steps: int = 1, phases: Sequence[str] = _wire.PHASES) -> dict:
        """Runs `steps` × phases. A callable workload is called as fn(phase) and may
        return the FLOPs it did. Returns the summary (see `summary_table`)."""
        phases = [_wire.phase_name(_wire.phase_to_wire(p)) for p in phases]
        stats = {p: {"seconds": 0.0, "flops": 0.0, "runs": 0} for p in phases}
        if not callable(workload):
            for shape in workload:  # allocate up front, outside the measured time
                for index in range(shape.repeat):
                    self._operands(shape, index)
        before = self.client.energy_report(run=self.run_tag)
        self._phase = phases[0]
        self._meter = meter = EnergyMeter(self.client, self.power, str(self.device), self.run_tag,
                                          synchronize=self._synchronize,
                                          idle_seconds=self.idle_seconds, source=self.source,
                                          phase=phases[0])
        meter.start()
        started = time.monotonic()
        try:
            self._run_steps(workload, steps, phases, stats)
        except BaseException:
            meter.close_quietly()  # the workload's error is the one to see
            raise
        wall = time.monotonic() - started
        meter.stop()
        after = self.client.energy_report(run=self.run_tag)

        sampler = meter.sampler
        local = trapezoid_joules(sampler.sent)
        summary = {
            "source": self.source,
            "sampled_source": meter.sampled_source,
            "energy_counter": meter.has_counter,
            "run": self.run_tag,
            "device": str(self.device),
            "device_name": getattr(self.power, "device_name", ""),
            "dtype": str(self.dtype).replace("torch.", ""),
            "power_source": getattr(self.power, "description", type(self.power).__name__),
            "power_reading": getattr(self.power, "power_reading", "replay"),
            # A replayed trace exercises the bookkeeping; it measures nothing.
            "energy_label": "replayed" if str(getattr(self.power, "description", "")
                                              ).startswith("replay:") else "measured",
            "idle_watts": meter.idle_watts,
            "idle_seconds": meter.idle_seconds,
            "steps": steps,
            "wall_seconds": wall,
            "samples": len(sampler.sent),
            "samples_accepted": sampler.result.samples_accepted if sampler.result else 0,
            "intervals": len(meter.intervals),
            "intervals_accepted": meter.result.intervals_accepted if meter.result else 0,
            # How well each interval is dated: its joules are the counter's to within
            # this many seconds of the device's power.
            "counter_read_max_seconds": meter.max_read_seconds if meter.has_counter else None,
            "phases": {},
        }

        def booked(source, phase):  # what the daemon accounted during this run
            return after.joules(source, phase) - before.joules(source, phase)

        for phase in phases:
            seconds = stats[phase]["seconds"]
            counter = booked(self.source, phase) if meter.has_counter else None
            sampled = booked(meter.sampled_source, phase)
            entry = summary["phases"][phase] = {
                "seconds": seconds,
                "runs": stats[phase]["runs"],
                "flops": stats[phase]["flops"],
                "tflops_per_second": stats[phase]["flops"] / seconds / 1e12 if seconds else 0.0,
                # The phase's energy as the daemon accounted it under `source`: the
                # counter's where there is one, else the samples'.
                "joules": booked(self.source, phase),
                "counter_joules": counter,
                "sampled_joules": sampled,
                "joules_local": local.get(phase, 0.0),  # the same samples, integrated here
                "samples": sum(1 for s in sampler.sent if s[2] == phase),
            }
            entry.update(_difference(sampled, counter))
        summary["total_joules"] = sum(p["joules"] for p in summary["phases"].values())
        summary["total_counter_joules"] = (
            sum(p["counter_joules"] for p in summary["phases"].values()) if meter.has_counter
            else None)
        summary["total_sampled_joules"] = sum(p["sampled_joules"]
                                              for p in summary["phases"].values())
        summary.update({f"total_{k}": v for k, v in
                        _difference(summary["total_sampled_joules"],
                                    summary["total_counter_joules"]).items()})

        summary["samples_log"] = sampler.sent
        summary["intervals_log"] = list(meter.intervals)
        return summary


def nvml_index(device: str) -> int:
    """NVML's index of a torch CUDA device: CUDA_VISIBLE_DEVICES renumbers devices
    for CUDA but not for NVML. (With CUDA_DEVICE_ORDER left at FASTEST_FIRST the
    orders can still differ on mixed machines: pass --power-source nvml:INDEX.)"""
    ordinal = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if ordinal < len(visible) and visible[ordinal].isdigit():
        return int(visible[ordinal])
    return ordinal


def summary_table(summary: dict) -> str:
    """The summary as the CLI prints it: per phase and in total, the counter's
    joules, the samples' joules and their difference, with the idle power."""
    def number(value, width, digits):
        return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

    idle = summary.get("idle_watts")
    how = (f"energy by NVML's counter, samples as {summary['sampled_source']}"
           if summary.get("energy_counter") else "energy by integrated samples (no counter)")
    if summary.get("energy_label") == "replayed":
        how = "REPLAYED power trace, not a measurement: " + how
    lines = [f"{summary['device']} ({summary['device_name']}), {summary['dtype']}, power from "
             f"{summary['power_source']} ({summary.get('power_reading', '?')}): "
             f"{summary['samples']} samples over {summary['wall_seconds']:.2f} s"
             + (f", run {summary['run']}" if summary.get("run") else ""),
             f"{how}; idle " + (f"{idle:.1f} W" if idle is not None else "not measured"),
             f"{'phase':<8} {'seconds':>9} {'TFLOP/s':>9} {'counter J':>10} {'sampled J':>10} "
             f"{'diff J':>9} {'diff %':>7} {'mean W':>8}"]
    rows = list(summary["phases"].items())
    rows.append(("total", {"seconds": sum(p["seconds"] for _, p in rows), "flops": None,
                           "joules": summary["total_joules"],
                           "counter_joules": summary.get("total_counter_joules"),
                           "sampled_joules": summary.get("total_sampled_joules", 0.0),
                           "difference_joules": summary.get("total_difference_joules"),
                           "difference_pct": summary.get("total_difference_pct")}))
    for phase, p in rows:
        watts = p["joules"] / p["seconds"] if p["seconds"] else 0.0
        tflops = p.get("tflops_per_second") if p.get("flops") is not None else None
        lines.append(f"{phase:<8} {p['seconds']:>9.3f} {number(tflops, 9, 2)} "
                     f"{number(p.get('counter_joules'), 10, 2)} "
                     f"{number(p.get('sampled_joules'), 10, 2)} "
                     f"{number(p.get('difference_joules'), 9, 2)} "
                     f"{number(p.get('difference_pct'), 7, 1)} {watts:>8.1f}")
    return "\n".join(lines)


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m mxserve.gpu_baseline",
        description="Run RLHF-shaped GEMMs on a GPU in FP16 and report its energy to mxserved, "
                    "then write a per-phase time and energy summary. With an NVML energy "
                    "counter (Volta and newer) each phase's joules are the counter's "
                    "difference across the phase, read after a device synchronise, booked as "
                    "source gpu_baseline; the 10 Hz power samples go to gpu_baseline_sampled, "
                    "and the summary shows both and their difference. Without a counter the "
                    "samples are integrated under gpu_baseline. Idle power is measured "
                    "before the run.")
    parser.add_argument("--server", default="127.0.0.1:50051", help="mxserved address")
    add_connection_arguments(parser)
    parser.add_argument("--steps", type=int, default=3, help="rollout/reward/update rounds")
    parser.add_argument("--out", help="write the summary here (JSON); '-' for stdout")
    parser.add_argument("--device", default="cuda:0", help="torch device (default cuda:0)")
    parser.add_argument("--power-source", default="nvml",
                        help="nvml (the device's NVML index: its energy counter, and the "
                             "instant power field else the averaged reading; library "
                             "$MXSERVE_NVML_LIBRARY or libnvidia-ml.so.1), nvml:INDEX, or "
                             "replay:FILE (CSV timestamp,watts[,phase], played back in real "
                             "time; no counter)")
    parser.add_argument("--interval", type=float, default=0.1, help="NVML sampling period, s")
    parser.add_argument("--workload", default="qwen2.5-0.5b",
                        help="qwen2.5-0.5b (its 168 linear layers) or a JSON file of "
                             "{phase, m, n, k[, repeat]}")
    parser.add_argument("--rollout-m", type=int, default=8, help="qwen workload: decode rows")
    parser.add_argument("--reward-m", type=int, default=512, help="qwen workload: scored tokens")
    parser.add_argument("--update-m", type=int, default=512, help="qwen workload: trained tokens")
    parser.add_argument("--min-phase-seconds", type=float, default=0.0,
                        help="repeat each phase's work until it ran this long (NVML's energy "
                             "counter moves about every 100 ms, its averaged power reading "
                             "spans ~1 s: short phases need this)")
    parser.add_argument("--source", default=SOURCE,
                        help="energy source label (default gpu_baseline); with a counter the "
                             "samples go to SOURCE_sampled")
    parser.add_argument("--idle-seconds", type=float, default=0.5,
                        help="measure idle power this long before the run (0: skip; "
                             "default 0.5)")
    parser.add_argument("--samples-out", help="write every sample sent (CSV "
                                              "timestamp,watts,phase); replayable")
    parser.add_argument("--run", default="",
                        help="run tag of every power sample (1-64 of [A-Za-z0-9_.:/-]); the "
                             "summary then reads that run's energy only (default: untagged)")
    parser.add_argument("--timeout", type=float, default=30.0, help="RPC deadline, s")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps: expected >= 1, got {args.steps}")
    if not (0 <= args.idle_seconds <= 60):
        parser.error(f"--idle-seconds: expected 0 to 60, got {args.idle_seconds}")

    try:
        _wire.run_to_wire(args.run, "--run")
        workload = (qwen_workload(args.rollout_m, args.reward_m, args.update_m)
                    if args.workload == "qwen2.5-0.5b" else load_workload(args.workload))
        device_index = nvml_index(args.device)
        power = open_power_source(args.power_source, device_index, args.interval)
    except (ValueError, PowerSourceError) as error:
        print(f"gpu_baseline: {error}", file=sys.stderr)
        return 2
    try:
        with Client(args.server, timeout=args.timeout, **connection_kwargs(args)) as client, contextlib.closing(power):
            client.wait_ready(timeout=args.timeout)
            runner = GpuBaseline(client, power, device=args.device, source=args.source,
                                 min_phase_seconds=args.min_phase_seconds, run=args.run,
                                 idle_seconds=args.idle_seconds)
            summary = runner.run(workload, steps=args.steps)
    except (MxserveError, RuntimeError, PowerSourceError) as error:
        print(f"gpu_baseline: {error}", file=sys.stderr)
        return 1

    samples = summary.pop("samples_log")
    summary["intervals_log"] = [{"phase": p, "start": t0, "end": t1, "joules": j}
                                for p, t0, t1, j in summary["intervals_log"]]
    if args.samples_out:
        with open(args.samples_out, "w") as f:
            f.write("timestamp,watts,phase\n")
            f.writelines(f"{t!r},{w!r},{p}\n" for t, w, p in samples)
    print(summary_table(summary), file=sys.stderr)
    if args.out:
        text = json.dumps(summary, indent=2) + "\n"
        if args.out == "-":
            sys.stdout.write(text)
        else:
            with open(args.out, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
