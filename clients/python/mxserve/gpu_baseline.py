"""GPU baseline: the same RLHF work on a GPU in FP16, with its measured power streamed
to mxserved (source `gpu_baseline`), so the daemon's energy report compares the two.

    python3 -m mxserve.gpu_baseline --server 127.0.0.1:50051 --steps 5 --out gpu.json

The workload is a list of layer GEMMs per phase (default: the 168 linear layers of
Qwen2.5-0.5B; rollout a decode step of M=8 rows, reward a forward of M=512, update
forward and backward at M=512) or a callable. Power comes from NVML about ten times
a second, or from `--power-source replay:FILE` (CSV timestamp,watts[,phase]) where
there is no GPU. Each sample carries the phase running when it was taken; the
daemon integrates consecutive samples (trapezoids) into the later sample's phase.
With `--run TAG` every sample also carries the run tag, the daemon books the energy
under that run, and the summary reads the run's own energy report: other clients'
samples under the same source do not count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from mxserve.power import PowerSourceError, open_power_source, trapezoid_joules
from mxserve.types import PowerSample

SOURCE = "gpu_baseline"


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
                 run: Optional[str] = None):
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
        self._phase = "rollout"
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
        self._synchronize()
        sampler = _Sampler(self.client, self.power, str(self.device), self.source,
                           lambda: self._phase, self.run_tag)
        sampler.start()
        started = time.monotonic()
        try:
            self._run_steps(workload, steps, phases, stats)
        except BaseException:
            with contextlib.suppress(Exception):  # the workload's error is the one to see
                sampler.stop()
            raise
        wall = time.monotonic() - started
        sampler.stop()
        after = self.client.energy_report(run=self.run_tag)

        local = trapezoid_joules(sampler.sent)
        summary = {
            "source": self.source,
            "run": self.run_tag,
            "device": str(self.device),
            "device_name": getattr(self.power, "device_name", ""),
            "dtype": str(self.dtype).replace("torch.", ""),
            "power_source": getattr(self.power, "description", type(self.power).__name__),
            "steps": steps,
            "wall_seconds": wall,
            "samples": len(sampler.sent),
            "samples_accepted": sampler.result.samples_accepted if sampler.result else 0,
            "phases": {},
        }
        for phase in phases:
            joules = (after.joules(self.source, phase) - before.joules(self.source, phase))
            seconds = stats[phase]["seconds"]
            summary["phases"][phase] = {
                "seconds": seconds,
                "runs": stats[phase]["runs"],
                "flops": stats[phase]["flops"],
                "tflops_per_second": stats[phase]["flops"] / seconds / 1e12 if seconds else 0.0,
                "joules": joules,                       # as the daemon accounted it
                "joules_local": local.get(phase, 0.0),  # the same samples, integrated here
                "samples": sum(1 for s in sampler.sent if s[2] == phase),
            }
        summary["total_joules"] = sum(p["joules"] for p in summary["phases"].values())
        summary["samples_log"] = sampler.sent
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
    lines = [f"{summary['device']} ({summary['device_name']}), {summary['dtype']}, power from "
             f"{summary['power_source']}: {summary['samples']} samples over "
             f"{summary['wall_seconds']:.2f} s"
             + (f", run {summary['run']}" if summary.get("run") else ""),
             f"{'phase':<8} {'seconds':>9} {'TFLOP/s':>9} {'joules':>10} {'mean W':>8}"]
    for phase, p in summary["phases"].items():
        watts = p["joules"] / p["seconds"] if p["seconds"] else 0.0
        lines.append(f"{phase:<8} {p['seconds']:>9.3f} {p['tflops_per_second']:>9.2f} "
                     f"{p['joules']:>10.2f} {watts:>8.1f}")
    return "\n".join(lines)


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m mxserve.gpu_baseline",
        description="Run RLHF-shaped GEMMs on a GPU in FP16 and stream its power to mxserved "
                    "(source gpu_baseline), then write a per-phase time and energy summary.")
    parser.add_argument("--server", default="127.0.0.1:50051", help="mxserved address")
    add_connection_arguments(parser)
    parser.add_argument("--steps", type=int, default=3, help="rollout/reward/update rounds")
    parser.add_argument("--out", help="write the summary here (JSON); '-' for stdout")
    parser.add_argument("--device", default="cuda:0", help="torch device (default cuda:0)")
    parser.add_argument("--power-source", default="nvml",
                        help="nvml (the device's NVML index), nvml:INDEX, or replay:FILE "
                             "(CSV timestamp,watts[,phase], played back in real time)")
    parser.add_argument("--interval", type=float, default=0.1, help="NVML sampling period, s")
    parser.add_argument("--workload", default="qwen2.5-0.5b",
                        help="qwen2.5-0.5b (its 168 linear layers) or a JSON file of "
                             "{phase, m, n, k[, repeat]}")
    parser.add_argument("--rollout-m", type=int, default=8, help="qwen workload: decode rows")
    parser.add_argument("--reward-m", type=int, default=512, help="qwen workload: scored tokens")
    parser.add_argument("--update-m", type=int, default=512, help="qwen workload: trained tokens")
    parser.add_argument("--min-phase-seconds", type=float, default=0.0,
                        help="repeat each phase's work until it ran this long (NVML averages "
                             "power over ~1 s, so short phases need this)")
    parser.add_argument("--source", default=SOURCE, help="energy source label (default "
                                                          "gpu_baseline)")
    parser.add_argument("--samples-out", help="write every sample sent (CSV "
                                              "timestamp,watts,phase); replayable")
    parser.add_argument("--run", default="",
                        help="run tag of every power sample (1-64 of [A-Za-z0-9_.:/-]); the "
                             "summary then reads that run's energy only (default: untagged)")
    parser.add_argument("--timeout", type=float, default=30.0, help="RPC deadline, s")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps: expected >= 1, got {args.steps}")

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
                                 min_phase_seconds=args.min_phase_seconds, run=args.run)
            energy_before = power.energy_joules()
            summary = runner.run(workload, steps=args.steps)
            energy_after = power.energy_joules()
            if energy_before is not None and energy_after is not None:
                summary["nvml_energy_joules"] = energy_after - energy_before
    except (MxserveError, RuntimeError, PowerSourceError) as error:
        print(f"gpu_baseline: {error}", file=sys.stderr)
        return 1

    samples = summary.pop("samples_log")
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
