"""Streams: StreamSession, many compute calls pipelined on one Compute.Stream, and
_Requests, the request iterator of the client-streaming calls."""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterable, Optional

import grpc

from mxserve._errors import MxserveError, _status_code
from mxserve.types import BackwardResult, ComputeResult
from mxserve.v1 import compute_pb2


class _Requests:
    """Wraps a request generator so an exception raised while producing a request
    (a bad tensor, a bad sample) reaches the caller as itself: gRPC would swallow it
    into UNKNOWN "Exception iterating requests!". The stream ends where it failed:
    half-closed, so the daemon answers what it got, or with `cancel_on_error`
    cancelled first (once `bind` gave the call), so it keeps nothing of a stream
    cut short (a profile of some of the calibration data)."""

    def __init__(self, generator: Iterable, cancel_on_error: bool = False):
        self._generator = iter(generator)
        self._cancel_on_error = cancel_on_error
        self._bound = threading.Event()
        self._call: Any = None
        self.error: Optional[BaseException] = None

    def bind(self, call: Any) -> None:
        """The call consuming these requests, which an error cancels."""
        self._call = call
        self._bound.set()

    def __iter__(self) -> "_Requests":
        return self

    def __next__(self):
        if self.error is not None:
            raise StopIteration
        try:
            return next(self._generator)
        except StopIteration:
            raise
        except Exception as error:
            self.error = error
            if self._cancel_on_error:
                self._bound.wait()  # bind() follows the call's creation at once
                self._call.cancel()
            raise StopIteration from None

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


_CLOSE = object()


class StreamSession:
    """Many compute calls pipelined on one Compute.Stream.

        with client.session() as s:
            futures = [s.forward("m", "fc1", x) for x in batches]
            outputs = [f.result().output for f in futures]

    Each call returns a concurrent.futures.Future right away; at most
    `max_in_flight` wait for answers (submitting more blocks). A failed request
    fails its own future with MxserveError; the stream goes on. Phases and runs are
    taken from the submitting thread's `client.phase(...)` and `client.run(...)`
    scopes at submit time (an explicit `phase=` or `run=` wins). Futures
    run their done-callbacks on the session's reader thread: a callback must not
    submit to the same session (it could wait for a slot only it would free).
    """

    def __init__(self, client: Any, max_in_flight: int = 64, timeout: Optional[float] = None):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight: expected >= 1, got {max_in_flight}")
        self._client = client
        self._outbox: "queue.Queue" = queue.Queue()
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._pending: Dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._broken: Optional[MxserveError] = None
        self._closed = False
        # The client's checks (open, a sane timeout); None stays no deadline.
        self._responses = client._compute.Stream(
            self._requests(), timeout=client._deadline("Stream", timeout))
        self._reader = threading.Thread(target=self._read, name="mxserve-stream", daemon=True)
        self._reader.start()

    def _requests(self):
        while True:
            item = self._outbox.get()
            if item is _CLOSE:
                return
            yield item

    def _read(self) -> None:
        error = MxserveError(grpc.StatusCode.CANCELLED, "the stream ended", "Stream")
        try:
            for response in self._responses:
                with self._lock:
                    future, decode, like = self._pending.pop(response.request_id, (None,) * 3)
                if future is None:
                    continue
                self._slots.release()
                if response.status_code != 0:
                    future.set_exception(MxserveError(_status_code(response.status_code),
                                                      response.status_message, "Stream"))
                    continue
                try:
                    future.set_result(decode(response, like))
                except Exception as decode_error:  # a malformed answer fails its own request
                    future.set_exception(decode_error)
        except grpc.RpcError as rpc_error:
            error = MxserveError(rpc_error.code(), rpc_error.details() or "", "Stream")
        except Exception as unexpected:  # never leave futures hanging
            error = MxserveError(grpc.StatusCode.INTERNAL, f"stream reader failed: {unexpected!r}",
                                 "Stream")
        finally:
            with self._lock:
                self._broken = error
                pending, self._pending = self._pending, {}
            for future, _, _ in pending.values():
                future.set_exception(error)
                self._slots.release()

    def _submit(self, field: str, op: Any, decode: Callable, like: Any) -> Future:
        if self._closed:
            raise RuntimeError("the session is closed")
        self._slots.acquire()
        future: Future = Future()
        future.set_running_or_notify_cancel()  # sent at once: it can no longer be cancelled
        with self._lock:
            if self._broken is not None:
                self._slots.release()
                raise self._broken
            request_id = next(self._ids)
            self._pending[request_id] = (future, decode, like)
        self._outbox.put(compute_pb2.StreamRequest(request_id=request_id, **{field: op}))
        return future

    def gemm(self, a, b, format, format_b=None, *, phase=None, rounding="even",
             run=None, scale_rule=None, seed=None) -> Future:
        op = self._client._gemm_request(a, b, format, format_b, phase, rounding, run, scale_rule,
                                        seed)
        return self._submit("gemm", op,
                            lambda r, like: ComputeResult.from_proto(r.gemm.c, r.gemm.info, like),
                            a)

    def forward(self, model, layer, x, *, format=None, phase=None, min_weight_version=0,
                run=None, scale_rule=None, rounding=None, seed=None) -> Future:
        op = self._client._forward_request(model, layer, x, format, phase, min_weight_version,
                                           run, scale_rule, rounding, seed)
        return self._submit("forward", op,
                            lambda r, like: ComputeResult.from_proto(r.forward.output,
                                                                     r.forward.info, like), x)

    def backward(self, model, layer, grad_output, input=None, *, format=None, phase=None,
                 min_weight_version=0, run=None, scale_rule=None, rounding=None,
                 seed=None) -> Future:
        op = self._client._backward_request(model, layer, grad_output, input, format, phase,
                                            min_weight_version, run, scale_rule=scale_rule,
                                            rounding=rounding, seed=seed)
        return self._submit("backward", op,
                            lambda r, like: BackwardResult.from_proto(r.backward, like),
                            grad_output)

    def close(self) -> None:
        """Half-closes the stream and waits for every outstanding answer."""
        if not self._closed:
            self._closed = True
            self._outbox.put(_CLOSE)
        self._reader.join()

    def cancel(self) -> None:
        """Ends the stream now; outstanding futures fail with CANCELLED."""
        self._closed = True
        self._responses.cancel()
        self._outbox.put(_CLOSE)
        self._reader.join()

    def __enter__(self) -> "StreamSession":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()
