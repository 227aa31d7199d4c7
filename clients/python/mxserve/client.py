"""mxserve.Client: every RPC of mxserve.v1 with Pythonic signatures.

    with mxserve.Client("127.0.0.1:50051") as client:
        client.register_model("mlp", [("fc1", 64, 32, True)])
        client.upload_weights("mlp", {"fc1": (w, b)}, publish=True)
        with client.run("exp1/policy-B"), client.phase("rollout"):
            y = client.forward("mlp", "fc1", x).output
        joules = client.energy_report(run="exp1/policy-B").joules()

Arrays are numpy arrays or torch tensors (outputs follow the input's kind). Every
failure the daemon reports is raised as `MxserveError`, carrying the gRPC status
code and the daemon's message, which names the offending field.
"""

from __future__ import annotations

import collections
import contextvars
import json
import numbers
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import grpc

from mxserve import _health_pb2, _wire, security
from mxserve._calibration import DEFAULT_CALIBRATION_BYTES, _calibration_requests
from mxserve._errors import MxserveError
from mxserve._scope import _Scope
from mxserve._stream import StreamSession, _Requests
from mxserve._upload import _upload_stream
from mxserve._work_calls import (MAX_WORK_CALL_COUNT, MAX_WORK_CALLS, MAX_WORK_CALLS_BOOKED,
                                 MAX_WORK_ROWS, _work_requests)
from mxserve.types import (BackwardResult, ComputeResult, EnergyEntry, EnergyReport,
                           EnergyInterval, EnergyResult, GeneratedPolicy, LayerSpec, ModelInfo,
                           OptimizerStepResult, PolicyInfo, PowerResult, PowerSample, Profile, ReportWorkResult,
                           ResolvedFormat, ResolvedPolicy, UploadResult, WorkCall)
from mxserve.v1 import (common_pb2, compute_pb2, compute_pb2_grpc, models_pb2, models_pb2_grpc,
                        policies_pb2, policies_pb2_grpc, profiles_pb2, profiles_pb2_grpc,
                        telemetry_pb2, telemetry_pb2_grpc)

# The public names, some kept here for `from mxserve.client import ...` from where
# they now live: StreamSession (_stream), MxserveError (_errors), the calibration
# and ReportWork bounds (_calibration, _work_calls).
__all__ = ["CLIENT_TIMEOUT", "DEFAULT_ADDRESS", "DEFAULT_CALIBRATION_BYTES", "DEFAULT_CHUNK_BYTES",
           "DEFAULT_MAX_MESSAGE_BYTES", "ENVELOPE_BYTES", "MAX_WORK_CALL_COUNT", "MAX_WORK_CALLS",
           "MAX_WORK_CALLS_BOOKED", "MAX_WORK_ROWS", "Client", "MxserveError", "StreamSession"]

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # the daemon's default --max-message-bytes
DEFAULT_CHUNK_BYTES = 1 << 20         # UploadWeights chunk size
# Room in a message for what is not tensor data (names, shapes, ExecutionInfo): a
# message carries at most max_message_bytes - ENVELOPE_BYTES of tensors.
ENVELOPE_BYTES = 64 << 10


class _ClientTimeout:
    """The default of every call's `timeout`: the client's own. None means none."""

    def __repr__(self) -> str:
        return "<the client's timeout>"


CLIENT_TIMEOUT: Any = _ClientTimeout()


def _check_timeout(timeout: Any) -> Optional[float]:
    """None (no deadline) or seconds > 0; a timeout of -1 became DEADLINE_EXCEEDED
    from the daemon, and '5' a TypeError from inside grpc."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or \
            not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout: expected seconds > 0 (or None: no deadline), got {timeout!r}")
    return float(timeout)


_LAYER_FORMS = "a LayerSpec, (name, out_features, in_features[, bias]) or a dict of those"


def _layer_spec(layer: Any, where: str = "layer") -> LayerSpec:
    if isinstance(layer, LayerSpec):
        return layer
    try:
        if isinstance(layer, Mapping):
            return LayerSpec(layer["name"], int(layer["out_features"]),
                             int(layer["in_features"]), bool(layer.get("bias", False)))
        fields = None if isinstance(layer, (str, bytes)) else tuple(layer)
        if fields is not None and len(fields) in (3, 4):
            name, out_features, in_features, *rest = fields
            return LayerSpec(name, int(out_features), int(in_features),
                             bool(rest[0]) if rest else False)
    except (KeyError, TypeError, ValueError):
        pass
    raise ValueError(f"{where}: expected {_LAYER_FORMS}, got {layer!r}")


def _layer_specs(layers: Any) -> List[LayerSpec]:
    """register_model's `layers`: an iterable of layer forms, not one name or one
    dict (whose iteration would give characters or keys)."""
    if isinstance(layers, (str, bytes, Mapping)) or not isinstance(layers, Iterable):
        raise ValueError(f"layers: expected a list of {_LAYER_FORMS}, got {layers!r}")
    return [_layer_spec(layer, f"layers[{i}]") for i, layer in enumerate(layers)]


# The generate_policy arguments each kind (GenerationKind's names) takes, of those
# that are kind-specific.
_KIND_VALUES = {"fraction": {"fraction"}, "budget": {"budget", "relative_budget"},
                "tolerance": {"tolerance"}}
# gemm's rounding: Rounding's names, and the words mxctl's --rounding takes.
_ROUNDING_ALIASES = {"even": "nearest_even", "away": "nearest_away"}
# The scale rules: ScaleRule's names, and mxctl's "nosat".
_SCALE_RULE_ALIASES = {"nosat": "no_saturation"}


def _scale_rule(rule) -> int:
    """None: SCALE_RULE_UNSPECIFIED (a layer call: the model's policy's rule for the
    phase, floor unless it names one; a Gemm: floor)."""
    if rule is None:
        return common_pb2.SCALE_RULE_UNSPECIFIED
    return _wire.enum_value(common_pb2.ScaleRule, rule, "scale_rule", aliases=_SCALE_RULE_ALIASES)


def _rounding_fields(rounding, seed) -> dict:
    """A request's rounding and seed fields: None leaves each unset (a layer call:
    the model's policy's rounding for the phase, nearest even unless it names
    one). A seed is the stochastic rounding's key: required with "stochastic"
    (here or in the policy) where an operand rounds (MX, NVFP4, INT8); the same
    seed gives the same bits."""
    fields = {}
    if rounding is not None:
        fields["rounding"] = _wire.enum_value(common_pb2.Rounding, rounding, "rounding",
                                              aliases=_ROUNDING_ALIASES)
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
            raise ValueError(f"seed: expected an integer in [0, 2^64), got {seed!r}")
        fields["seed"] = seed
    return fields


PhaseValues = Union[None, float, Mapping[Optional[str], float]]


def _concrete_formats(formats: Union[None, _wire.FormatLike, Iterable[_wire.FormatLike]],
                      field: str) -> List[int]:
    """Format names → wire values. None gives [] (the daemon's default). An empty
    list is refused: it reads as "no formats", which is never what was meant, and
    the wire could not tell it from the default. A format that leaves the choice
    to a policy is no candidate and is refused too."""
    if formats is None:
        return []
    if isinstance(formats, (str, int)):
        formats = [formats]
    formats = list(formats)
    if not formats:
        raise ValueError(f"{field}: an empty list; leave {field} out (None) for the daemon's "
                         "default")
    wires = []
    for fmt in formats:
        wire = _wire.format_to_wire(fmt)
        if wire == common_pb2.FORMAT_UNSPECIFIED:
            raise ValueError(f"{field}: {fmt!r} is not a format (None and 'policy' leave the "
                             "choice to a policy, which has no place here)")
        wires.append(wire)
    return wires


WarmUpLike = Union[None, str, Sequence[_wire.FormatLike]]


def _warm_up(warm_up: WarmUpLike, background: bool) -> models_pb2.WarmUp:
    """What a publish warms: "previous" (None: the copies requests used of the
    previous version), "none", or a list of formats; `background`: answer
    before the warm-up."""
    if warm_up is None or warm_up == "previous":
        return models_pb2.WarmUp(copies=models_pb2.WarmUp.COPIES_PREVIOUS, background=background)
    if warm_up == "none":
        return models_pb2.WarmUp(copies=models_pb2.WarmUp.COPIES_NONE, background=background)
    if isinstance(warm_up, str):
        raise ValueError(f"warm_up: expected 'previous', 'none' or a list of formats, "
                         f"got {warm_up!r}")
    formats = [_wire.format_to_wire(f) for f in warm_up]
    if not formats or common_pb2.FORMAT_UNSPECIFIED in formats:
        raise ValueError(f"warm_up: expected a non-empty list of formats, got {list(warm_up)!r}")
    return models_pb2.WarmUp(copies=models_pb2.WarmUp.COPIES_FORMATS, formats=formats,
                             background=background)


def _phase_values(values: PhaseValues, field: str) -> List[profiles_pb2.PhaseValue]:
    """A number for every generated phase, or {phase: number} ("*" or None: every
    generated phase)."""
    if values is None:
        return []
    if not isinstance(values, Mapping):
        values = {None: values}
    result = []
    for phase, value in values.items():
        wire = common_pb2.PHASE_UNSPECIFIED if phase in (None, "*") else _wire.phase_to_wire(phase)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{field}: expected a number for phase {phase!r}, got {value!r}") \
                from None
        result.append(profiles_pb2.PhaseValue(phase=wire, value=number))
    return result


class Client:
    """A connection to mxserved.

    address: "host:port", or any gRPC target: several daemons as
    "ipv4:10.0.0.1:50051,10.0.0.2:50051", or a name that resolves to several, such as a
    headless Service's "dns:///mxserved.mxserve.svc.cluster.local:50051" (deploy/k8s).
    The channel balances calls over all of them with gRPC's round_robin (one address: no
    difference); `options` with "grpc.lb_policy_name" or "grpc.service_config" choose
    otherwise. Models and policies live in the daemon that took their calls: register,
    upload and put on each daemon (a Client per address) before spreading calls that use
    them over such a target. timeout: default deadline of each unary call, in seconds
    (a call's own `timeout=` overrides it; None: no deadline). Streams (`session`,
    `report_power`) have no deadline unless given one. The channel opens lazily; `wait_ready()` blocks until the daemon
    answers its health check.

    For a daemon run with TLS (mxserved --tls-cert): tls="ca.pem" (the CA its
    certificate is signed by; True: the system's CAs; or grpc.ChannelCredentials);
    with mutual TLS (--tls-client-ca) also client_cert= and client_key= (PEM files).
    token: sent as `authorization: Bearer <token>` metadata on every call
    (--auth-tokens), over TLS or plaintext. Defaults from the environment:
    MXSERVE_TLS_CA, MXSERVE_TLS_CERT, MXSERVE_TLS_KEY, MXSERVE_TOKEN
    (mxserve.security); tls=False forces plaintext.
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: Optional[float] = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[tuple] = (), tls: security.TlsLike = None,
                 token: Optional[str] = None, client_cert: Optional[str] = None,
                 client_key: Optional[str] = None):
        if not isinstance(address, str) or not address:
            raise ValueError(f"address: expected HOST:PORT or a gRPC target, got {address!r}")
        self.address = address
        self.timeout = _check_timeout(timeout)
        self._closed = False
        self.max_message_bytes = max_message_bytes  # what callers split large work by
        defaults = [("grpc.max_send_message_length", max_message_bytes),
                    ("grpc.max_receive_message_length", max_message_bytes)]
        if not {key for key, _ in options} & {"grpc.lb_policy_name", "grpc.service_config"}:
            defaults.append(("grpc.lb_policy_name", "round_robin"))
        credentials = security.channel_credentials(tls, client_cert, client_key)
        self._secure = credentials is not None
        self._channel = security.make_channel(address, [*defaults, *options], credentials, token)
        self._compute = compute_pb2_grpc.ComputeStub(self._channel)
        self._models = models_pb2_grpc.ModelsStub(self._channel)
        self._policies = policies_pb2_grpc.PoliciesStub(self._channel)
        self._telemetry = telemetry_pb2_grpc.TelemetryStub(self._channel)
        self._profiles = profiles_pb2_grpc.ProfilesStub(self._channel)
        self._health_check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=_health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=_health_pb2.HealthCheckResponse.FromString)
        # Serialized message bytes per RPC name, both ways: what crossed the wire
        # (less gRPC's framing), e.g. to check that no weight moved.
        self.bytes_sent: collections.Counter = collections.Counter()
        self.bytes_received: collections.Counter = collections.Counter()
        self._phase = contextvars.ContextVar(f"mxserve_phase_{id(self)}", default=None)
        self._run = contextvars.ContextVar(f"mxserve_run_{id(self)}", default=None)

    # --- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"mxserve.Client({self.address!r})"

    # --- plumbing ------------------------------------------------------------------------

    def _deadline(self, rpc: str, timeout: Any) -> Optional[float]:
        """The seconds a call may take (`timeout`, or the client's), after checking
        the client is open: grpc's own words were 'Cannot invoke RPC on closed
        channel!' and, for a timeout of '5', a TypeError from inside grpc."""
        if self._closed:
            raise ValueError(f"{rpc}: this mxserve.Client is closed")
        return self.timeout if timeout is CLIENT_TIMEOUT else _check_timeout(timeout)

    def _call(self, rpc: str, method: Callable, request: Any, timeout: Optional[float]):
        if hasattr(request, "ByteSize"):  # a stream's requests count themselves
            self.bytes_sent[rpc] += request.ByteSize()
        try:
            response = method(request, timeout=self._deadline(rpc, timeout))
        except grpc.RpcError as error:
            raise self._error(error, rpc) from None
        self.bytes_received[rpc] += response.ByteSize()
        return response

    def _counted(self, rpc: str, requests: Iterable) -> Iterable:
        for request in requests:
            self.bytes_sent[rpc] += request.ByteSize()
            yield request

    def _error(self, error: grpc.RpcError, rpc: str) -> MxserveError:
        message = error.details() or ""
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            message = security.explain_unavailable(self.address, self._secure, message)
        return MxserveError(error.code(), message, rpc)

    def _stream_call(self, rpc: str, method: Callable, requests: Iterable, timeout,
                     cancel_on_error: bool = False):
        """A client-streaming call. An exception raised while producing a request is
        re-raised as itself; the stream ends where it failed, half-closed, or with
        `cancel_on_error` cancelled (see _Requests)."""
        wrapped = _Requests(self._counted(rpc, requests), cancel_on_error)
        if not cancel_on_error:
            try:
                response = self._call(rpc, method, wrapped, timeout)
            except MxserveError:
                wrapped.reraise()  # the real cause, when producing a request failed
                raise
            wrapped.reraise()
            return response
        call = method.future(wrapped, timeout=self._deadline(rpc, timeout))
        wrapped.bind(call)
        try:
            response = call.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as error:
            wrapped.reraise()
            if isinstance(error, grpc.FutureCancelledError):
                raise MxserveError(grpc.StatusCode.CANCELLED, "cancelled", rpc) from None
            raise self._error(error, rpc) from None
        except BaseException:  # KeyboardInterrupt: do not leave the stream running
            call.cancel()
            raise
        wrapped.reraise()
        return response

    def _resolve_phase(self, phase: Optional[_wire.PhaseLike]) -> int:
        return _wire.phase_to_wire(phase if phase is not None else self._phase.get())

    def _resolve_run(self, run: Optional[str]) -> str:
        return _wire.run_to_wire(run if run is not None else self._run.get())

    # --- phases and runs -----------------------------------------------------------------

    def phase(self, phase: _wire.PhaseLike) -> _Scope:
        """Context manager and decorator: compute calls inside carry this phase.

        Nested scopes restore the outer phase on exit; each thread has its own.
        An explicit `phase=` argument on a call wins over the scope.
        """
        name = _wire.phase_name(_wire.phase_to_wire(phase))  # validates early
        return _Scope(self._phase, name, "phase")

    @property
    def current_phase(self) -> Optional[str]:
        """The phase compute calls from this thread carry now, or None."""
        return self._phase.get()

    def run(self, tag: Optional[str]) -> _Scope:
        """Context manager and decorator: compute calls and power samples inside
        carry this run tag, and the daemon books their energy under it, so that
        `energy_report(run=tag)` reads this run alone while others use the daemon.

        A tag is 1-64 characters of [A-Za-z0-9_.:/-] (ValueError otherwise, at
        once); "" or None leaves the calls inside untagged. Nested scopes restore
        the outer run on exit; each thread has its own. An explicit `run=` argument
        on a call wins over the scope.
        """
        return _Scope(self._run, _wire.run_to_wire(tag), "run")  # validates early

    @property
    def current_run(self) -> Optional[str]:
        """The run tag compute calls from this thread carry now, or None (untagged)."""
        return self._run.get() or None

    # --- health --------------------------------------------------------------------------

    def health(self, service: str = "", timeout: Optional[float] = CLIENT_TIMEOUT) -> str:
        """grpc.health.v1 status: "SERVING", "NOT_SERVING", ... (service "" = the daemon)."""
        response = self._call("Health.Check", self._health_check,
                              _health_pb2.HealthCheckRequest(service=service), timeout)
        return _health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Blocks until the daemon is reachable and SERVING, or raises MxserveError."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            # A TLS/plaintext mismatch never connects: one call says why.
            self.health(timeout=min(timeout, 5.0))
            raise MxserveError(grpc.StatusCode.UNAVAILABLE,
                               f"no daemon answered at {self.address} within {timeout:g} s",
                               "wait_ready") from None
        status = self.health(timeout=timeout)
        if status != "SERVING":
            raise MxserveError(grpc.StatusCode.UNAVAILABLE, f"daemon is {status}", "wait_ready")

    # --- compute -------------------------------------------------------------------------

    def _gemm_request(self, a, b, format, format_b, phase, rounding,
                      run, scale_rule=None, seed=None) -> compute_pb2.GemmRequest:
        return compute_pb2.GemmRequest(
            phase=self._resolve_phase(phase), run=self._resolve_run(run),
            format=_wire.format_to_wire(format),
            format_b=_wire.format_to_wire(format_b),
            a=common_pb2.Operand(tensor=_wire.to_tensor(a, "a")),
            b=common_pb2.Operand(tensor=_wire.to_tensor(b, "b")),
            scale_rule=_scale_rule(scale_rule), **_rounding_fields(rounding, seed))

    def _forward_request(self, model, layer, x, format, phase, min_weight_version, run,
                         scale_rule=None, rounding=None, seed=None, output_dtype=None):
        wire_output = {None: common_pb2.DTYPE_UNSPECIFIED, "fp32": common_pb2.DTYPE_FP32,
                       "bf16": common_pb2.DTYPE_BF16}.get(output_dtype)
        if wire_output is None:
            raise ValueError(f"output_dtype: expected None, 'fp32' or 'bf16', got {output_dtype!r}")
        return compute_pb2.LayerForwardRequest(
            model=model, layer=layer, phase=self._resolve_phase(phase), run=self._resolve_run(run),
            format=_wire.format_to_wire(format),
            input=common_pb2.Operand(tensor=_wire.to_tensor(x, "input")),
            min_weight_version=min_weight_version, scale_rule=_scale_rule(scale_rule),
            output_dtype=wire_output, **_rounding_fields(rounding, seed))

    def _backward_request(self, model, layer, grad_output, input, format, phase,
                          min_weight_version, run, weight_rows=None, scale_rule=None,
                          rounding=None, seed=None, accumulate_grad=False):
        request = compute_pb2.LayerBackwardRequest(
            model=model, layer=layer, phase=self._resolve_phase(phase), run=self._resolve_run(run),
            format=_wire.format_to_wire(format),
            grad_output=_wire.to_tensor(grad_output, "grad_output"),
            min_weight_version=min_weight_version, scale_rule=_scale_rule(scale_rule),
            accumulate_grad=accumulate_grad, **_rounding_fields(rounding, seed))
        if input is not None:
            request.input.CopyFrom(_wire.to_tensor(input, "input"))
        if weight_rows is not None:
            begin, end = weight_rows
            request.weight_rows.begin, request.weight_rows.end = begin, end
        return request

    def gemm(self, a, b, format: _wire.FormatLike, format_b: _wire.FormatLike = None, *,
             phase: Optional[_wire.PhaseLike] = None, rounding: str = "even",
             run: Optional[str] = None, scale_rule: Optional[str] = None,
             seed: Optional[int] = None,
             timeout: Optional[float] = CLIENT_TIMEOUT) -> ComputeResult:
        """C = A·B, A [M, K] quantized to `format`, B [K, N] to `format_b` (default:
        `format`), both along K. No model needed; the format is required. `phase`
        and `run` ("" for untagged) default to the `client.phase(...)` and
        `client.run(...)` scopes; so do those of the calls below. `scale_rule`
        ("floor", "no_saturation", "ceil", "rceil"; mxserve.v1.ScaleRule) sets how
        the MX block scales of the operands the call brings are chosen (None: floor
        for a Gemm, the model's policy's rule for the phase for a layer call); a
        layer's weight copies keep "floor". `rounding` is "even" ("nearest_even"),
        "away" or "stochastic" (which needs `seed`, its key: the same seed, the same
        bits, on every backend and in mxserve.torch.emulator); for a layer call None
        is the policy's rounding for the phase, and the weight copy stays even."""
        request = self._gemm_request(a, b, format, format_b, phase, rounding, run, scale_rule,
                                     seed)
        response = self._call("Gemm", self._compute.Gemm, request, timeout)
        return ComputeResult.from_proto(response.c, response.info, a)

    def forward(self, model: str, layer: str, x, *, format: _wire.FormatLike = None,
                phase: Optional[_wire.PhaseLike] = None, min_weight_version: int = 0,
                run: Optional[str] = None, scale_rule: Optional[str] = None,
                rounding: Optional[str] = None, seed: Optional[int] = None,
                output_dtype: Optional[str] = None,
                timeout: Optional[float] = CLIENT_TIMEOUT) -> ComputeResult:
        """Y = X·Wᵀ + bias for a registered layer. X is [M, in_features]; the format
        is explicit or the model's policy's choice for (phase, layer).
        `output_dtype="bf16"`: Y travels rounded to BF16 (nearest even; half the
        bytes), returned widened to float32 (a torch input gets its dtype back
        from the caller's `.to`)."""
        request = self._forward_request(model, layer, x, format, phase, min_weight_version, run,
                                        scale_rule, rounding, seed, output_dtype)
        response = self._call("LayerForward", self._compute.LayerForward, request, timeout)
        return ComputeResult.from_proto(response.output, response.info, x)

    def forward_many(self, model: str, layers: Sequence[str], x, *,
                     format: _wire.FormatLike = None, phase: Optional[_wire.PhaseLike] = None,
                     min_weight_version: int = 0, run: Optional[str] = None,
                     scale_rule: Optional[str] = None, rounding: Optional[str] = None,
                     seeds: Optional[Sequence[int]] = None, output_dtype: Optional[str] = None,
                     timeout: Optional[float] = CLIENT_TIMEOUT) -> List[ComputeResult]:
        """`forward` of several layers that take the same X (a block's q, k and v;
        gate and up) in one Compute.LayersForward call: X crosses the wire once,
        each layer runs as its own LayerForward would (the same bits). `seeds`:
        one per layer where the rounding is stochastic."""
        request = compute_pb2.LayersForwardRequest(
            request=self._forward_request(model, "", x, format, phase, min_weight_version, run,
                                          scale_rule, rounding, None, output_dtype),
            layers=list(layers),
            seeds=[_rounding_fields(None, seed)["seed"] for seed in (seeds or ())])
        response = self._call("LayersForward", self._compute.LayersForward, request, timeout)
        return [ComputeResult.from_proto(out.output, out.info, x) for out in response.outputs]

    def backward(self, model: str, layer: str, grad_output, input=None, *,
                 format: _wire.FormatLike = None, phase: Optional[_wire.PhaseLike] = None,
                 min_weight_version: int = 0, run: Optional[str] = None,
                 weight_rows: Optional[Tuple[int, int]] = None, scale_rule: Optional[str] = None,
                 rounding: Optional[str] = None, seed: Optional[int] = None,
                 accumulate_grad: bool = False,
                 timeout: Optional[float] = CLIENT_TIMEOUT) -> BackwardResult:
        """grad_input = dY·W; with `input` (the forward X) also grad_weight = dYᵀ·X.
        grad_bias (column sums of dY) comes back for layers with a bias.

        accumulate_grad=True (needs `input`): grad_weight and grad_bias are added to
        the layer's gradient on the daemon, for `step_optimizer`, and do not come
        back (None).

        weight_rows=(begin, end) asks for rows [begin, end) of grad_weight and
        grad_bias only, for a weight gradient larger than a message: grad_output is
        then dY's columns [begin, end), `input` is required, and grad_input is None.
        Slices are bit-identical to the same rows of an unsplit call (with stochastic
        rounding too: a slice draws the unsplit call's bits for its columns)."""
        request = self._backward_request(model, layer, grad_output, input, format, phase,
                                         min_weight_version, run, weight_rows, scale_rule,
                                         rounding, seed, accumulate_grad)
        return BackwardResult.from_proto(
            self._call("LayerBackward", self._compute.LayerBackward, request, timeout),
            grad_output)

    def session(self, max_in_flight: int = 64, timeout: Optional[float] = None) -> "StreamSession":
        """A Compute.Stream: submit many calls without waiting; results are futures."""
        return StreamSession(self, max_in_flight=max_in_flight, timeout=timeout)

    # --- models --------------------------------------------------------------------------

    def register_model(self, name: str, layers: Iterable[Any], policy: str = "",
                       timeout: Optional[float] = CLIENT_TIMEOUT, *,
                       lease_seconds: float = 0.0) -> ModelInfo:
        """Declares a model's linear layers: LayerSpec, (name, out, in[, bias]) or dicts.
        `lease_seconds` (1 to 30 days; 0: none): the daemon deletes the model once no
        call has named it for that long, so a crashed trainer leaves nothing behind."""
        specs = _layer_specs(layers)
        request = models_pb2.RegisterModelRequest(name=name, policy=policy or "",
                                                  lease_seconds=lease_seconds, layers=[
            models_pb2.LayerSpec(name=s.name, out_features=s.out_features,
                                 in_features=s.in_features, bias=s.bias) for s in specs])
        return ModelInfo.from_proto(
            self._call("RegisterModel", self._models.RegisterModel, request, timeout))

    def upload_weights(self, model: str, weights: Mapping[str, Any], *, publish: bool = False,
                       chunk_bytes: int = DEFAULT_CHUNK_BYTES, warm_up: WarmUpLike = None,
                       warm_in_background: bool = False,
                       timeout: Optional[float] = CLIENT_TIMEOUT) -> UploadResult:
        """Stages weights, streamed in chunks: {layer: W} or {layer: (W, b)} or
        {layer: {"weight": W, "bias": b}}. W is [out, in]. FP32, FP16 and BF16 travel
        as they are. Nothing is staged unless the whole stream arrives; `publish`
        makes the staged tensors the next weight version, warming `warm_up`
        ("previous": the copies requests used of the previous version, the default;
        "none"; or a list of formats) before it answers, or after with
        `warm_in_background`. Chunks are cut to fit the client's max_message_bytes."""
        if not isinstance(weights, Mapping):
            raise ValueError("weights: expected a mapping {layer: W, (W, b) or "
                             f"{{'weight': W, 'bias': b}}}}, got {type(weights).__name__}")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, numbers.Integral) or \
                chunk_bytes < 1:
            raise ValueError(f"chunk_bytes: expected a whole number of bytes > 0, got "
                             f"{chunk_bytes!r}")
        chunk_bytes = min(int(chunk_bytes), self.max_message_bytes - ENVELOPE_BYTES)
        stream = _upload_stream(model, weights, publish, chunk_bytes,
                                _warm_up(warm_up, warm_in_background))
        return UploadResult.from_proto(
            self._stream_call("UploadWeights", self._models.UploadWeights, stream, timeout))

    def load_safetensors(self, model: str, path: str, *, prefix: str = "", publish: bool = False,
                         warm_up: WarmUpLike = None, warm_in_background: bool = False,
                         timeout: Optional[float] = CLIENT_TIMEOUT) -> UploadResult:
        """Stages weights from a safetensors file on the daemon's host (`warm_up`
        as in upload_weights)."""
        request = models_pb2.LoadSafetensorsRequest(
            model=model, path=str(path), prefix=prefix, publish=publish,
            warm_up=_warm_up(warm_up, warm_in_background))
        return UploadResult.from_proto(
            self._call("LoadSafetensors", self._models.LoadSafetensors, request, timeout))

    def publish(self, model: str, *, warm_up: WarmUpLike = None, warm_in_background: bool = False,
                timeout: Optional[float] = CLIENT_TIMEOUT) -> ModelInfo:
        """Makes the staged weights version N+1 (`warm_up` as in upload_weights)."""
        request = models_pb2.PublishVersionRequest(model=model,
                                                   warm_up=_warm_up(warm_up, warm_in_background))
        return ModelInfo.from_proto(self._call("PublishVersion", self._models.PublishVersion,
                                               request, timeout))

    def step_optimizer(self, model: str, *, lr: float, betas: Tuple[float, float] = (0.9, 0.999),
                       eps: float = 1e-8, weight_decay: float = 1e-2,
                       max_grad_norm: Optional[float] = None, other_grad_sq_norm: float = 0.0,
                       warm_up: WarmUpLike = "none", warm_in_background: bool = False,
                       timeout: Optional[float] = CLIENT_TIMEOUT) -> OptimizerStepResult:
        """One torch.optim.AdamW step on the daemon of every layer whose gradient
        `backward(..., accumulate_grad=True)` added up, bit for bit torch's, with
        torch's global gradient-norm clipping (`max_grad_norm`; None: none) over
        those layers and the trainer's own parameters (`other_grad_sq_norm`: their
        Σ‖g‖²). Publishes the stepped weights as the next version, warming
        `warm_up` (default "none", as PPO epochs want); returns the version, the
        norms and the clipping coefficient to multiply the trainer's own gradients
        by."""
        beta1, beta2 = betas
        request = models_pb2.StepOptimizerRequest(
            model=model, adamw=models_pb2.AdamW(lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                                weight_decay=weight_decay),
            max_grad_norm=max_grad_norm or 0.0, other_grad_sq_norm=other_grad_sq_norm,
            warm_up=_warm_up(warm_up, warm_in_background))
        return OptimizerStepResult.from_proto(
            self._call("StepOptimizer", self._models.StepOptimizer, request, timeout))

    def discard_gradients(self, model: str,
                          timeout: Optional[float] = CLIENT_TIMEOUT) -> OptimizerStepResult:
        """Forgets the gradients `backward(..., accumulate_grad=True)` added up since
        the last step (e.g. after a backward pass failed midway, whose first layers'
        gradients are already in); nothing is stepped. Returns what was dropped."""
        request = models_pb2.StepOptimizerRequest(model=model, discard_gradients=True)
        return OptimizerStepResult.from_proto(
            self._call("StepOptimizer", self._models.StepOptimizer, request, timeout))

    def download_weights(self, model: str, layer: str, *, bias: bool = False,
                         dtype: str = "fp32", spec: Optional[LayerSpec] = None,
                         timeout: Optional[float] = CLIENT_TIMEOUT):
        """A layer's published weight [out_features, in_features] (or its bias,
        [out_features]) as the daemon holds it: the FP32 master, or it rounded to
        BF16 (dtype="bf16", returned widened to float32), read in pieces that fit
        max_message_bytes. Every piece must come from one weight version; a step
        or publish in between raises MxserveError(ABORTED). `spec`: the layer's
        LayerSpec when the caller has it (else one DescribeModel call finds it)."""
        wire_dtype = {"fp32": common_pb2.DTYPE_FP32, "bf16": common_pb2.DTYPE_BF16}.get(dtype)
        if wire_dtype is None:
            raise ValueError(f"dtype: expected 'fp32' or 'bf16', got {dtype!r}")
        if spec is None:
            spec = next((l.spec for l in self.describe_model(model, timeout).layers
                         if l.spec.name == layer), None)
        if spec is None:
            raise ValueError(f"layer: model {model!r} has no layer {layer!r}")
        if bias and not spec.bias:
            raise ValueError(f"bias: layer {layer!r} has none")
        shape = (spec.out_features,) if bias else (spec.out_features, spec.in_features)
        total = int(np.prod(shape))
        itemsize = 4 if dtype == "fp32" else 2
        step = max(1, (self.max_message_bytes - ENVELOPE_BYTES) // itemsize)
        role = models_pb2.TENSOR_ROLE_BIAS if bias else models_pb2.TENSOR_ROLE_WEIGHT
        out = np.empty(total, dtype=np.float32)
        version = None
        offset = 0
        while offset < total:
            chunk = self._call("DownloadWeights", self._models.DownloadWeights,
                               models_pb2.DownloadWeightsRequest(
                                   model=model, layer=layer, role=role, offset_elements=offset,
                                   max_elements=min(step, total - offset), dtype=wire_dtype),
                               timeout)
            if version is not None and chunk.weight_version != version:
                raise MxserveError(grpc.StatusCode.ABORTED,
                                   f"{layer}: version {chunk.weight_version} was published while "
                                   f"version {version} was being read; read it again",
                                   "DownloadWeights")
            version = chunk.weight_version
            if wire_dtype == common_pb2.DTYPE_FP32:
                piece = np.frombuffer(chunk.data, dtype="<f4")
            else:
                piece = _wire.widen_bf16(chunk.data)
            if piece.size == 0:
                raise MxserveError(grpc.StatusCode.DATA_LOSS,
                                   f"{layer}: an empty piece at element {offset}", "DownloadWeights")
            out[offset:offset + piece.size] = piece
            offset += piece.size
        return out.reshape(shape)

    def list_models(self, timeout: Optional[float] = CLIENT_TIMEOUT) -> List[ModelInfo]:
        """Every model, in name order (the daemon's pages joined; `timeout` is per page)."""
        models: List[ModelInfo] = []
        token = ""
        while True:
            response = self._call("ListModels", self._models.ListModels,
                                  models_pb2.ListModelsRequest(page_token=token), timeout)
            models.extend(ModelInfo.from_proto(m) for m in response.models)
            token = response.next_page_token
            if not token:
                return models

    def describe_model(self, name: str, timeout: Optional[float] = CLIENT_TIMEOUT) -> ModelInfo:
        return ModelInfo.from_proto(self._call("DescribeModel", self._models.DescribeModel,
                                               models_pb2.DescribeModelRequest(name=name),
                                               timeout))

    def delete_model(self, name: str, timeout: Optional[float] = CLIENT_TIMEOUT) -> int:
        """Deletes a model; returns the bytes it freed."""
        return self._call("DeleteModel", self._models.DeleteModel,
                          models_pb2.DeleteModelRequest(name=name), timeout).freed_bytes

    # --- policies ------------------------------------------------------------------------

    def put_policy(self, document: Union[str, Mapping[str, Any]],
                   timeout: Optional[float] = CLIENT_TIMEOUT) -> PolicyInfo:
        """Creates or replaces a user policy (JSON text or a dict; see server/README.md)."""
        text = document if isinstance(document, str) else json.dumps(document)
        info = self._call("PutPolicy", self._policies.PutPolicy,
                          policies_pb2.PutPolicyRequest(json=text), timeout)
        return PolicyInfo.from_proto(info)

    def get_policy(self, name: str, timeout: Optional[float] = CLIENT_TIMEOUT) -> PolicyInfo:
        info = self._call("GetPolicy", self._policies.GetPolicy,
                          policies_pb2.GetPolicyRequest(name=name), timeout)
        return PolicyInfo.from_proto(info)

    def list_policies(self, timeout: Optional[float] = CLIENT_TIMEOUT) -> List[PolicyInfo]:
        response = self._call("ListPolicies", self._policies.ListPolicies,
                              policies_pb2.ListPoliciesRequest(), timeout)
        return [PolicyInfo.from_proto(p) for p in response.policies]

    def delete_policy(self, name: str, timeout: Optional[float] = CLIENT_TIMEOUT) -> None:
        self._call("DeletePolicy", self._policies.DeletePolicy,
                   policies_pb2.DeletePolicyRequest(name=name), timeout)

    def set_active_policy(self, model: str, policy: str,
                          timeout: Optional[float] = CLIENT_TIMEOUT) -> str:
        """Switches a model's policy; returns the previous one."""
        return self._call("SetActivePolicy", self._policies.SetActivePolicy,
                          policies_pb2.SetActivePolicyRequest(model=model, policy=policy),
                          timeout).previous_policy

    def resolve_policy(self, model: str, policy: str = "",
                       timeout: Optional[float] = CLIENT_TIMEOUT) -> ResolvedPolicy:
        """The phase × layer → format table `policy` (default: the active one) gives,
        each entry with the phase's scale rule and rounding."""
        response = self._call("ResolvePolicy", self._policies.ResolvePolicy,
                              policies_pb2.ResolvePolicyRequest(model=model, policy=policy),
                              timeout)
        return ResolvedPolicy(response.policy,
                              tuple(ResolvedFormat.from_proto(e) for e in response.entries))

    # --- profiles ------------------------------------------------------------------------

    def profile(self, model: str, batches: Optional[Iterable[Any]] = None,
                formats: Union[None, _wire.FormatLike, Iterable[_wire.FormatLike]] = None,
                layers: Union[None, str, Iterable[str]] = None, reference: str = "fp32",
                batch_tokens: int = 0, *, max_message_bytes: int = DEFAULT_CALIBRATION_BYTES,
                timeout: Optional[float] = None) -> Profile:
        """Profiles the model's published weights (Profiles.ProfileModel); the daemon
        keeps the profile until the model is deleted or profiled again.

        batches: (layer, inputs X [tokens, in_features], output_grads dL/dY
        [tokens, out_features] or None) items from a full-precision pass, e.g. an
        `mxserve.torch.profile.capture`; None (or nothing) profiles the weights alone.
        Send them layer-major (all of one layer's rows, then the next): the daemon
        keeps one layer's quantized weights at hand while its rows arrive. Each
        item's rows travel in messages of at most about `max_message_bytes`.
        formats: candidate formats; None for the daemon's default (every format
        but FP32). layers: names to profile; None for every
        layer. reference: "fp32" or "fp64", what quantized outputs are compared
        with. batch_tokens: GEMM rows the cost model assumes (0: 128). Like every
        stream, it has no deadline unless `timeout` gives one. An exception while
        producing the items cancels the stream, so the daemon keeps nothing, and is
        raised as itself.
        """
        config = profiles_pb2.ProfileConfig(
            model=model, formats=_concrete_formats(formats, "formats"),
            layers=[layers] if isinstance(layers, str) else list(layers or ()),
            reference=_wire.enum_value(profiles_pb2.Reference, reference, "reference"),
            batch_tokens=batch_tokens)

        def stream():
            yield profiles_pb2.ProfileRequest(config=config)
            if batches is not None:
                yield from _calibration_requests(batches, max_message_bytes)

        return Profile.from_proto(self._stream_call("ProfileModel", self._profiles.ProfileModel,
                                                    stream(), timeout, cancel_on_error=True))

    def get_profile(self, model: str, weight_version: int = 0,
                    timeout: Optional[float] = CLIENT_TIMEOUT) -> Profile:
        """The kept profile of (model, weight version); 0: the model's newest.
        NOT_FOUND without one."""
        return Profile.from_proto(self._call(
            "GetProfile", self._profiles.GetProfile,
            profiles_pb2.GetProfileRequest(model=model, weight_version=weight_version), timeout))

    def list_profiles(self, model: str = "",
                      timeout: Optional[float] = CLIENT_TIMEOUT) -> List[Profile]:
        """Kept profiles, of one model or ("") of all, without their rows."""
        response = self._call("ListProfiles", self._profiles.ListProfiles,
                              profiles_pb2.ListProfilesRequest(model=model), timeout)
        return [Profile.from_proto(p) for p in response.profiles]

    def export_profile(self, model: str, weight_version: int = 0,
                       timeout: Optional[float] = CLIENT_TIMEOUT) -> str:
        """The profile as CSV text: a header row (mxserve.types.PROFILE_COLUMNS),
        then one row per layer and format."""
        return self._call(
            "ExportProfile", self._profiles.ExportProfile,
            profiles_pb2.ExportProfileRequest(model=model, weight_version=weight_version),
            timeout).csv

    def delete_profile(self, model: str, weight_version: int = 0,
                       timeout: Optional[float] = CLIENT_TIMEOUT) -> int:
        """Deletes a model's profile of one weight version (0: all of them); returns
        how many went."""
        return self._call(
            "DeleteProfile", self._profiles.DeleteProfile,
            profiles_pb2.DeleteProfileRequest(model=model, weight_version=weight_version),
            timeout).deleted

    def generate_policy(self, model: str, name: str, kind: str = "fraction", *,
                        fraction: PhaseValues = None, low: _wire.FormatLike = None,
                        high: _wire.FormatLike = None,
                        phases: Optional[Iterable[_wire.PhaseLike]] = None, score: str = "auto",
                        candidates: Union[None, _wire.FormatLike,
                                          Iterable[_wire.FormatLike]] = None,
                        metric: str = "energy", budget: PhaseValues = None,
                        relative_budget: PhaseValues = None, tolerance: PhaseValues = None,
                        groups: Iterable[str] = (), weight_version: int = 0,
                        dry_run: bool = False, description: str = "",
                        timeout: Optional[float] = CLIENT_TIMEOUT) -> GeneratedPolicy:
        """Turns the model's profile into policy `name` (Profiles.GeneratePolicy) and
        puts it, unless `dry_run`. Per generated phase:

        - kind="fraction": round(fraction · layers) layers, most tolerant first, in
          `low`, the rest in `high`.
        - kind="budget": least summed `score` with the summed `metric` cost per
          token ("energy", "time" or "bits") at most `budget`, or at most
          `relative_budget` times the all-`high` cost, choosing among `candidates`.
        - kind="tolerance": least summed cost with the summed score at most
          `tolerance`.

        fraction, budget, relative_budget and tolerance take one number for every
        generated phase or {phase: number}. phases: those to generate (default:
        the phases the values name, or all three); the others run every layer in
        `high` (default FP16), as do layers outside the profile. score: "auto"
        (fisher where profiled, else rel_error), "rel_error", "fisher" or "mse".
        groups: globs whose matches within one block share a format. An infeasible
        budget or bound is INVALID_ARGUMENT naming the least feasible one.
        """
        wire_kind = _wire.enum_value(profiles_pb2.GenerationKind, kind, "kind")
        kind_name = _wire.enum_name(profiles_pb2.GenerationKind, wire_kind)
        given = {field for field, value in (("fraction", fraction), ("budget", budget),
                                            ("relative_budget", relative_budget),
                                            ("tolerance", tolerance)) if value is not None}
        stray = sorted(given - _KIND_VALUES[kind_name])
        if stray:
            raise ValueError(f"{stray[0]}: not a value of kind {kind_name!r} (fraction takes "
                             "fraction; budget takes budget or relative_budget; tolerance "
                             "takes tolerance)")
        request = profiles_pb2.GeneratePolicyRequest(
            model=model, weight_version=weight_version, name=name, kind=wire_kind,
            phases=[_wire.phase_to_wire(p) for p in (phases or ())],
            score=_wire.enum_value(profiles_pb2.Score, score, "score"),
            fractions=_phase_values(fraction, "fraction"),
            low=_wire.format_to_wire(low), high=_wire.format_to_wire(high),
            candidates=_concrete_formats(candidates, "candidates"),
            metric=_wire.enum_value(profiles_pb2.CostMetric, metric, "metric"),
            budgets=_phase_values(budget if kind_name == "budget" else tolerance,
                                  "budget" if kind_name == "budget" else "tolerance"),
            relative_budgets=_phase_values(relative_budget, "relative_budget"),
            groups=[groups] if isinstance(groups, str) else list(groups),
            dry_run=dry_run, description=description)
        return GeneratedPolicy.from_proto(
            self._call("GeneratePolicy", self._profiles.GeneratePolicy, request, timeout))

    # --- telemetry -----------------------------------------------------------------------

    def report_power(self, samples: Iterable[Union[PowerSample, tuple]],
                     timeout: Optional[float] = None) -> PowerResult:
        """Streams power samples (PowerSample or (source, device, phase, timestamp,
        watts[, run])); the daemon integrates consecutive samples of a (source, device)
        by the trapezoid rule into the later sample's phase and run. A sample whose
        run is None carries the run of the `client.run(...)` scope this call is made
        in ("" for untagged). The iterable may be a generator that keeps producing
        while the stream is open."""
        # gRPC reads the generator on its own thread: the scope is this thread's.
        scope_run = self._run.get()

        def stream():
            for index, sample in enumerate(samples):
                s = sample if isinstance(sample, PowerSample) else PowerSample(*sample)
                run = _wire.run_to_wire(s.run if s.run is not None else scope_run,
                                        f"samples[{index}].run")
                yield telemetry_pb2.PowerSample(source=s.source, device=s.device,
                                                phase=_wire.phase_to_wire(s.phase),
                                                timestamp_seconds=s.timestamp, watts=s.watts,
                                                run=run)
        response = self._stream_call("ReportPower", self._telemetry.ReportPower, stream(),
                                     timeout)
        return PowerResult(samples_accepted=response.samples_accepted,
                           joules_added=response.joules_added)

    def report_energy(self, intervals: Iterable[Union[EnergyInterval, tuple]],
                      timeout: Optional[float] = None) -> EnergyResult:
        """Streams measured energy (Telemetry.ReportEnergy): each EnergyInterval (or
        (source, device, phase, start, end, joules[, run])) books its joules as they
        are, with end - start busy seconds, to its source, phase and run; nothing is
        integrated. Use it for an energy counter read at phase boundaries; report
        the same device's power samples (`report_power`) under another source (the
        GPU baseline uses "gpu_baseline" and "gpu_baseline_sampled"), or the two
        add up. The daemon refuses, ending the stream with INVALID_ARGUMENT naming
        `intervals[i]` and the field: labels outside 1-64 of [A-Za-z0-9_.:/-],
        times outside the last 24 h or over 60 s ahead, end < start or end - start
        > 3600 s, joules not finite, negative or over --max-power-watts × (end -
        start + 0.25 s), an interval starting before the previous one of its
        (source, device) in this stream ended; RESOURCE_EXHAUSTED past
        --max-power-series. Intervals before a refused one stay booked. A run of
        None is the `client.run(...)` scope's; the iterable may be a generator
        that keeps producing while the stream is open."""
        scope_run = self._run.get()  # gRPC reads the generator on its own thread

        def stream():
            for index, interval in enumerate(intervals):
                i = interval if isinstance(interval, EnergyInterval) else EnergyInterval(*interval)
                run = _wire.run_to_wire(i.run if i.run is not None else scope_run,
                                        f"intervals[{index}].run")
                yield telemetry_pb2.EnergyInterval(source=i.source, device=i.device,
                                                   phase=_wire.phase_to_wire(i.phase),
                                                   start_seconds=i.start, end_seconds=i.end,
                                                   joules=i.joules, run=run)
        response = self._stream_call("ReportEnergy", self._telemetry.ReportEnergy, stream(),
                                     timeout)
        return EnergyResult(intervals_accepted=response.intervals_accepted,
                            joules_added=response.joules_added)

    def report_work(self, calls: Sequence[WorkCall], *,
                    timeout: Optional[float] = CLIENT_TIMEOUT) -> ReportWorkResult:
        """Reports layer calls this process computed itself (Telemetry.ReportWork), so
        the daemon books the energy it would have booked running them: the same
        fpga_model joules and seconds, per phase and run, marked as emulated
        (EnergyEntry.emulated_requests). Send one list per PPO step or phase, in the
        order the calls ran (identical consecutive calls as one WorkCall with a
        count). Obviously wrong arguments raise ValueError naming `calls[i].<field>`
        before anything is sent. A list over the daemon's bounds (65,536 calls or
        counts summing past 2^22 per message) or over max_message_bytes goes as
        several messages, in order; the daemon books each message whole or not at
        all (MxserveError naming the field), and the messages sent before a refused
        one stay booked. The model's layers must be registered; its weights need not
        be uploaded."""
        requests = _work_requests(calls, self._run.get(),
                                  self.max_message_bytes - ENVELOPE_BYTES)
        if not requests:
            raise ValueError("calls: expected at least one WorkCall")
        total_calls, joules, seconds = 0, 0.0, 0.0
        for request in requests:
            response = self._call("ReportWork", self._telemetry.ReportWork, request, timeout)
            total_calls += response.calls
            joules += response.model_joules
            seconds += response.model_seconds
        return ReportWorkResult(calls=total_calls, model_joules=joules, model_seconds=seconds)

    def energy_report(self, since: float = 0.0, run: Optional[str] = None, *,
                      by_model: bool = False,
                      timeout: Optional[float] = CLIENT_TIMEOUT) -> EnergyReport:
        """Joules, busy seconds and requests per source and phase (since a Unix time;
        0 = since the daemon started), of one run (`run`, e.g. `client.current_run`)
        or of every run together (None or ""; the `client.run(...)` scope does not
        apply here). A run the daemon does not hold gives no entries. `by_model`:
        per model instead (entries' `model`), every run together, since start."""
        if since is None:  # protobuf took None as "unset" (0: since the start)
            since = 0.0
        if isinstance(since, bool) or not isinstance(since, numbers.Real) or \
                not 0 <= since < float("inf"):
            raise ValueError(f"since: expected a Unix time in seconds >= 0 (0: since the "
                             f"daemon started), got {since!r}")
        request = telemetry_pb2.GetEnergyReportRequest(since_seconds=float(since),
                                                       run=_wire.run_to_wire(run),
                                                       by_model=by_model)
        response = self._call("GetEnergyReport", self._telemetry.GetEnergyReport, request,
                              timeout)
        return EnergyReport(
            entries=tuple(
                EnergyEntry(source=e.source, phase=_wire.phase_name(e.phase), joules=e.joules,
                            busy_seconds=e.busy_seconds, requests=e.requests,
                            emulated_requests=e.emulated_requests, model=e.model)
                for e in response.entries),
            since_seconds=response.since_seconds, until_seconds=response.until_seconds,
            run=response.run)
