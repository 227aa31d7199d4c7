#!/usr/bin/python3
"""A bounded soak test of a real mxserved over loopback.

N client threads send a random (seeded) mix of every kind of RPC for T seconds:
computes whose results are checked, weight uploads and publishes while forwards
run, model and policy churn, power telemetry, calls cut short by tiny deadlines
or cancelled mid-flight, and a few deliberately bad requests. Every call ends in
a gRPC status code; each request kind declares which codes it may end with, so
anything else (INTERNAL, UNAVAILABLE before shutdown, a result with wrong bits)
is an unexpected outcome. The daemon's RSS is sampled throughout. Exit status 0
only if nothing unexpected happened and the daemon exited 0 on SIGTERM.

Run `bench/soak.py --help` for the flags and how to read the report.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
# The package straight from the checkout; the build generates its stubs into
# clients/python/mxserve/v1 (gitignored), exactly as the Python tests use it.
sys.path.insert(0, str(REPO / "clients" / "python"))

try:
    import grpc
    import numpy as np

    import mxserve
    from mxserve.v1 import (common_pb2, compute_pb2, compute_pb2_grpc, models_pb2, models_pb2_grpc,
                            telemetry_pb2, telemetry_pb2_grpc)
except ImportError as error:  # say what to do instead of a bare traceback
    sys.exit(f"soak.py: cannot import what it needs ({error}).\n"
             "Run it with Debian's interpreter, /usr/bin/python3 (python3-grpcio, -protobuf, "
             "-numpy), after `make build` has generated clients/python/mxserve/v1.")

PHASES = ("rollout", "reward", "update")
# Canonical names, as ExecutionInfo reports them; LO_BCQ left out: the soak runs
# against any backend and hls-sim/fpga refuse it (UNIMPLEMENTED).
FORMATS = tuple(f for f in mxserve.FORMATS if f != "LO_BCQ")
# Formats of the MX family and friends, for the quantized Gemm/forward variety.
QUANTIZED = ("MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3", "MXFP4_E2M1", "MXINT8",
             "INT8", "BF16", "FP16")
BUILTIN_POLICIES = ("fp16-baseline", "A-conservative", "B-balanced", "C-aggressive",
                    "D-phase-adaptive")
# The daemon books its own energy under "fpga" and "fpga_model"; reported power
# uses a source of its own so the energy check below sees only the soak's joules.
POWER_SOURCE = "soak_gpu"

# The fixed model: one layer, weights published once and never changed, so FP32
# forwards and backwards on it have exactly one right answer.
FIXED_LAYER, FIXED_OUT, FIXED_IN = "fc", 48, 96
# The live model: one layer per client, each re-uploaded by its client only.
LIVE_OUT, LIVE_IN = 64, 128
M_CHOICES = (1, 2, 3, 8, 17, 32, 64)

# Codes an ordinary request may end with, and the extra ones interruptions allow.
OK = frozenset({"OK"})
UNEXPECTED_IN_DAEMON_METRICS = ("INTERNAL", "UNKNOWN", "DATA_LOSS")
STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}  # 4 → "DEADLINE_EXCEEDED"

_LISTENING = re.compile(r"event=listening grpc=(\S+) metrics=(\S+)")
_LOG_LEVEL_EVENT = re.compile(r"level=(\w+) event=(\S+)")


# --- small helpers -------------------------------------------------------------------------

def parse_duration(text: str) -> float:
    """'30', '30s', '2m', '1h', '1.5m' → seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30, 30s, 2m or 1h, got {text!r}")
    value, unit = float(match.group(1)), match.group(2) or "s"
    seconds = value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return seconds


def read_rss_mib(pid: Optional[int]) -> Optional[float]:
    """The process's resident set (VmRSS) in MiB, or None when it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def ints(rng: np.random.Generator, shape, low: int, high: int) -> np.ndarray:
    """Small integers as float32: every product and sum of them is exact in FP32,
    whatever order a kernel adds in, so results can be compared bit for bit."""
    return rng.integers(low, high + 1, size=shape).astype(np.float32)


def exact_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def tensor_pb(x: np.ndarray, dtype: str) -> common_pb2.Tensor:
    """A dense tensor on the wire in FP32, FP16 or BF16 (the client package only
    makes BF16 from torch tensors; the soak does without torch)."""
    x = np.ascontiguousarray(x, dtype="<f4")
    if dtype == "FP32":
        data, wire = x.tobytes(), common_pb2.DTYPE_FP32
    elif dtype == "FP16":
        data, wire = x.astype("<f2").tobytes(), common_pb2.DTYPE_FP16
    elif dtype == "BF16":  # the top half of each float32: exact for the small integers used
        data, wire = (x.view("<u4") >> 16).astype("<u2").tobytes(), common_pb2.DTYPE_BF16
    else:
        raise ValueError(dtype)
    return common_pb2.Tensor(shape=x.shape, dtype=wire, data=data)


def tensor_np(tensor: common_pb2.Tensor) -> np.ndarray:
    """An FP32 response tensor as a numpy array (its shape as sent)."""
    if tensor.dtype != common_pb2.DTYPE_FP32:
        raise ValueError(f"response tensor has dtype {tensor.dtype}, expected FP32")
    return np.frombuffer(tensor.data, dtype="<f4").reshape(tuple(tensor.shape))


def phase_pb(phase: Optional[str]) -> int:
    return common_pb2.PHASE_UNSPECIFIED if phase is None else common_pb2.Phase.Value(
        "PHASE_" + phase.upper())


def format_pb(fmt: Optional[str]) -> int:
    return common_pb2.FORMAT_UNSPECIFIED if fmt is None else common_pb2.Format.Value("FORMAT_" + fmt)


def trapezoid_joules(samples: Sequence[mxserve.PowerSample]) -> float:
    """What the daemon should integrate from one stream of one (source, device)."""
    return sum((b.timestamp - a.timestamp) * (a.watts + b.watts) / 2
               for a, b in zip(samples, samples[1:]))


# --- result checks: each returns None when right, else a sentence saying what is wrong ---

def check_exact(name: str, got: Any, want: np.ndarray) -> Optional[str]:
    if got is None:
        return f"{name}: missing, expected shape {want.shape}"
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, expected {want.shape}"
    if not np.array_equal(got, want):
        wrong = np.argwhere(got != want)
        first = tuple(int(i) for i in wrong[0])
        return (f"{name}: {len(wrong)} of {want.size} elements differ from numpy's exact result; "
                f"first at {first}: got {got[first]!r}, expected {want[first]!r}")
    return None


def check_shape_finite(name: str, got: Any, shape: tuple) -> Optional[str]:
    if got is None:
        return f"{name}: missing, expected shape {shape}"
    got = np.asarray(got)
    if got.shape != shape:
        return f"{name}: shape {got.shape}, expected {shape}"
    if not np.all(np.isfinite(got)):
        return f"{name}: {int(np.sum(~np.isfinite(got)))} non-finite values"
    return None


def check_formats(info: mxserve.ExecutionInfo, fmt: Optional[str],
                  weight_fmt: Optional[str] = None) -> Optional[str]:
    """An explicit format must be the one used; a policy's choice must be a real format."""
    for field, got, want in (("info.format", info.format, fmt),
                             ("info.weight_format", info.weight_format, weight_fmt or fmt)):
        if want is None and got not in FORMATS:
            return f"{field}: '{got}' is not a format (the policy should have chosen one)"
        if want is not None and got != want:
            return f"{field}: '{got}', expected the requested '{want}'"
    return None


def first_problem(*problems: Optional[str]) -> Optional[str]:
    return next((p for p in problems if p), None)


# --- outcomes ------------------------------------------------------------------------------

class Tally:
    """Every finished request: by RPC and code, by request kind and code, and
    whether the code was one its kind allows. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.by_rpc: collections.Counter = collections.Counter()   # (rpc, code, expected) → n
        self.by_kind: collections.Counter = collections.Counter()  # (rpc, kind, code, expected) → n
        self.examples: Dict[tuple, List[str]] = {}  # (rpc, kind, code) → a few messages
        self.total = 0
        self.unexpected = 0
        self.checked = 0  # OK results whose contents were checked

    def record(self, rpc: str, kind: str, code: str, expected: frozenset, message: str = "",
               checked: bool = False) -> bool:
        is_expected = code in expected
        with self._lock:
            self.total += 1
            self.checked += checked
            self.by_rpc[(rpc, code, is_expected)] += 1
            self.by_kind[(rpc, kind, code, is_expected)] += 1
            if not is_expected:
                self.unexpected += 1
                examples = self.examples.setdefault((rpc, kind, code), [])
                if len(examples) < 3:
                    examples.append(message[:400])
        return is_expected


def attempt(call: Callable[[], Any]):
    """Runs one call: (code name, result or None, the daemon's message)."""
    try:
        return "OK", call(), ""
    except mxserve.MxserveError as error:
        return error.code.name, None, error.message
    except grpc.RpcError as error:
        return error.code().name, None, error.details() or ""


def future_outcome(future: concurrent.futures.Future, timeout: float):
    """A StreamSession future's (code name, result or None, message)."""
    try:
        error = future.exception(timeout=timeout)
    except concurrent.futures.TimeoutError:
        return "HANG", None, f"no answer within {timeout:g} s"
    if error is None:
        return "OK", future.result(), ""
    if isinstance(error, mxserve.MxserveError):
        return error.code.name, None, error.message
    return "CLIENT_ERROR", None, repr(error)


# --- the models the clients share -----------------------------------------------------------

class World:
    """The fixed and live models, their weights, and what has been published.

    Live layer `blocks.<c>.fc` is only ever uploaded by client c, and every upload
    carries a tag t: column 0 of W and every bias element are t, the rest a fixed
    integer matrix. An FP32 forward of rows [0…0] and [1,0…0] then reads back
    the bias tag and the weight tag of the version that served it; they must be
    equal (one upload's W with another's b would be a torn version), a tag that
    was uploaded, and the whole output exactly X·W(t)ᵀ + b(t).
    """

    def __init__(self, run_id: str, clients: int, seed: int):
        rng = np.random.default_rng(seed)
        self.fixed = f"soak-{run_id}-fixed"
        self.live = f"soak-{run_id}-live"
        self.fixed_w = ints(rng, (FIXED_OUT, FIXED_IN), -4, 4)
        self.fixed_b = ints(rng, (FIXED_OUT,), -10, 10)
        self.live_layers = [f"blocks.{i}.fc" for i in range(clients)]
        self.live_base = {layer: ints(rng, (LIVE_OUT, LIVE_IN), -2, 2) for layer in self.live_layers}
        self._lock = threading.Lock()
        self._max_tag = {layer: 1 for layer in self.live_layers}
        self._version = 0  # the newest live version any client has seen published
        # Joules the soak's power streams put in the daemon's ledger: certainly
        # (answered streams, and the valid prefix of rejected ones), and possibly
        # (streams cancelled after sending samples).
        self.power_certain = 0.0
        self.power_possible = 0.0

    def live_weights(self, layer: str, tag: int):
        weight = self.live_base[layer].copy()
        weight[:, 0] = tag
        return weight, np.full(LIVE_OUT, tag, dtype=np.float32)

    def next_tag(self, layer: str) -> int:
        with self._lock:
            self._max_tag[layer] += 1
            return self._max_tag[layer]

    def saw_version(self, version: int) -> None:
        with self._lock:
            self._version = max(self._version, version)

    def latest_version(self) -> int:
        with self._lock:
            return self._version

    def add_power(self, certain: float = 0.0, possible: float = 0.0) -> None:
        with self._lock:
            self.power_certain += certain
            self.power_possible += possible

    def setup(self, client: mxserve.Client, tally: Tally) -> None:
        """Registers both models and publishes their first version (tag 1). Raises
        MxserveError if any step fails; counts the calls, so the client's totals
        match the daemon's."""
        client.register_model(self.fixed, [mxserve.LayerSpec(FIXED_LAYER, FIXED_OUT, FIXED_IN, True)])
        tally.record("Models.RegisterModel", "setup: register soak model", "OK", OK)
        client.upload_weights(self.fixed, {FIXED_LAYER: (self.fixed_w, self.fixed_b)}, publish=True)
        tally.record("Models.UploadWeights", "setup: upload with publish", "OK", OK)
        client.register_model(self.live, [mxserve.LayerSpec(layer, LIVE_OUT, LIVE_IN, True)
                                          for layer in self.live_layers])
        tally.record("Models.RegisterModel", "setup: register soak model", "OK", OK)
        result = client.upload_weights(
            self.live, {layer: self.live_weights(layer, 1) for layer in self.live_layers},
            publish=True)
        tally.record("Models.UploadWeights", "setup: upload with publish", "OK", OK)
        self.saw_version(result.weight_version)

    def check_live_output(self, layer: str, x: np.ndarray, result) -> Optional[str]:
        y = result.output
        problem = check_shape_finite("output", y, (x.shape[0], LIVE_OUT))
        if problem:
            return problem
        bias_tag, sum_tag = y[0, 0], y[1, 0]
        if not (np.all(y[0] == bias_tag) and np.all(y[1] == sum_tag)):
            return "output rows 0 and 1 (probes of the bias and of W[:, 0]) are not constant"
        weight_tag = sum_tag - bias_tag
        if weight_tag != bias_tag:
            return (f"torn weight version {result.info.weight_version}: W from upload tag "
                    f"{weight_tag:g}, bias from upload tag {bias_tag:g}")
        with self._lock:
            max_tag = self._max_tag[layer]
        tag = int(bias_tag)
        if tag != bias_tag or not 1 <= tag <= max_tag:
            return f"weights of tag {bias_tag:g}, which was never uploaded (tags 1..{max_tag})"
        weight, bias = self.live_weights(layer, tag)
        # Not checked: info.weight_version >= min_version. min_weight_version is
        # compared with the model's version, while info.weight_version is the
        # version in which this layer last changed, which may be older.
        return first_problem(check_exact("output", y, exact_product(x, weight.T) + bias),
                             check_formats(result.info, "FP32"))


# --- one request, usable unary or on a stream ------------------------------------------------

@dataclasses.dataclass
class Op:
    """A compute request: how to send it unary and on a stream, and how to check it."""
    rpc: str                                    # "Gemm", "LayerForward", "LayerBackward"
    kind: str                                   # the row in the per-kind table
    expected: frozenset                         # codes it may end with
    call: Callable[[float], Any]                # unary, given a timeout
    submit: Optional[Callable[[Any], concurrent.futures.Future]]  # on a StreamSession
    check: Optional[Callable[[Any], Optional[str]]] = None


class SoakClient(threading.Thread):
    """One client: a loop of randomly chosen actions until the soak stops."""

    def __init__(self, index: int, address: str, world: World, tally: Tally,
                 stop: threading.Event, args: argparse.Namespace, run_id: str):
        super().__init__(name=f"soak-client-{index}", daemon=True)
        self.index = index
        self.address = address
        self.world = world
        self.tally = tally
        self.stop_event = stop
        self.timeout = args.call_timeout
        self.tiny = args.tiny_deadline
        self.run_id = run_id
        self.rng = random.Random(args.seed * 1000 + index)
        self.nrng = np.random.default_rng(args.seed * 1000 + index)
        self.own_layer = world.live_layers[index]
        self.policy_name = f"soak-{run_id}-p{index}"
        self.policy_exists = False
        self.churn_count = 0
        self.power_device = f"soak-{run_id}-c{index}"
        self.last_power_time = 0.0
        self.actions = [  # (weight, action): roughly the share of each in the mix
            (10, self.act_forward_fixed), (10, self.act_forward_live_versioned),
            (10, self.act_forward_live_explicit), (10, self.act_forward_live_policy),
            (8, self.act_backward), (6, self.act_gemm_exact), (5, self.act_gemm_quantized),
            (6, self.act_stream), (3, self.act_stream_cancelled), (5, self.act_upload_publish),
            (3, self.act_model_churn), (3, self.act_policies), (3, self.act_power),
            (1, self.act_power_cancelled), (2, self.act_energy_report),
            (4, self.act_tiny_deadline), (4, self.act_cancel_midflight), (5, self.act_bad_request),
        ]

    # --- the loop ---

    def run(self) -> None:
        weights = [w for w, _ in self.actions]
        actions = [a for _, a in self.actions]
        with mxserve.Client(self.address, timeout=self.timeout) as client, \
                grpc.insecure_channel(self.address, options=[
                    ("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20)]) as channel:
            self.client = client
            # Raw stubs for what the client package does not do: futures to cancel,
            # BF16 tensors, malformed messages, half-sent streams.
            self.compute = compute_pb2_grpc.ComputeStub(channel)
            self.models = models_pb2_grpc.ModelsStub(channel)
            self.telemetry = telemetry_pb2_grpc.TelemetryStub(channel)
            while not self.stop_event.is_set():
                action = self.rng.choices(actions, weights)[0]
                try:
                    action()
                except Exception:  # a bug in the soak or the client package: count it, go on
                    self.tally.record("soak", action.__name__, "CLIENT_ERROR", frozenset(),
                                      traceback.format_exc(limit=3).strip().replace("\n", " | "))

    def settle(self, rpc: str, kind: str, expected: frozenset, code: str, result: Any,
               message: str, check: Optional[Callable[[Any], Optional[str]]]) -> str:
        """Checks an OK result's contents, then records the outcome."""
        checked = False
        if code == "OK" and check is not None:
            problem = check(result)
            checked = True
            if problem:
                code, message = "WRONG_RESULT", problem
        self.tally.record(rpc, kind, code, expected, message, checked)
        return code

    def run_op(self, op: Op, timeout: Optional[float] = None, kind: Optional[str] = None,
               expected: Optional[frozenset] = None) -> str:
        code, result, message = attempt(lambda: op.call(timeout or self.timeout))
        return self.settle("Compute." + op.rpc, kind or op.kind, expected or op.expected, code,
                           result, message, op.check)

    def pick(self, seq):
        return self.rng.choice(seq)

    # --- compute requests ---

    def raw_forward(self, model, layer, x, dtype, fmt, phase, timeout, min_version=0):
        """LayerForward through the raw stub (any input dtype), as a ComputeResult."""
        request = compute_pb2.LayerForwardRequest(
            model=model, layer=layer, phase=phase_pb(phase), format=format_pb(fmt),
            input=common_pb2.Operand(tensor=tensor_pb(x, dtype)), min_weight_version=min_version)
        response = self.compute.LayerForward(request, timeout=timeout)
        return mxserve.ComputeResult(tensor_np(response.output),
                                     mxserve.ExecutionInfo.from_proto(response.info))

    def forward_op(self, kind, expected, model, layer, x, fmt, phase, check, dtype="FP32",
                   min_version=0) -> Op:
        if dtype == "BF16":  # only the raw stub sends BF16, so not on a stream
            return Op("LayerForward", kind, expected,
                      lambda t: self.raw_forward(model, layer, x, "BF16", fmt, phase, t, min_version),
                      None, check)
        data = x.astype(np.float16) if dtype == "FP16" else x
        return Op("LayerForward", kind, expected,
                  lambda t: self.client.forward(model, layer, data, format=fmt, phase=phase,
                                                min_weight_version=min_version, timeout=t),
                  lambda s: s.forward(model, layer, data, format=fmt, phase=phase,
                                      min_weight_version=min_version),
                  check)

    def op_forward_fixed(self) -> Op:
        """FP32 format on the fixed weights, input in FP32, FP16 or BF16: exact."""
        w = self.world
        m, dtype = self.pick(M_CHOICES), self.pick(("FP32", "FP16", "BF16"))
        x = ints(self.nrng, (m, FIXED_IN), -4, 4)
        want = exact_product(x, w.fixed_w.T) + w.fixed_b
        return self.forward_op(
            f"forward fixed, FP32, {dtype} input: exact", OK, w.fixed, FIXED_LAYER, x, "FP32",
            self.pick(PHASES),
            lambda r: first_problem(check_exact("output", r.output, want),
                                    check_formats(r.info, "FP32")), dtype)

    def op_forward_live_versioned(self) -> Op:
        """FP32 on a live layer while new versions are published: a whole version."""
        w = self.world
        layer, m = self.pick(w.live_layers), self.rng.randint(2, 40)
        x = ints(self.nrng, (m, LIVE_IN), -3, 3)
        x[0] = 0          # reads back the bias tag
        x[1] = 0
        x[1, 0] = 1       # reads back W[:, 0] + bias
        min_version = w.latest_version()  # published already, so never too new
        return self.forward_op(
            "forward live, FP32, min_weight_version: whole version, exact", OK, w.live, layer, x,
            "FP32", self.pick(PHASES), lambda r: w.check_live_output(layer, x, r),
            min_version=min_version)

    def op_forward_live_explicit(self) -> Op:
        w = self.world
        layer, m = self.pick(w.live_layers), self.pick(M_CHOICES)
        fmt, dtype = self.pick(FORMATS), self.pick(("FP32", "FP16", "BF16"))
        x = ints(self.nrng, (m, LIVE_IN), -3, 3)
        return self.forward_op(
            f"forward live, explicit format, {dtype} input", OK, w.live, layer, x, fmt,
            self.pick(PHASES),
            lambda r: first_problem(check_shape_finite("output", r.output, (m, LIVE_OUT)),
                                    check_formats(r.info, fmt)), dtype)

    def op_forward_live_policy(self, m: Optional[int] = None) -> Op:
        w = self.world
        layer, m = self.pick(w.live_layers), m or self.pick(M_CHOICES)
        x = self.nrng.standard_normal((m, LIVE_IN), dtype=np.float32)
        return self.forward_op(
            "forward live, policy's format", OK, w.live, layer, x, None, self.pick(PHASES),
            lambda r: first_problem(check_shape_finite("output", r.output, (m, LIVE_OUT)),
                                    check_formats(r.info, None)))

    def op_backward_fixed(self) -> Op:
        """FP32 backward on the fixed weights, with or without the input: exact."""
        w = self.world
        m, with_input = self.pick(M_CHOICES), self.rng.random() < 0.5
        dy = ints(self.nrng, (m, FIXED_OUT), -3, 3)
        x = ints(self.nrng, (m, FIXED_IN), -3, 3) if with_input else None
        want_input = exact_product(dy, w.fixed_w)
        want_weight = exact_product(dy.T, x) if with_input else None
        want_bias = dy.astype(np.float64).sum(axis=0).astype(np.float32)

        def check(r):
            return first_problem(
                check_exact("grad_input", r.grad_input, want_input),
                check_exact("grad_weight", r.grad_weight, want_weight) if with_input else
                (None if r.grad_weight is None else "grad_weight: sent without an input"),
                check_exact("grad_bias", r.grad_bias, want_bias), check_formats(r.info, "FP32"))
        kind = f"backward fixed, FP32, {'with' if with_input else 'without'} input: exact"
        return Op("LayerBackward", kind, OK,
                  lambda t: self.client.backward(w.fixed, FIXED_LAYER, dy, x, format="FP32",
                                                 phase="update", timeout=t),
                  lambda s: s.backward(w.fixed, FIXED_LAYER, dy, x, format="FP32", phase="update"),
                  check)

    def op_backward_live(self) -> Op:
        w = self.world
        layer, m, with_input = self.pick(w.live_layers), self.pick(M_CHOICES), self.rng.random() < 0.5
        dy = self.nrng.standard_normal((m, LIVE_OUT), dtype=np.float32)
        x = self.nrng.standard_normal((m, LIVE_IN), dtype=np.float32) if with_input else None
        phase = self.pick(PHASES)

        def check(r):
            return first_problem(
                check_shape_finite("grad_input", r.grad_input, (m, LIVE_IN)),
                check_shape_finite("grad_weight", r.grad_weight, (LIVE_OUT, LIVE_IN))
                if with_input else None,
                check_shape_finite("grad_bias", r.grad_bias, (LIVE_OUT,)),
                check_formats(r.info, None))
        kind = f"backward live, policy's format, {'with' if with_input else 'without'} input"
        return Op("LayerBackward", kind, OK,
                  lambda t: self.client.backward(w.live, layer, dy, x, phase=phase, timeout=t),
                  lambda s: s.backward(w.live, layer, dy, x, phase=phase), check)

    def op_gemm_exact(self) -> Op:
        """FP32 Gemm of small integers: must equal numpy exactly."""
        m, k, n = self.pick((1, 5, 16, 33)), self.pick((32, 64, 96, 250)), self.pick((1, 7, 64))
        a, b = ints(self.nrng, (m, k), -8, 8), ints(self.nrng, (k, n), -8, 8)
        want, phase = exact_product(a, b), self.pick(PHASES)
        return Op("Gemm", "gemm FP32 small integers: exact vs numpy", OK,
                  lambda t: self.client.gemm(a, b, "FP32", phase=phase, timeout=t),
                  lambda s: s.gemm(a, b, "FP32", phase=phase),
                  lambda r: first_problem(check_exact("c", r.output, want),
                                          check_formats(r.info, "FP32")))

    def op_gemm_quantized(self, m=None, k=None, n=None) -> Op:
        m, k, n = m or self.pick((1, 8, 32)), k or self.pick((32, 128, 200)), n or self.pick((16, 64))
        fmt = self.pick(QUANTIZED)
        fmt_b = self.pick((None, self.pick(QUANTIZED)))
        a = self.nrng.standard_normal((m, k), dtype=np.float32)
        b = self.nrng.standard_normal((k, n), dtype=np.float32)
        phase, rounding = self.pick(PHASES), self.pick(("even", "away"))
        return Op("Gemm", "gemm quantized formats", OK,
                  lambda t: self.client.gemm(a, b, fmt, fmt_b, phase=phase, rounding=rounding,
                                             timeout=t),
                  lambda s: s.gemm(a, b, fmt, fmt_b, phase=phase, rounding=rounding),
                  lambda r: first_problem(check_shape_finite("c", r.output, (m, n)),
                                          check_formats(r.info, fmt, fmt_b or fmt)))

    def op_bad_compute(self) -> Op:
        """A compute request the daemon must refuse, with the one code that fits."""
        w, m = self.world, self.pick((1, 4, 8))
        x = self.nrng.standard_normal((m, LIVE_IN), dtype=np.float32)
        layer, phase = self.pick(w.live_layers), self.pick(PHASES)
        bad = self.pick(("shape", "model", "layer", "phase", "version", "gemm_k", "gemm_format",
                         "backward_shape"))
        invalid, missing = frozenset({"INVALID_ARGUMENT"}), frozenset({"NOT_FOUND"})
        if bad == "shape":
            return self.forward_op("bad: forward input of the wrong width", invalid, w.live, layer,
                                   x[:, : LIVE_IN - 32], None, phase, None)
        if bad == "model":
            return self.forward_op("bad: forward on an unknown model", missing,
                                   f"soak-{self.run_id}-no-such-model", layer, x, None, phase, None)
        if bad == "layer":
            return self.forward_op("bad: forward on an unknown layer", missing, w.live,
                                   "no.such.layer", x, None, phase, None)
        if bad == "phase":
            return self.forward_op("bad: forward without a phase", invalid, w.live, layer, x,
                                   None, None, None)
        if bad == "version":
            return self.forward_op("bad: min_weight_version not reached",
                                   frozenset({"FAILED_PRECONDITION"}), w.live, layer, x, None,
                                   phase, None, min_version=w.latest_version() + 1_000_000)
        if bad in ("gemm_k", "gemm_format"):
            a = self.nrng.standard_normal((m, 64), dtype=np.float32)
            b = self.nrng.standard_normal((64 if bad == "gemm_format" else 96, 8), dtype=np.float32)
            fmt = None if bad == "gemm_format" else "MXFP8"
            kind = "bad: gemm without a format" if fmt is None else "bad: gemm with A's K != B's K"
            return Op("Gemm", kind, invalid,
                      lambda t: self.client.gemm(a, b, fmt, phase=phase, timeout=t),
                      lambda s: s.gemm(a, b, fmt, phase=phase))
        dy = self.nrng.standard_normal((m, LIVE_OUT + 1), dtype=np.float32)
        return Op("LayerBackward", "bad: backward grad_output of the wrong width", invalid,
                  lambda t: self.client.backward(w.live, layer, dy, phase="update", timeout=t),
                  lambda s: s.backward(w.live, layer, dy, phase="update"))

    def streamable_op(self) -> Op:
        """Any compute op a StreamSession can carry, a bad one now and then."""
        if self.rng.random() < 0.1:
            return self.op_bad_compute()
        while True:
            op = self.pick((self.op_forward_fixed, self.op_forward_live_versioned,
                            self.op_forward_live_policy, self.op_backward_fixed,
                            self.op_backward_live, self.op_gemm_exact, self.op_gemm_quantized))()
            if op.submit is not None:
                return op

    # --- actions: unary compute ---

    def act_forward_fixed(self):
        self.run_op(self.op_forward_fixed())

    def act_forward_live_versioned(self):
        self.run_op(self.op_forward_live_versioned())

    def act_forward_live_explicit(self):
        self.run_op(self.op_forward_live_explicit())

    def act_forward_live_policy(self):
        self.run_op(self.op_forward_live_policy())

    def act_backward(self):
        self.run_op(self.pick((self.op_backward_fixed, self.op_backward_live))())

    def act_gemm_exact(self):
        self.run_op(self.op_gemm_exact())

    def act_gemm_quantized(self):
        self.run_op(self.op_gemm_quantized())

    # --- actions: streams ---

    def settle_stream(self, ops: List[Op], futures: List, extra: frozenset, why: str) -> List[str]:
        """Records each request of a stream; `extra` are the codes an interruption
        allows. Returns their codes."""
        codes = []
        for op, future in zip(ops, futures):
            if isinstance(future, tuple):  # submitting it already failed: (code, message)
                code, result, message = future[0], None, future[1]
            else:
                code, result, message = future_outcome(future, self.timeout)
            codes.append(self.settle("Stream." + op.rpc, op.kind + why, op.expected | extra, code,
                                     result, message, op.check))
        return codes

    def submit_all(self, session, ops: List[Op]) -> List:
        futures = []
        for op in ops:
            try:
                futures.append(op.submit(session))
            except mxserve.MxserveError as error:  # the stream broke before this one went out
                futures.append((error.code.name, error.message))
        return futures

    def act_stream(self):
        """Several requests in flight on one Compute.Stream, answered out of order."""
        ops = [self.streamable_op() for _ in range(self.rng.randint(4, 16))]
        code, message = "OK", ""
        try:
            with self.client.session(max_in_flight=self.pick((2, 4, 8, 16)),
                                     timeout=self.timeout) as session:
                futures = self.submit_all(session, ops)
        except Exception as error:  # noqa: BLE001 - whatever it is, it is an outcome
            code, message = "CLIENT_ERROR", repr(error)
            futures = [("CLIENT_ERROR", repr(error))] * len(ops)
        self.tally.record("Compute.Stream", "stream of 4-16 requests", code, OK, message)
        self.settle_stream(ops, futures, frozenset(), " (on a stream)")

    def act_stream_cancelled(self):
        """A stream cancelled once its first answer is in: the rest end CANCELLED."""
        ops = [self.streamable_op() for _ in range(self.rng.randint(6, 16))]
        session = self.client.session(max_in_flight=16, timeout=self.timeout)
        futures = self.submit_all(session, ops)
        pending = [f for f in futures if not isinstance(f, tuple)]
        concurrent.futures.wait(pending, timeout=self.timeout,
                                return_when=concurrent.futures.FIRST_COMPLETED)
        session.cancel()
        self.tally.record("Compute.Stream", "stream cancelled halfway", "CANCELLED",
                          frozenset({"CANCELLED"}))
        self.settle_stream(ops, futures, frozenset({"OK", "CANCELLED"}), " (stream cancelled)")

    # --- actions: interruptions ---

    def act_tiny_deadline(self):
        """Calls whose deadline (1 ms by default) passes before the work can finish."""
        tiny = frozenset({"OK", "DEADLINE_EXCEEDED"})
        variant = self.pick(("gemm", "forward", "backward", "stream"))
        why = f" with a {self.tiny * 1000:g} ms deadline"
        if variant == "stream":
            self.tiny_deadline_stream(tiny, why)
            return
        op = {"gemm": lambda: self.op_gemm_quantized(m=128, k=512, n=512),
              "forward": lambda: self.op_forward_live_policy(m=256),
              "backward": self.op_backward_live}[variant]()
        self.run_op(op, timeout=self.tiny, kind=op.kind + why, expected=op.expected | tiny)

    def tiny_deadline_stream(self, tiny: frozenset, why: str) -> None:
        """Four Gemms on one Compute.Stream under the tiny deadline, through the raw
        stub so that the stream's own final code is known, not only its requests'."""
        requests = []
        for request_id in range(1, 5):
            a = self.nrng.standard_normal((128, 512), dtype=np.float32)
            b = self.nrng.standard_normal((512, 256), dtype=np.float32)
            requests.append(compute_pb2.StreamRequest(request_id=request_id, gemm=compute_pb2.GemmRequest(
                phase=phase_pb(self.pick(PHASES)), format=format_pb(self.pick(QUANTIZED)),
                a=common_pb2.Operand(tensor=tensor_pb(a, "FP32")),
                b=common_pb2.Operand(tensor=tensor_pb(b, "FP32")))))
        answers, stream_code, stream_message = {}, "OK", ""
        try:
            for response in self.compute.Stream(iter(requests), timeout=self.tiny):
                answers[response.request_id] = response
        except grpc.RpcError as error:
            stream_code, stream_message = error.code().name, error.details() or ""
        self.tally.record("Compute.Stream", "stream" + why, stream_code, tiny, stream_message)
        kind = "gemm quantized formats (stream" + why + ")"
        for request in requests:
            response = answers.get(request.request_id)
            if response is None:  # never answered: it ended with the stream
                code, message = stream_code, stream_message
            else:
                code = STATUS_NAMES.get(response.status_code, f"CODE_{response.status_code}")
                message = response.status_message
            self.settle("Stream.Gemm", kind, tiny, code, response, message,
                        lambda r: check_shape_finite("c", tensor_np(r.gemm.c), (128, 256)))

    def act_cancel_midflight(self):
        """A unary call cancelled through its future a few ms after it was sent."""
        phase = self.pick(PHASES)
        if self.rng.random() < 0.5:
            a = self.nrng.standard_normal((128, 512), dtype=np.float32)
            b = self.nrng.standard_normal((512, 512), dtype=np.float32)
            fmt = self.pick(QUANTIZED)
            request = compute_pb2.GemmRequest(
                phase=phase_pb(phase), format=format_pb(fmt),
                a=common_pb2.Operand(tensor=tensor_pb(a, "FP32")),
                b=common_pb2.Operand(tensor=tensor_pb(b, "FP32")))
            rpc, future = "Gemm", self.compute.Gemm.future(request, timeout=self.timeout)
            check = lambda r: check_shape_finite("c", tensor_np(r.c), (128, 512))  # noqa: E731
        else:
            x = self.nrng.standard_normal((256, LIVE_IN), dtype=np.float32)
            request = compute_pb2.LayerForwardRequest(
                model=self.world.live, layer=self.pick(self.world.live_layers),
                phase=phase_pb(phase), input=common_pb2.Operand(tensor=tensor_pb(x, "FP32")))
            rpc, future = "LayerForward", self.compute.LayerForward.future(request,
                                                                           timeout=self.timeout)
            check = lambda r: check_shape_finite("output", tensor_np(r.output),  # noqa: E731
                                                 (256, LIVE_OUT))
        time.sleep(self.rng.uniform(0, 0.004))
        future.cancel()
        code = future.code().name  # waits for the call to end, either way
        result = future.result() if code == "OK" else None
        self.settle("Compute." + rpc, f"{rpc.lower()} cancelled mid-flight",
                    frozenset({"OK", "CANCELLED"}), code, result, future.details() or "", check)

    # --- actions: weights and models ---

    def act_upload_publish(self):
        """A new version of this client's live layer, while everyone's forwards run."""
        w, layer = self.world, self.own_layer
        tag = w.next_tag(layer)
        in_stream = self.rng.random() < 0.5
        chunk = self.pick((4096, 1 << 20))  # small chunks: a multi-chunk stream
        code, result, message = attempt(lambda: self.client.upload_weights(
            w.live, {layer: w.live_weights(layer, tag)}, publish=in_stream, chunk_bytes=chunk))
        kind = "upload own live layer" + (" with publish" if in_stream else "")
        self.settle("Models.UploadWeights", kind, OK, code, result, message,
                    lambda r: None if r.tensors_staged == 2 else
                    f"tensors_staged {r.tensors_staged}, expected 2 (weight and bias)")
        if code != "OK":
            return
        if in_stream:
            w.saw_version(result.weight_version)
            return
        # Publishing takes everything staged in the model, so another client's
        # PublishVersion may already have published this upload: then there is
        # nothing left and FAILED_PRECONDITION is the right answer.
        code, info, message = attempt(lambda: self.client.publish(w.live))
        self.settle("Models.PublishVersion", "publish live model after own upload",
                    frozenset({"OK", "FAILED_PRECONDITION"}), code, info, message, None)
        if code == "OK":
            w.saw_version(info.weight_version)

    def gated_stream(self, items: Sequence, reached: threading.Event, gate: threading.Event):
        """Yields `items`, then holds the stream open until `gate`: a stream the
        test cancels halfway. `reached` says every item has been handed to gRPC."""
        yield from items
        reached.set()
        gate.wait(self.timeout)

    def cancel_halfway(self, method, items: Sequence):
        """Sends `items` on a client stream, cancels it, returns its code name."""
        reached, gate = threading.Event(), threading.Event()
        future = method.future(self.gated_stream(items, reached, gate), timeout=self.timeout)
        reached.wait(self.timeout)
        time.sleep(0.005)  # let the last item leave
        future.cancel()
        gate.set()
        return future.code().name, future.details() or ""

    def weight_chunks(self, model: str, layer: str, weight: np.ndarray, chunk_elements: int):
        flat = np.ascontiguousarray(weight, dtype="<f4").ravel()
        return [models_pb2.WeightChunk(model=model, layer=layer, role=models_pb2.TENSOR_ROLE_WEIGHT,
                                       dtype=common_pb2.DTYPE_FP32, offset_elements=start,
                                       data=flat[start:start + chunk_elements].tobytes())
                for start in range(0, flat.size, chunk_elements)]

    def act_model_churn(self):
        """Register, (cancel an upload,) upload+publish, forward, maybe race a forward
        with the delete, delete, then find the model gone."""
        self.churn_count += 1
        name = f"soak-{self.run_id}-c{self.index}-m{self.churn_count}"
        specs = [mxserve.LayerSpec(f"blocks.{i}.mlp.fc", self.pick((32, 64)), self.pick((32, 64, 96)),
                                   self.rng.random() < 0.5)
                 for i in range(self.rng.randint(1, 3))]
        policy = self.pick(("",) + BUILTIN_POLICIES + ((self.policy_name,) if self.policy_exists else ()))
        code, _, message = attempt(lambda: self.client.register_model(name, specs, policy=policy))
        self.settle("Models.RegisterModel", "register churn model", OK, code, None, message, None)
        if code != "OK":
            return
        if self.rng.random() < 0.3:
            spec = specs[0]
            weight = self.nrng.standard_normal((spec.out_features, spec.in_features), dtype=np.float32)
            chunks = self.weight_chunks(name, spec.name, weight, 256)
            code, message = self.cancel_halfway(self.models.UploadWeights, chunks[: len(chunks) // 2 + 1])
            self.settle("Models.UploadWeights", "upload cancelled halfway",
                        frozenset({"CANCELLED"}), code, None, message, None)
            code, info, message = attempt(lambda: self.client.describe_model(name))
            self.settle("Models.DescribeModel", "describe after a cancelled upload: nothing staged",
                        OK, code, info, message,
                        lambda i: None if i.staged_tensors == 0 and i.weight_version == 0 else
                        f"staged_tensors {i.staged_tensors}, weight_version {i.weight_version}: "
                        "a cancelled upload must stage nothing")
        weights = {s.name: (self.nrng.standard_normal((s.out_features, s.in_features), dtype=np.float32),
                            self.nrng.standard_normal(s.out_features, dtype=np.float32))
                   if s.bias else self.nrng.standard_normal((s.out_features, s.in_features),
                                                            dtype=np.float32) for s in specs}
        code, result, message = attempt(lambda: self.client.upload_weights(name, weights, publish=True))
        self.settle("Models.UploadWeights", "upload churn model with publish", OK, code, result,
                    message, lambda r: None if r.weight_version == 1 else
                    f"weight_version {r.weight_version}, expected 1 for a new model")
        spec = self.pick(specs)
        m = self.pick(M_CHOICES)
        x = self.nrng.standard_normal((m, spec.in_features), dtype=np.float32)
        self.run_op(self.forward_op("forward churn model, policy's format", OK, name, spec.name, x,
                                    None, self.pick(PHASES),
                                    lambda r: check_shape_finite("output", r.output,
                                                                 (m, spec.out_features))))
        if policy == self.policy_name:
            code, _, message = attempt(lambda: self.client.delete_policy(self.policy_name))
            self.settle("Policies.DeletePolicy", "delete a policy a model uses",
                        frozenset({"FAILED_PRECONDITION"}), code, None, message, None)
        if self.rng.random() < 0.3:
            code, _, message = attempt(lambda: self.client.set_active_policy(
                name, self.pick(BUILTIN_POLICIES)))
            self.settle("Policies.SetActivePolicy", "switch churn model's policy", OK, code, None,
                        message, None)
        racing = None
        if self.rng.random() < 0.5:  # a forward still in flight when its model is deleted
            request = compute_pb2.LayerForwardRequest(
                model=name, layer=spec.name, phase=phase_pb(self.pick(PHASES)),
                input=common_pb2.Operand(tensor=tensor_pb(x, "FP32")))
            racing = self.compute.LayerForward.future(request, timeout=self.timeout)
        code, freed, message = attempt(lambda: self.client.delete_model(name))
        self.settle("Models.DeleteModel", "delete churn model", OK, code, freed, message,
                    lambda f: None if f > 0 else f"freed_bytes {f}, expected > 0")
        if racing is not None:
            code = racing.code().name
            self.settle("Compute.LayerForward", "forward racing its model's deletion",
                        frozenset({"OK", "NOT_FOUND"}), code,
                        racing.result() if code == "OK" else None, racing.details() or "",
                        lambda r: check_shape_finite("output", tensor_np(r.output),
                                                     (m, spec.out_features)))
        self.run_op(self.forward_op("bad: forward on a deleted model", frozenset({"NOT_FOUND"}),
                                    name, spec.name, x, None, self.pick(PHASES), None))

    # --- actions: policies ---

    def act_policies(self):
        """Put, get and resolve this client's own policy; sometimes list, switch the
        live model to a built-in, or delete the policy (then get it: NOT_FOUND)."""
        w = self.world
        defaults = {phase: self.pick(FORMATS) for phase in PHASES}
        rule_format, rule_layers = self.pick(FORMATS), self.pick(("blocks.0.*", "*.fc", "@sensitive"))
        document = {"name": self.policy_name, "description": "bench/soak.py",
                    "defaults": defaults,
                    "rules": [{"phase": "*", "layers": rule_layers, "format": rule_format}]}
        code, info, message = attempt(lambda: self.client.put_policy(document))
        self.settle("Policies.PutPolicy", "put own policy", OK, code, info, message,
                    lambda i: None if i.name == self.policy_name and not i.builtin else
                    f"answered name '{i.name}', builtin {i.builtin}")
        if code != "OK":
            return
        self.policy_exists = True
        code, info, message = attempt(lambda: self.client.get_policy(self.policy_name))
        self.settle("Policies.GetPolicy", "get own policy", OK, code, info, message,
                    lambda i: None if i.document.get("defaults") == defaults else
                    f"defaults {i.document.get('defaults')}, expected {defaults}")

        def check_resolved(resolved):
            if len(resolved.entries) != len(PHASES) * len(w.live_layers):
                return f"{len(resolved.entries)} entries, expected {len(PHASES) * len(w.live_layers)}"
            for entry in resolved.entries:
                want = rule_format if entry.rule == 0 else defaults.get(entry.phase)
                if entry.rule not in (-1, 0) or entry.format != want:
                    return (f"({entry.phase}, {entry.layer}): {entry.format} by rule {entry.rule}, "
                            f"expected {want}")
            return None
        code, resolved, message = attempt(lambda: self.client.resolve_policy(w.live, self.policy_name))
        self.settle("Policies.ResolvePolicy", "resolve own policy on the live model", OK, code,
                    resolved, message, check_resolved)
        if self.rng.random() < 0.3:
            code, listed, message = attempt(self.client.list_policies)
            self.settle("Policies.ListPolicies", "list policies", OK, code, listed, message,
                        lambda ps: None if set(BUILTIN_POLICIES) <= {p.name for p in ps} else
                        "a built-in policy is missing")
        if self.rng.random() < 0.2:  # changes what policy-chosen forwards run in, mid-flight
            code, _, message = attempt(lambda: self.client.set_active_policy(
                w.live, self.pick(BUILTIN_POLICIES)))
            self.settle("Policies.SetActivePolicy", "switch live model to a built-in", OK, code,
                        None, message, None)
        if self.rng.random() < 0.3:  # nothing uses it: churn models are gone by now
            code, _, message = attempt(lambda: self.client.delete_policy(self.policy_name))
            self.settle("Policies.DeletePolicy", "delete own unused policy", OK, code, None,
                        message, None)
            if code == "OK":
                self.policy_exists = False
                code, _, message = attempt(lambda: self.client.get_policy(self.policy_name))
                self.settle("Policies.GetPolicy", "bad: get a deleted policy",
                            frozenset({"NOT_FOUND"}), code, None, message, None)

    # --- actions: telemetry ---

    def power_samples(self, count: int) -> List[mxserve.PowerSample]:
        """`count` valid samples 1 ms apart, later than any this client sent. Close
        together so that the timeline never runs ahead of the clock (the daemon
        refuses samples much later than its own time)."""
        start = max(time.time(), self.last_power_time + 0.001)
        samples = [mxserve.PowerSample(POWER_SOURCE, self.power_device, self.pick(PHASES),
                                       start + 0.001 * i, self.rng.uniform(40, 350))
                   for i in range(count)]
        self.last_power_time = samples[-1].timestamp
        return samples

    def act_power(self):
        samples = self.power_samples(self.rng.randint(2, 12))
        want = trapezoid_joules(samples)
        code, result, message = attempt(lambda: self.client.report_power(samples,
                                                                         timeout=self.timeout))
        self.settle("Telemetry.ReportPower", "report power samples", OK, code, result, message,
                    lambda r: None if r.samples_accepted == len(samples) and
                    math.isclose(r.joules_added, want, rel_tol=1e-9, abs_tol=1e-9) else
                    f"accepted {r.samples_accepted} of {len(samples)}, {r.joules_added!r} J, "
                    f"expected {want!r} J")
        if code == "OK":
            self.world.add_power(certain=result.joules_added)
        else:  # refused part-way: what came before the refusal still counts
            self.world.add_power(possible=want)

    def act_power_cancelled(self):
        samples = self.power_samples(2)
        items = [telemetry_pb2.PowerSample(source=s.source, device=s.device, phase=phase_pb(s.phase),
                                           timestamp_seconds=s.timestamp, watts=s.watts)
                 for s in samples]
        self.world.add_power(possible=trapezoid_joules(samples))  # if both arrived before the cancel
        code, message = self.cancel_halfway(self.telemetry.ReportPower, items)
        self.settle("Telemetry.ReportPower", "power stream cancelled halfway",
                    frozenset({"CANCELLED"}), code, None, message, None)

    def act_energy_report(self):
        since = self.pick((0.0, time.time() - 10))

        def check(report):
            if report.until_seconds < since:
                return f"until_seconds {report.until_seconds} < since_seconds {since}"
            for e in report.entries:
                if not (math.isfinite(e.joules) and e.joules >= 0 and math.isfinite(e.busy_seconds)
                        and e.busy_seconds >= 0):
                    return f"entry ({e.source}, {e.phase}): joules {e.joules}, busy {e.busy_seconds}"
            return None
        code, report, message = attempt(lambda: self.client.energy_report(since=since))
        self.settle("Telemetry.GetEnergyReport", "energy report", OK, code, report, message, check)

    # --- actions: requests the daemon must refuse ---

    def act_bad_request(self):
        invalid, missing = frozenset({"INVALID_ARGUMENT"}), frozenset({"NOT_FOUND"})
        w = self.world
        bad = self.pick(("compute", "compute", "compute", "short_data", "power_watts",
                         "power_time", "upload_truncated", "upload_model", "register_twice",
                         "delete_unknown", "policy_unknown", "policy_format", "resolve_unknown",
                         "energy_since"))
        if bad == "compute":
            self.run_op(self.op_bad_compute())
        elif bad == "short_data":  # a tensor whose bytes do not fill its shape
            tensor = tensor_pb(np.ones((4, LIVE_IN), dtype=np.float32), "FP32")
            tensor.data = tensor.data[:-4]
            request = compute_pb2.LayerForwardRequest(
                model=w.live, layer=self.pick(w.live_layers), phase=common_pb2.PHASE_ROLLOUT,
                input=common_pb2.Operand(tensor=tensor))
            code, _, message = attempt(lambda: self.compute.LayerForward(request, timeout=self.timeout))
            self.settle("Compute.LayerForward", "bad: input bytes short of its shape", invalid, code,
                        None, message, None)
        elif bad in ("power_watts", "power_time"):
            samples = self.power_samples(3)
            # The third sample is wrong; the first two still count (the daemon keeps
            # what came before a rejected sample).
            last = samples[2]
            samples[2] = (dataclasses.replace(last, watts=-5.0) if bad == "power_watts" else
                          dataclasses.replace(last, timestamp=samples[1].timestamp - 0.0005))
            code, _, message = attempt(lambda: self.client.report_power(samples, timeout=self.timeout))
            kind = ("bad: power sample with negative watts" if bad == "power_watts" else
                    "bad: power timestamps going backwards")
            self.settle("Telemetry.ReportPower", kind, invalid, code, None, message, None)
            self.world.add_power(certain=trapezoid_joules(samples[:2]))
        elif bad == "upload_truncated":  # half the chunks, then a clean half-close
            weight = np.zeros((LIVE_OUT, LIVE_IN), dtype=np.float32)
            chunks = self.weight_chunks(w.live, self.own_layer, weight, 1024)
            code, _, message = attempt(lambda: self.models.UploadWeights(
                iter(chunks[: len(chunks) // 2]), timeout=self.timeout))
            self.settle("Models.UploadWeights", "bad: upload stream missing chunks", invalid, code,
                        None, message, None)
        elif bad == "upload_model":
            chunks = self.weight_chunks(f"soak-{self.run_id}-no-such-model", "fc",
                                        np.zeros((4, 4), dtype=np.float32), 16)
            code, _, message = attempt(lambda: self.models.UploadWeights(iter(chunks),
                                                                         timeout=self.timeout))
            self.settle("Models.UploadWeights", "bad: upload to an unknown model", missing, code,
                        None, message, None)
        elif bad == "register_twice":
            code, _, message = attempt(lambda: self.client.register_model(
                w.live, [mxserve.LayerSpec("x", 4, 4)]))
            self.settle("Models.RegisterModel", "bad: register a taken name",
                        frozenset({"ALREADY_EXISTS"}), code, None, message, None)
        elif bad == "delete_unknown":
            code, _, message = attempt(lambda: self.client.delete_model(
                f"soak-{self.run_id}-no-such-model"))
            self.settle("Models.DeleteModel", "bad: delete an unknown model", missing, code, None,
                        message, None)
        elif bad == "policy_unknown":
            code, _, message = attempt(lambda: self.client.get_policy(f"soak-{self.run_id}-nope"))
            self.settle("Policies.GetPolicy", "bad: get an unknown policy", missing, code, None,
                        message, None)
        elif bad == "policy_format":
            document = {"name": f"soak-{self.run_id}-broken",
                        "defaults": {"rollout": "MXFP5", "reward": "FP16", "update": "FP16"}}
            code, _, message = attempt(lambda: self.client.put_policy(document))
            self.settle("Policies.PutPolicy", "bad: policy with an unknown format", invalid, code,
                        None, message, None)
        elif bad == "resolve_unknown":
            code, _, message = attempt(lambda: self.client.resolve_policy(
                f"soak-{self.run_id}-no-such-model"))
            self.settle("Policies.ResolvePolicy", "bad: resolve for an unknown model", missing,
                        code, None, message, None)
        else:
            code, _, message = attempt(lambda: self.client.energy_report(since=-1.0))
            self.settle("Telemetry.GetEnergyReport", "bad: energy report since a negative time",
                        invalid, code, None, message, None)


# --- the daemon ----------------------------------------------------------------------------

class Daemon:
    """mxserved as a child: free loopback ports, stderr read for the address and
    kept for the report, stopped with SIGTERM."""

    def __init__(self, binary: str, flags: Sequence[str], start_timeout: float = 30.0):
        self.command = [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                        *flags]
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        self.address = self.metrics_address = None
        self.start_line: Optional[str] = None  # version, backend, kernels: which build ran
        self.log_tail: collections.deque = collections.deque(maxlen=40)
        self.log_counts: collections.Counter = collections.Counter()  # (level, event) → n
        self.log_errors: List[str] = []
        listening = threading.Event()

        def read_log():
            for line in self.process.stderr:
                line = line.rstrip("\n")
                self.log_tail.append(line)
                match = _LOG_LEVEL_EVENT.search(line)
                if match:
                    self.log_counts[match.groups()] += 1
                    if match.group(1) == "error" and len(self.log_errors) < 20:
                        self.log_errors.append(line)
                if "event=starting" in line and self.start_line is None:
                    self.start_line = line
                found = _LISTENING.search(line)
                if found and not listening.is_set():
                    self.address, self.metrics_address = found.groups()
                    listening.set()

        self._reader = threading.Thread(target=read_log, name="mxserved-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout
        while not listening.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop(timeout=5)
                raise RuntimeError("mxserved did not start (`" + shlex.join(self.command) + "`):\n"
                                   + "\n".join(self.log_tail))

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float) -> dict:
        """SIGTERM, then wait; SIGKILL if it overstays `timeout`."""
        began = time.monotonic()
        killed = False
        already_exited = self.process.poll() is not None
        if not already_exited:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                killed = True
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        code = self.process.returncode
        return {"exit_code": code, "stop_seconds": round(time.monotonic() - began, 3),
                "killed_after_timeout": killed, "exited_before_sigterm": already_exited,
                "signal": signal.Signals(-code).name if code is not None and code < 0 else None}


def scrape_rpc_counts(metrics_address: Optional[str]) -> Optional[Dict[str, Dict[str, float]]]:
    """mxserve_rpc_completed_total from /metrics: {rpc: {code: count}}, or None."""
    if not metrics_address:
        return None
    try:
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    counts: Dict[str, Dict[str, float]] = collections.defaultdict(dict)
    for line in text.splitlines():
        if line.startswith("mxserve_rpc_completed_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            counts[labels.get("rpc", "?")][labels.get("code", "?")] = float(line.rsplit(" ", 1)[1])
    return dict(counts)


# --- reporting -----------------------------------------------------------------------------

def compare_with_daemon(tally: Tally, metrics) -> Optional[List[dict]]:
    """The client's codes per method (Compute.Gemm and Stream.Gemm are both the
    daemon's "Gemm") beside the daemon's mxserve_rpc_completed_total."""
    if not metrics:
        return None
    client: collections.Counter = collections.Counter()
    for (rpc, code, _), n in tally.by_rpc.items():
        if "." in rpc and code not in ("WRONG_RESULT", "CLIENT_ERROR", "HANG"):
            client[(rpc.split(".", 1)[1], code)] += n
    keys = set(client) | {(method, code) for method, codes in metrics.items() for code in codes}
    return [{"method": method, "code": code, "client": client.get((method, code), 0),
             "daemon": int(metrics.get(method, {}).get(code, 0))} for method, code in sorted(keys)]


def daemon_overcounts(comparison: Optional[List[dict]]) -> List[str]:
    """The daemon can only count a call CANCELLED if the client cancelled it, and
    DEADLINE_EXCEEDED if its deadline passed, which the client then sees too. So
    on a daemon only the soak talks to, its count of either code can be at most
    the client's (less where the call ended before the daemon saw it); more means
    it counted calls under the wrong code, e.g. expired deadlines as CANCELLED."""
    problems = []
    for row in comparison or []:
        if row["code"] in ("CANCELLED", "DEADLINE_EXCEEDED") and row["daemon"] > row["client"]:
            problems.append(f"the daemon counted {row['daemon']} {row['method']} calls "
                            f"{row['code']}, but only {row['client']} ended so at the client")
    return problems


def rss_statistics(series: List[tuple], duration: float) -> Optional[dict]:
    """First, last, min, max, and the growth from the first quarter's mean to the last's."""
    values = [rss for _, rss in series if rss is not None]
    if not values:
        return None
    first_q = [rss for t, rss in series if rss is not None and t <= duration / 4] or values[:1]
    last_q = [rss for t, rss in series if rss is not None and t >= duration * 3 / 4] or values[-1:]
    first_mean, last_mean = sum(first_q) / len(first_q), sum(last_q) / len(last_q)
    return {"samples": len(values), "first_mib": values[0], "last_mib": values[-1],
            "min_mib": min(values), "max_mib": max(values),
            "first_quarter_mean_mib": first_mean, "last_quarter_mean_mib": last_mean,
            "growth_mib": last_mean - first_mean,
            "growth_percent": 100 * (last_mean - first_mean) / first_mean if first_mean else None}


def print_table(header: Sequence[str], rows: List[Sequence], aligns: str) -> None:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if a == "<" else str(c).rjust(w)
                         for c, w, a in zip(cells, widths, aligns)).rstrip()
    print(line(header))
    for row in rows:
        print(line(row))


def print_summary(summary: dict) -> None:
    print()
    print(f"== outcomes per RPC and status code ({summary['requests']} requests, "
          f"{summary['requests_per_second']:.1f}/s over {summary['elapsed_seconds']:.1f} s)")
    rows = [(o["rpc"], o["code"], o["count"], o["expected"], o["unexpected"])
            for o in summary["outcomes_by_rpc"]]
    print_table(("rpc", "code", "count", "expected", "unexpected"), rows, "<<>>>")

    print("\n== per request kind (codes marked ! were not expected for that kind)")
    rows = [(k["rpc"], k["kind"], ", ".join(f"{c}{'' if c in k['expected_codes'] else '!'} {n}"
                                            for c, n in sorted(k["codes"].items())))
            for k in summary["outcomes_by_kind"]]
    print_table(("rpc", "kind", "codes"), rows, "<<<")

    print(f"\n== results checked: {summary['results_checked']} OK answers had their shape, "
          "finiteness, formats or exact bits checked")

    print(f"\n== unexpected outcomes: {summary['unexpected']}")
    for u in summary["unexpected_examples"]:
        print(f"  {u['rpc']} [{u['kind']}] {u['code']} x{u['count']}")
        for message in u["messages"]:
            print(f"      {message}")

    rss = summary.get("rss")
    print("\n== daemon RSS (MiB)")
    if rss:
        growth = rss["growth_percent"]
        print(f"  {rss['samples']} samples: first {rss['first_mib']:.1f}, last {rss['last_mib']:.1f}, "
              f"min {rss['min_mib']:.1f}, max {rss['max_mib']:.1f}")
        print(f"  first-quarter mean {rss['first_quarter_mean_mib']:.1f} -> last-quarter mean "
              f"{rss['last_quarter_mean_mib']:.1f}: growth {rss['growth_mib']:+.1f} MiB"
              + (f" ({growth:+.1f}%)" if growth is not None else ""))
        series = summary["rss_series"]
        step = max(1, len(series) // 12)
        print("  series: " + ", ".join(f"{t:.0f}s {r:.1f}" for t, r in series[::step] if r is not None))
        if summary.get("rss_limit_exceeded"):
            print(f"  growth exceeds --max-rss-growth {summary['max_rss_growth_mib']} MiB")
    else:
        print("  not available (no --pid, or /proc/PID/status unreadable)")

    energy = summary.get("energy_check")
    if energy:
        print(f"\n== energy ledger: {POWER_SOURCE} {energy['reported_joules']:.3f} J reported; "
              f"the soak's streams account for {energy['lower_joules']:.3f} J"
              + (f" to {energy['upper_joules']:.3f} J" if energy.get("upper_joules") is not None
                 else " or more")
              + f": {'consistent' if energy['ok'] else 'INCONSISTENT'}")

    comparison = summary.get("client_vs_daemon")
    if comparison:
        print("\n== client's codes vs the daemon's own count (mxserve_rpc_completed_total)")
        print("   (unary and stream requests together; they differ where one side ended a call "
              "first,\n   e.g. a deadline that passed before the daemon read the request)")
        print_table(("method", "code", "client", "daemon"),
                    [(r["method"], r["code"], r["client"], r["daemon"]) for r in comparison], "<<>>")

    log = summary.get("daemon_log")
    if log:
        print("\n== daemon log: " + ", ".join(f"{level} {n}" for level, n in sorted(log["levels"].items())))
        for event, n in sorted(log["warning_events"].items()):
            print(f"  warning {event}: {n}")
        for line in log["errors"]:
            print(f"  {line}")

    daemon = summary["daemon"]
    if daemon.get("exited_before_sigterm"):
        code = daemon["exit_code"]
        print("\n== daemon stop: it had already exited ("
              + (f"signal {daemon['signal']}" if daemon["signal"] else f"exit code {code}")
              + ") before the soak's SIGTERM; the end of its log:")
        for line in (summary.get("daemon_log") or {}).get("tail", [])[-8:]:
            print(f"  {line}")
    elif daemon.get("exit_code") is not None or daemon.get("killed_after_timeout"):
        how = ("killed by SIGKILL after --stop-timeout" if daemon["killed_after_timeout"] else
               f"signal {daemon['signal']}" if daemon["signal"] else f"exit code {daemon['exit_code']}")
        print(f"\n== daemon stop: SIGTERM -> {how} after {daemon['stop_seconds']:.2f} s")
    elif daemon.get("external"):
        print(f"\n== daemon: external (pid {daemon.get('pid')}), left running")

    print(f"\n== result: {'PASS' if summary['passed'] else 'FAIL'}"
          + "".join(f"\n   - {reason}" for reason in summary["failures"]))


def build_summary(args, tally: Tally, elapsed: float, rss_series, daemon_info: dict,
                  energy: Optional[dict], metrics, log: Optional[dict], failures: List[str]) -> dict:
    by_rpc = collections.defaultdict(lambda: [0, 0])
    for (rpc, code, is_expected), n in tally.by_rpc.items():
        by_rpc[(rpc, code)][0 if is_expected else 1] += n
    kinds: Dict[tuple, dict] = {}
    for (rpc, kind, code, is_expected), n in tally.by_kind.items():
        entry = kinds.setdefault((rpc, kind), {"rpc": rpc, "kind": kind, "codes": {},
                                               "expected_codes": []})
        entry["codes"][code] = entry["codes"].get(code, 0) + n
        if is_expected and code not in entry["expected_codes"]:
            entry["expected_codes"].append(code)
    unexpected_counts = collections.Counter()
    for (rpc, kind, code, is_expected), n in tally.by_kind.items():
        if not is_expected:
            unexpected_counts[(rpc, kind, code)] += n
    rss = rss_statistics(rss_series, elapsed)
    summary = {
        "clients": args.clients, "duration_seconds": args.duration, "seed": args.seed,
        "elapsed_seconds": elapsed, "requests": tally.total,
        "requests_per_second": tally.total / elapsed if elapsed > 0 else 0.0,
        "outcomes_by_rpc": [{"rpc": rpc, "code": code, "count": ok + bad, "expected": ok,
                             "unexpected": bad} for (rpc, code), (ok, bad) in sorted(by_rpc.items())],
        "outcomes_by_kind": [kinds[key] for key in sorted(kinds)],
        "results_checked": tally.checked,
        "unexpected": tally.unexpected,
        "unexpected_examples": [{"rpc": rpc, "kind": kind, "code": code, "count": n,
                                 "messages": tally.examples.get((rpc, kind, code), [])}
                                for (rpc, kind, code), n in sorted(unexpected_counts.items())],
        "rss": rss, "rss_series": [(round(t, 2), r) for t, r in rss_series],
        "max_rss_growth_mib": args.max_rss_growth,
        "rss_limit_exceeded": bool(rss and args.max_rss_growth is not None
                                   and rss["growth_mib"] > args.max_rss_growth),
        "energy_check": energy, "daemon_rpc_counts": metrics,
        "client_vs_daemon": compare_with_daemon(tally, metrics), "daemon_log": log,
        "daemon": daemon_info,
    }
    if tally.unexpected:
        failures.insert(0, f"{tally.unexpected} unexpected outcomes")
    if summary["rss_limit_exceeded"]:
        failures.append(f"RSS grew {rss['growth_mib']:.1f} MiB, over --max-rss-growth "
                        f"{args.max_rss_growth} MiB")
    summary["failures"] = failures
    summary["passed"] = not failures
    return summary


# --- main ----------------------------------------------------------------------------------

HELP_EPILOG = """\
what runs
  Unless --server is given, the soak starts its own daemon:
    MXSERVED --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 [--daemon-flag ...]
  and reads the bound addresses from its stderr line `event=listening grpc=ADDR
  metrics=ADDR`. It registers two models: "fixed" (one 48x96 layer, integer
  weights published once) and "live" (one 64x128 layer per client, republished
  by that client throughout). Then --clients threads each loop, until
  --duration is up, over a weighted random mix (seeded by --seed) of:
    LayerForward   fixed model, FP32 format, FP32/FP16/BF16 input: exact vs numpy;
                   live model, FP32 with min_weight_version: must be one whole
                   published version (bias and weight from the same upload), exact;
                   live model, explicit formats and the policy's choice, M 1..256
    LayerBackward  fixed model FP32 exact (grad_input, grad_weight, grad_bias),
                   live model in the policy's format, with and without the input
    Gemm           FP32 small integers exact vs numpy; quantized formats (MX, INT8,
                   BF16, FP16), mixed A/B formats, both roundings
    Stream         4-16 of the above on one Compute.Stream, 2-16 in flight
    UploadWeights + PublishVersion   new versions of the live layers mid-traffic
    RegisterModel / DeleteModel      model churn, incl. a forward racing the delete
    Put/Get/Resolve/List/Delete/SetActive Policy
    ReportPower (source soak_gpu) and GetEnergyReport
  and interruptions: calls with a --tiny-deadline (1 ms), unary calls cancelled
  through future.cancel() a few ms in, Compute streams, uploads and power streams
  cancelled halfway; and ~5% deliberately bad requests (wrong shapes, unknown
  models/layers/policies, no phase, short tensor data, truncated uploads, bad
  power samples) whose INVALID_ARGUMENT / NOT_FOUND / ALREADY_EXISTS /
  FAILED_PRECONDITION is expected.

what the report means
  Every finished request has a gRPC status code (CLIENT_ERROR: the soak or the
  client package raised; WRONG_RESULT: an OK answer whose shape, formats or bits
  are wrong; HANG: no answer within --call-timeout). Each request kind declares
  the codes it may end with: OK for plain requests; also DEADLINE_EXCEEDED under
  a tiny deadline; also CANCELLED when cancelled; FAILED_PRECONDITION for a
  publish whose upload another client's publish already took; NOT_FOUND for a
  forward racing its model's deletion. Anything else is UNEXPECTED, e.g.
  INTERNAL, UNKNOWN, UNAVAILABLE or RESOURCE_EXHAUSTED (nothing shuts down or
  fills the queue while the clients run), or a wrong result.
  Progress every --report-every seconds: elapsed, requests done, requests/s over
  the last interval, daemon RSS (VmRSS of /proc/PID/status).
  At the end: outcomes per RPC and code, the same per request kind, examples of
  each unexpected outcome, the RSS series (first, last, min, max, and growth from
  the first quarter's mean to the last quarter's), an energy-ledger consistency
  check, the client's codes beside the daemon's own mxserve_rpc_completed_total,
  warnings in its log, and how it stopped on SIGTERM. On a daemon the soak
  started, the daemon counting more CANCELLED or DEADLINE_EXCEEDED calls of a
  method than ended so at the client is a failure (it filed calls under the
  wrong code), and so is any INTERNAL, UNKNOWN or DATA_LOSS in its count.

exit status
  0  no unexpected outcome, the energy ledger and the daemon's counts consistent,
     and the daemon (when the soak started it) exited 0 on SIGTERM (and RSS
     growth within --max-rss-growth, when given)
  1  anything else
  2  usage error, or the daemon could not be started or reached

examples
  /usr/bin/python3 bench/soak.py                       # 4 clients x 30 s
  /usr/bin/python3 bench/soak.py --clients 8 --duration 2m --json soak.json
  /usr/bin/python3 bench/soak.py --daemon-flag=--workers=2 --daemon-flag='--batch-window-us 200'
  /usr/bin/python3 bench/soak.py --server 127.0.0.1:50051 --pid $(pidof mxserved)
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="soak.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A bounded soak test of a real mxserved over loopback: concurrent clients "
                    "send a seeded random mix of every RPC, with checked results, cancellations, "
                    "tiny deadlines and bad requests, while the daemon's memory is watched.",
        epilog=HELP_EPILOG)
    daemon = parser.add_argument_group("the daemon")
    daemon.add_argument("--mxserved", default=str(REPO / "build" / "bin" / "mxserved"),
                        help="daemon binary to start (default: %(default)s)")
    daemon.add_argument("--daemon-flag", action="append", default=[], metavar="FLAG",
                        help="extra flag(s) for the started daemon; repeatable; split like a shell "
                             "does, so write --daemon-flag=--workers=2 or --daemon-flag='--workers 2'")
    daemon.add_argument("--server", metavar="ADDR",
                        help="soak a daemon already running at ADDR instead of starting one")
    daemon.add_argument("--pid", type=int,
                        help="with --server: the daemon's pid, for its RSS (/proc/PID/status)")
    daemon.add_argument("--metrics", metavar="ADDR",
                        help="with --server: its --metrics-listen address, to read its own counts")
    daemon.add_argument("--stop-timeout", type=parse_duration, default=60.0, metavar="T",
                        help="how long the started daemon may take to exit after SIGTERM before "
                             "it is killed (a failure) (default: 60s)")
    load = parser.add_argument_group("the load")
    load.add_argument("--clients", type=int, default=4, metavar="N",
                      help="client threads, each with its own channel (default: %(default)s)")
    load.add_argument("--duration", type=parse_duration, default=30.0, metavar="T",
                      help="how long the clients run: 30, 30s, 2m, 1h (default: 30s)")
    load.add_argument("--seed", type=int, default=1,
                      help="seed of every random choice; client i uses seed*1000+i (default: 1)")
    load.add_argument("--call-timeout", type=parse_duration, default=30.0, metavar="T",
                      help="deadline of ordinary calls and streams; a call still unanswered then "
                           "counts as unexpected (default: 30s)")
    load.add_argument("--tiny-deadline", type=parse_duration, default=0.001, metavar="T",
                      help="the deadline of the deliberately short calls (default: 1ms)")
    out = parser.add_argument_group("the report")
    out.add_argument("--report-every", type=parse_duration, default=5.0, metavar="T",
                     help="seconds between progress lines (default: 5)")
    out.add_argument("--max-rss-growth", type=float, metavar="MIB",
                     help="also fail when RSS grows more than this many MiB between the first and "
                          "the last quarter's mean (default: report only)")
    out.add_argument("--json", metavar="FILE", help="write the summary as JSON to FILE")
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error("--clients: expected at least 1")
    if args.pid is not None and not args.server:
        parser.error("--pid goes with --server (a started daemon's pid is known)")
    if args.server is None and not (os.path.isfile(args.mxserved) and os.access(args.mxserved, os.X_OK)):
        parser.error(f"no mxserved binary at {args.mxserved}: build it (`make build`, or "
                     "`cmake --build build --target mxserved`), or pass --mxserved PATH, or "
                     "--server ADDR to soak a running daemon")
    args.daemon_flags = [flag for text in args.daemon_flag for flag in shlex.split(text)]
    return args


def watch(args, tally: Tally, pid: Optional[int], daemon: Optional[Daemon],
          stop: threading.Event, failures: List[str]):
    """Samples RSS about once a second and prints progress until the duration is up,
    the daemon dies, or Ctrl-C. Returns (elapsed seconds, [(t, rss MiB)])."""
    start = time.monotonic()
    series = [(0.0, read_rss_mib(pid))]
    next_report = args.report_every
    last_t, last_total = 0.0, 0
    try:
        while True:
            elapsed = time.monotonic() - start
            if elapsed >= args.duration:
                break
            time.sleep(min(1.0, args.report_every, args.duration - elapsed))
            elapsed = time.monotonic() - start
            rss = read_rss_mib(pid)
            series.append((elapsed, rss))
            if daemon is not None and not daemon.alive():
                failures.append(f"the daemon exited during the soak (code {daemon.process.returncode})")
                print(f"[{elapsed:6.1f}s] the daemon exited (code {daemon.process.returncode}); stopping",
                      flush=True)
                break
            if pid is not None and rss is None:
                failures.append(f"the daemon (pid {pid}) disappeared during the soak")
                break
            if elapsed >= next_report or elapsed >= args.duration:
                total = tally.total
                rate = (total - last_total) / (elapsed - last_t) if elapsed > last_t else 0.0
                rss_text = f"{rss:.1f} MiB" if rss is not None else "n/a"
                print(f"[{elapsed:6.1f}s] requests {total:7d}  {rate:7.1f} req/s  rss {rss_text}"
                      f"  unexpected {tally.unexpected}", flush=True)
                last_t, last_total = elapsed, total
                next_report += args.report_every
    except KeyboardInterrupt:
        failures.append("interrupted (Ctrl-C) before --duration")
        print("interrupted; stopping the clients", flush=True)
    stop.set()
    return time.monotonic() - start, series


def check_energy_ledger(client: mxserve.Client, world: World, since: float,
                        fresh_daemon: bool) -> dict:
    """The daemon's joules for the soak's source against what its streams sent.
    A fresh daemon's ledger holds only the soak's samples, so it is bounded on both
    sides; an external one may hold earlier runs', so only from below."""
    report = client.energy_report(since=since)
    reported = report.joules(source=POWER_SOURCE)
    lower = world.power_certain
    upper = world.power_certain + world.power_possible if fresh_daemon else None
    slack = 1e-6 * max(1.0, reported)
    ok = reported >= lower - slack and (upper is None or reported <= upper + slack)
    return {"reported_joules": reported, "lower_joules": lower, "upper_joules": upper, "ok": ok}


def clean_up(client: mxserve.Client, world: World, clients: List[SoakClient], tally: Tally) -> None:
    """Deletes what the soak made (matters on an external daemon; on a started one
    it is one more round of DeleteModel/DeletePolicy)."""
    for name in (world.fixed, world.live):
        code, _, message = attempt(lambda: client.delete_model(name))
        tally.record("Models.DeleteModel", "clean up: delete soak model", code, OK, message)
    for soak_client in clients:
        if soak_client.policy_exists:
            code, _, message = attempt(lambda: client.delete_policy(soak_client.policy_name))
            tally.record("Policies.DeletePolicy", "clean up: delete own policy", code, OK, message)


def main(argv=None) -> int:
    args = parse_args(argv)
    run_id = f"{args.seed}-{os.getpid()}"
    daemon: Optional[Daemon] = None
    if args.server:
        address, pid, metrics_address = args.server, args.pid, args.metrics
        if pid is None:
            print("note: no --pid, so the daemon's RSS is not watched", file=sys.stderr)
    else:
        try:
            daemon = Daemon(args.mxserved, args.daemon_flags)
        except (RuntimeError, OSError) as error:
            print(f"soak.py: {error}", file=sys.stderr)
            return 2
        address, pid, metrics_address = daemon.address, daemon.pid, daemon.metrics_address
    print(f"soak: {args.clients} clients x {args.duration:g} s, seed {args.seed}, daemon "
          + (f"{args.server} (pid {pid})" if daemon is None else
             f"{shlex.join(daemon.command)} (pid {pid}) at {address}, metrics {metrics_address}"),
          flush=True)
    if daemon is not None:
        built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(args.mxserved)))
        print(f"daemon binary built {built}; {daemon.start_line or 'no start line logged'}", flush=True)

    tally, stop, failures = Tally(), threading.Event(), []
    world = World(run_id, args.clients, args.seed)
    clients: List[SoakClient] = []
    elapsed, series, energy, metrics = 0.0, [], None, None
    daemon_info: dict = {"external": daemon is None, "pid": pid, "address": address}
    if daemon is not None:
        daemon_info.update(command=daemon.command, start_line=daemon.start_line,
                           binary_mtime=os.path.getmtime(args.mxserved))
    try:
        with mxserve.Client(address, timeout=args.call_timeout) as admin:
            try:
                admin.wait_ready(timeout=30)
                world.setup(admin, tally)
            except mxserve.MxserveError as error:
                print(f"soak.py: cannot set up on {address}: {error}", file=sys.stderr)
                return 2
            energy_since = math.floor(time.time()) - 1.0 if daemon is None else 0.0
            clients = [SoakClient(i, address, world, tally, stop, args, run_id)
                       for i in range(args.clients)]
            for client in clients:
                client.start()
            elapsed, series = watch(args, tally, pid, daemon, stop, failures)
            hung = []
            join_by = time.monotonic() + args.call_timeout + 10
            for client in clients:
                client.join(timeout=max(0.0, join_by - time.monotonic()))
                if client.is_alive():
                    hung.append(client.name)
            if hung:  # their last call never came back
                tally.record("soak", "client thread did not finish", "HANG", frozenset(),
                             ", ".join(hung))
            if daemon is None or daemon.alive():
                code, energy, message = attempt(lambda: check_energy_ledger(
                    admin, world, energy_since, daemon is not None))
                tally.record("Telemetry.GetEnergyReport", "final energy check", code, OK, message)
                if code == "OK" and not energy["ok"]:
                    failures.append(f"energy ledger: {POWER_SOURCE} {energy['reported_joules']:.6f} J "
                                    f"outside [{energy['lower_joules']:.6f}, {energy['upper_joules']}]")
                clean_up(admin, world, clients, tally)
                metrics = scrape_rpc_counts(metrics_address)
                for rpc, codes in (metrics or {}).items():
                    for code in UNEXPECTED_IN_DAEMON_METRICS:
                        if codes.get(code):
                            failures.append(f"the daemon counted {int(codes[code])} {rpc} calls "
                                            f"ending {code}")
                if daemon is not None:  # an external daemon's counters hold others' calls too
                    failures.extend(daemon_overcounts(compare_with_daemon(tally, metrics)))
    finally:
        stop.set()
        if daemon is not None:
            daemon_info.update(daemon.stop(timeout=args.stop_timeout))
            if daemon_info["exited_before_sigterm"]:
                pass  # watch() already said so; the report shows the end of its log
            elif daemon_info["killed_after_timeout"]:
                failures.append(f"the daemon did not exit within {args.stop_timeout:g} s of SIGTERM")
            elif daemon_info["exit_code"] != 0:
                failures.append(f"the daemon exited with {daemon_info['exit_code']}"
                                + (f" ({daemon_info['signal']})" if daemon_info["signal"] else "")
                                + " on SIGTERM")

    log = None
    if daemon is not None:
        levels = collections.Counter()
        warnings = collections.Counter()
        for (level, event), n in daemon.log_counts.items():
            levels[level] += n
            if level == "warning":
                warnings[event] += n
        log = {"levels": dict(levels), "warning_events": dict(warnings), "errors": daemon.log_errors,
               "tail": list(daemon.log_tail)}
        if daemon.log_errors:
            failures.append(f"{len(daemon.log_errors)} level=error lines in the daemon's log")
    summary = build_summary(args, tally, elapsed, series, daemon_info, energy, metrics, log, failures)
    print_summary(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"summary written to {args.json}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
