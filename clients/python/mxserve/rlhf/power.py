"""Power sources for the GPU baseline: NVML on a real GPU, or a replayed trace.

A source's `start()` begins a run, `read()` returns the next (unix_seconds, watts,
phase_or_None) sample, blocking until it is due, or None once it has no more, and
`stop()` (from another thread) ends the run; a source can run again after that.
`energy_joules()` reads a cumulative energy counter, None where the source has none.
`NvmlPower` samples NVML's instant power field (else `nvmlDeviceGetPowerUsage`, a
one-second average on recent GPUs) every `interval` seconds and exposes the board's
energy counter, through libnvidia-ml.so.1 or $MXSERVE_NVML_LIBRARY (ctypes; no
Python NVML package needed). `ReplayPower` plays a CSV trace back in
real time, so streaming and energy bookkeeping can be tested without a GPU.
"""

from __future__ import annotations

import csv
import ctypes
import math
import os
import pathlib
import threading
import time
from typing import List, Optional, Tuple

from mxserve import _wire

Sample = Tuple[float, float, Optional[str]]


class PowerSourceError(RuntimeError):
    pass


class _NvmlValue(ctypes.Union):
    # nvmlValue_t: which member holds the value is the field's valueType.
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong),
                ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]


class _NvmlFieldValue(ctypes.Structure):
    # nvmlFieldValue_t (nvml.h): 40 bytes, the union 8-byte aligned.
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                ("timestamp", ctypes.c_longlong), ("latencyUsec", ctypes.c_longlong),
                ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int), ("value", _NvmlValue)]


# nvmlValueType_t → the union member that holds it.
_NVML_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                       6: "usVal"}

NVML_LIBRARY_ENV = "MXSERVE_NVML_LIBRARY"


class NvmlPower:
    """Board power of one NVIDIA GPU, read through NVML about every `interval` s.

    Power: the instant field (`nvmlDeviceGetFieldValues`, NVML_FI_DEV_POWER_INSTANT,
    follows load within ~0.1 s) where the driver has it, else
    `nvmlDeviceGetPowerUsage`, which on Ampere (but GA100) and newer is a one-second
    moving average; `power_reading` says which ("instant" or "average"). Energy:
    `energy_joules()` reads the cumulative counter (`nvmlDeviceGetTotalEnergyConsumption`,
    Volta and newer), None where NVML has none; `has_energy_counter` says which.
    `library`: the NVML shared object; default $MXSERVE_NVML_LIBRARY, else
    libnvidia-ml.so.1 (tests point it at a stand-in)."""

    NVML_SUCCESS = 0
    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self, index: int = 0, interval: float = 0.1, library: Optional[str] = None):
        library = library or os.environ.get(NVML_LIBRARY_ENV) or "libnvidia-ml.so.1"
        try:
            self._nvml = ctypes.CDLL(library)
        except OSError as error:
            raise PowerSourceError(
                f"NVML is not available ({library}: {error}); on a machine without an "
                "NVIDIA driver use --power-source replay:FILE") from None
        self._nvml.nvmlErrorString.restype = ctypes.c_char_p
        self._check(self._nvml.nvmlInit_v2(), "nvmlInit_v2")
        self._handle = ctypes.c_void_p()
        self._check(self._nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index),
                                                             ctypes.byref(self._handle)),
                    f"nvmlDeviceGetHandleByIndex_v2({index})")
        name = ctypes.create_string_buffer(96)
        self._check(self._nvml.nvmlDeviceGetName(self._handle, name, ctypes.c_uint(len(name))),
                    "nvmlDeviceGetName")
        self.device_name = name.value.decode(errors="replace")
        self.description = f"nvml:{index}"
        self.interval = interval
        self._next = time.monotonic()
        self._stop = threading.Event()
        # Decided once: a driver that answers the field (or the counter) answers it
        # every time; one without the symbol or the support never does.
        self.power_reading = "instant" if self._instant_watts() is not None else "average"
        self.has_energy_counter = self.energy_joules() is not None

    def start(self) -> None:
        self._stop.clear()
        self._next = time.monotonic()

    def _check(self, code: int, what: str) -> None:
        if code != self.NVML_SUCCESS:
            message = self._nvml.nvmlErrorString(code).decode(errors="replace")
            raise PowerSourceError(f"{what} failed: {message} (NVML error {code})")

    def _instant_watts(self) -> Optional[float]:
        """The instant-power field in watts, or None where the driver lacks it."""
        try:
            get = self._nvml.nvmlDeviceGetFieldValues
        except AttributeError:  # a driver older than field values
            return None
        field = _NvmlFieldValue(fieldId=self.NVML_FI_DEV_POWER_INSTANT)
        if get(self._handle, ctypes.c_int(1), ctypes.byref(field)) != self.NVML_SUCCESS:
            return None
        member = _NVML_VALUE_MEMBERS.get(field.valueType)
        if field.nvmlReturn != self.NVML_SUCCESS or member is None:
            return None
        milliwatts = float(getattr(field.value, member))
        return milliwatts / 1000.0 if math.isfinite(milliwatts) and milliwatts >= 0 else None

    def watts(self) -> float:
        if self.power_reading == "instant":
            watts = self._instant_watts()
            if watts is not None:
                return watts
        milliwatts = ctypes.c_uint()
        self._check(self._nvml.nvmlDeviceGetPowerUsage(self._handle, ctypes.byref(milliwatts)),
                    "nvmlDeviceGetPowerUsage")
        return milliwatts.value / 1000.0

    def energy_joules(self) -> Optional[float]:
        """The board's cumulative energy counter in joules (Volta and newer; it
        counts since the driver loaded, so only differences mean anything), or None
        where NVML has none."""
        try:
            get = self._nvml.nvmlDeviceGetTotalEnergyConsumption
        except AttributeError:
            return None
        millijoules = ctypes.c_ulonglong()
        code = get(self._handle, ctypes.byref(millijoules))
        return millijoules.value / 1000.0 if code == self.NVML_SUCCESS else None

    def read(self) -> Optional[Sample]:
        delay = self._next - time.monotonic()
        if delay > 0 and self._stop.wait(delay):
            return None
        self._next = max(self._next + self.interval, time.monotonic())
        return (time.time(), self.watts(), None)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class ReplayPower:
    """A power trace played back in real time.

    The CSV has rows `timestamp,watts[,phase]` (seconds, any origin, non-decreasing;
    watts finite and >= 0; phase rollout|reward|update); a header row and lines
    starting with '#' are skipped. Sample i is released (t_i - t_0) seconds after
    the first read, stamped with the Unix time of the first read plus that offset.
    With a phase column, each sample carries its own phase instead of the runner's.
    """

    def __init__(self, path: str):
        self.path = pathlib.Path(path)
        self.description = f"replay:{path}"
        self.device_name = f"replay of {self.path.name}"
        self.rows = self.load(self.path)
        self._stop = threading.Event()
        self.start()

    def start(self) -> None:
        """Plays the trace from its beginning (again)."""
        self._stop.clear()
        self._index = 0
        self._start_wall = self._start_mono = None

    @staticmethod
    def load(path: pathlib.Path) -> List[Sample]:
        try:
            text = path.read_text()
        except OSError as error:
            raise PowerSourceError(f"replay: cannot read {path}: {error.strerror}") from None
        rows: List[Sample] = []
        header_allowed = True
        for number, fields in enumerate(csv.reader(text.splitlines()), start=1):
            if not fields or not fields[0].strip() or fields[0].lstrip().startswith("#"):
                continue
            try:
                timestamp, watts = float(fields[0]), float(fields[1])
            except (ValueError, IndexError):
                if header_allowed:
                    header_allowed = False
                    continue  # a header, before the first sample
                raise PowerSourceError(f"{path}:{number}: expected 'timestamp,watts[,phase]', "
                                       f"got {','.join(fields)!r}") from None
            phase = fields[2].strip() if len(fields) > 2 and fields[2].strip() else None
            if phase is not None:
                try:
                    phase = _wire.phase_name(_wire.phase_to_wire(phase))
                except ValueError as error:
                    raise PowerSourceError(f"{path}:{number}: {error}") from None
            if not (math.isfinite(timestamp) and math.isfinite(watts)) or watts < 0:
                raise PowerSourceError(f"{path}:{number}: expected a finite timestamp and "
                                       f"watts >= 0, got {timestamp}, {watts}")
            if rows and timestamp < rows[-1][0]:
                raise PowerSourceError(f"{path}:{number}: timestamp {timestamp} is earlier "
                                       f"than the previous row's {rows[-1][0]}")
            rows.append((timestamp, watts, phase))
            header_allowed = False
        if not rows:
            raise PowerSourceError(f"{path}: no samples")
        return rows

    @property
    def duration(self) -> float:
        return self.rows[-1][0] - self.rows[0][0]

    def read(self) -> Optional[Sample]:
        if self._index >= len(self.rows):
            return None
        if self._start_wall is None:
            self._start_wall, self._start_mono = time.time(), time.monotonic()
        timestamp, watts, phase = self.rows[self._index]
        offset = timestamp - self.rows[0][0]
        delay = self._start_mono + offset - time.monotonic()
        if delay > 0 and self._stop.wait(delay):
            return None
        self._index += 1
        return (self._start_wall + offset, watts, phase)

    def stop(self) -> None:
        self._stop.set()

    def energy_joules(self) -> Optional[float]:
        return None

    def close(self) -> None:
        pass


def check_power_source(spec: str) -> None:
    """Refuses a --power-source that open_power_source would refuse only when the
    run gets to it (after the preflight, with --out already written): the form, an
    NVML index that is not a non-negative integer, a replay file that is not there."""
    if spec.startswith("replay:"):
        path = spec[len("replay:"):]
        if not os.path.isfile(path):
            raise PowerSourceError(f"--power-source: the replay file {path!r} is not a file")
        return
    if spec == "nvml":
        return
    if spec.startswith("nvml:"):
        index = spec[len("nvml:"):]
        if not index.isdigit():
            raise PowerSourceError(f"--power-source: expected nvml:INDEX with INDEX a GPU's "
                                   f"number (0, 1, ...), got {spec!r}")
        return
    raise PowerSourceError(f"--power-source: expected 'nvml', 'nvml:INDEX' or 'replay:FILE', "
                           f"got {spec!r}")


def open_power_source(spec: str, device_index: int = 0, interval: float = 0.1):
    """'nvml' (optionally 'nvml:INDEX') or 'replay:FILE'."""
    if spec.startswith("replay:"):
        return ReplayPower(spec[len("replay:"):])
    if spec == "nvml" or spec.startswith("nvml:"):
        index = int(spec[len("nvml:"):]) if spec.startswith("nvml:") else device_index
        return NvmlPower(index, interval)
    raise PowerSourceError(f"--power-source: expected 'nvml', 'nvml:INDEX' or 'replay:FILE', "
                           f"got {spec!r}")


def trapezoid_joules(samples: List[Tuple[float, float, str]]) -> dict:
    """Per-phase joules by the daemon's rule: each consecutive pair's trapezoid goes
    to the later sample's phase."""
    joules: dict = {}
    for (t0, w0, _), (t1, w1, phase) in zip(samples, samples[1:]):
        joules[phase] = joules.get(phase, 0.0) + (t1 - t0) * (w0 + w1) / 2
    return joules
