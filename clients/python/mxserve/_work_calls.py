"""Telemetry.ReportWork's messages: WorkCalls checked and put on the wire, a list
split into messages within the daemon's bounds."""

from __future__ import annotations

from typing import Iterable, List

import numpy as np

from mxserve import _wire
from mxserve.types import WorkCall
from mxserve.v1 import common_pb2, telemetry_pb2

# Telemetry.ReportWork's bounds (server/rpc/telemetry_service.h): calls per message,
# a call's count, the counts of one message together, and a call's rows.
MAX_WORK_CALLS = 1 << 16
MAX_WORK_CALL_COUNT = 1 << 20
MAX_WORK_CALLS_BOOKED = 1 << 22
MAX_WORK_ROWS = 1 << 32


def _work_requests(calls: Iterable[WorkCall], scope_run: str, budget: int
                   ) -> List[telemetry_pb2.ReportWorkRequest]:
    """The calls as ReportWork messages, in order: a message ends at MAX_WORK_CALLS
    calls, at `budget` bytes of calls, or before its counts would pass
    MAX_WORK_CALLS_BOOKED. Every call is checked first (_work_call_to_wire)."""
    requests: List[telemetry_pb2.ReportWorkRequest] = []
    calls_pb: List[telemetry_pb2.WorkCall] = []
    booked = size = 0
    for index, call in enumerate(calls):
        pb = _work_call_to_wire(call, scope_run, f"calls[{index}]")
        entry_bytes = pb.ByteSize() + 8  # the field's tag and length
        if calls_pb and (len(calls_pb) == MAX_WORK_CALLS or size + entry_bytes > budget
                         or booked + pb.count > MAX_WORK_CALLS_BOOKED):
            requests.append(telemetry_pb2.ReportWorkRequest(calls=calls_pb))
            calls_pb, booked, size = [], 0, 0
        calls_pb.append(pb)
        booked += pb.count
        size += entry_bytes
    if calls_pb:
        requests.append(telemetry_pb2.ReportWorkRequest(calls=calls_pb))
    return requests


def _work_call_to_wire(call: WorkCall, scope_run: str, field: str):
    """One WorkCall as the daemon's message, checked for what is obviously wrong
    (ValueError naming `field`.<name>); the daemon checks the rest (the layer's
    out_features, that the model and layer exist)."""
    if not isinstance(call, WorkCall):
        raise ValueError(f"{field}: expected an mxserve.WorkCall, got {type(call).__name__}")

    def named(convert, value):
        try:
            return convert(value)
        except ValueError as error:  # the converters' messages start with the field's name
            raise ValueError(f"{field}.{error}") from None

    phase = named(_wire.phase_to_wire, call.phase)
    if phase == common_pb2.PHASE_UNSPECIFIED:
        raise ValueError(f"{field}.phase: required; expected {_wire.either(_wire.PHASES)}")
    run = _wire.run_to_wire(call.run if call.run is not None else scope_run, f"{field}.run")
    try:
        kind = _wire.enum_value(telemetry_pb2.WorkCallKind, call.call, "call")
    except ValueError:
        kinds = " or ".join(repr(name) for name in _wire.enum_names(telemetry_pb2.WorkCallKind))
        raise ValueError(f"{field}.call: expected {kinds}, got {call.call!r}") from None
    fmt = named(_wire.format_to_wire, call.format)
    if fmt == common_pb2.FORMAT_UNSPECIFIED:
        raise ValueError(f"{field}.format: required (the format the call ran in), got "
                         f"{call.format!r}")
    for name in ("model", "layer"):
        if not isinstance(getattr(call, name), str) or not getattr(call, name):
            raise ValueError(f"{field}.{name}: expected a non-empty string, got "
                             f"{getattr(call, name)!r}")

    def integer(name, low, high):
        value = getattr(call, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                or not low <= value <= high:
            raise ValueError(f"{field}.{name}: expected an integer in [{low}, {high}], "
                             f"got {value!r}")
        return int(value)

    m = integer("m", 1, MAX_WORK_ROWS)
    n = integer("n", 0, MAX_WORK_ROWS)
    count = integer("count", 1, MAX_WORK_CALL_COUNT)
    if kind == telemetry_pb2.WORK_CALL_KIND_FORWARD and (call.grad_input or call.grad_weight):
        raise ValueError(f"{field}.grad_input: expected grad_input and grad_weight False for a "
                         "forward call")
    if kind == telemetry_pb2.WORK_CALL_KIND_BACKWARD and not (call.grad_input or call.grad_weight):
        raise ValueError(f"{field}.grad_weight: a backward call runs grad_input, grad_weight or "
                         "both; got neither")
    return telemetry_pb2.WorkCall(phase=phase, run=run, model=call.model, layer=call.layer,
                                  call=kind, format=fmt, m=m, n=n,
                                  grad_input=bool(call.grad_input),
                                  grad_weight=bool(call.grad_weight), count=count)
