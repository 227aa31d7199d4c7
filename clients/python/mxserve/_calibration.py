"""Profiles.ProfileModel's calibration data as messages: each (layer, inputs,
output_grads) item's rows split so that no message holds more than about a bound."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np

from mxserve import _wire
from mxserve.v1 import profiles_pb2

# ProfileModel calibration messages: well under the daemon's message limit, so one
# message never holds much of a layer's rows in memory on either side.
DEFAULT_CALIBRATION_BYTES = 16 << 20


def _calibration_matrix(value: Any) -> Any:
    """A calibration tensor as rows: torch tensors stay torch (any device), the rest
    become numpy; more than two dimensions flatten into rows of the last one."""
    matrix = value if _wire.is_torch(value) else np.asarray(value)
    if matrix.ndim > 2:
        matrix = matrix.reshape(-1, matrix.shape[-1])
    return matrix


def _row_bytes(matrix: Any) -> int:
    """Bytes one row takes on the wire: 16-bit floats travel as they are, the rest
    as float32 (as _wire.to_tensor sends them)."""
    if _wire.is_torch(matrix):
        half = matrix.dtype.is_floating_point and matrix.element_size() == 2
    else:
        half = matrix.dtype == np.float16
    return (2 if half else 4) * matrix.shape[-1]


def _calibration_request(index: int, layer: Any, x: Any, g: Any) -> profiles_pb2.ProfileRequest:
    batch = profiles_pb2.CalibrationBatch(
        layer=str(layer), inputs=_wire.to_tensor(x, f"batches[{index}].inputs"))
    if g is not None:
        batch.output_grads.CopyFrom(_wire.to_tensor(g, f"batches[{index}].output_grads"))
    return profiles_pb2.ProfileRequest(batch=batch)


def _calibration_requests(batches: Iterable[Any], max_bytes: int
                          ) -> Iterator[profiles_pb2.ProfileRequest]:
    """(layer, inputs, output_grads or None) items → CalibrationBatch messages, each
    item's rows split so that a message carries at most about `max_bytes`. An item
    whose shapes do not line up goes whole: the daemon names what is wrong."""
    for index, item in enumerate(batches):
        layer, inputs, *rest = item
        grads = rest[0] if rest else None
        x = _calibration_matrix(inputs)
        g = None if grads is None else _calibration_matrix(grads)
        aligned = x.ndim == 2 and x.shape[0] > 0 and \
            (g is None or (g.ndim == 2 and g.shape[0] == x.shape[0]))
        if not aligned:
            yield _calibration_request(index, layer, x, g)
            continue
        step = max(1, max_bytes // max(1, _row_bytes(x) + (0 if g is None else _row_bytes(g))))
        for start in range(0, x.shape[0], step):
            yield _calibration_request(index, layer, x[start:start + step],
                                       None if g is None else g[start:start + step])
