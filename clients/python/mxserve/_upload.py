"""Models.UploadWeights' request stream: each layer's weight and bias cut into chunks."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

from mxserve import _wire
from mxserve.v1 import common_pb2, models_pb2


def _split_weights(value: Any):
    """{layer: W} | {layer: (W, b)} | {layer: {"weight": W, "bias": b}} → (W, b or None)."""
    if isinstance(value, Mapping):
        return value["weight"], value.get("bias")
    if isinstance(value, tuple):
        weight, bias = value
        return weight, bias
    return value, None


def _chunks(model: str, layer: str, role: int, value: Any, chunk_bytes: int
            ) -> Iterator[models_pb2.WeightChunk]:
    tensor = _wire.to_tensor(value, f"{layer}.{_wire.enum_name(models_pb2.TensorRole, role)}")
    itemsize = 4 if tensor.dtype == common_pb2.DTYPE_FP32 else 2
    step = max(1, chunk_bytes // itemsize) * itemsize
    data = memoryview(tensor.data)
    offset = 0
    while True:  # an empty tensor still sends one chunk, so the daemon sees it
        piece = data[offset:offset + step]
        # The first chunk says the shape: the daemon refuses one that is not the
        # layer's (a transposed W has the right element count).
        yield models_pb2.WeightChunk(model=model, layer=layer, role=role, dtype=tensor.dtype,
                                     offset_elements=offset // itemsize, data=bytes(piece),
                                     shape=list(tensor.shape) if offset == 0 else [])
        offset += step
        if offset >= len(data):
            return


def _upload_stream(model: str, weights: Mapping[str, Any], publish: bool, chunk_bytes: int,
                   warm_up: Optional[models_pb2.WarmUp] = None
                   ) -> Iterator[models_pb2.WeightChunk]:
    """{layer: W} | {layer: (W, b)} | {layer: {"weight": W, "bias": b}} → the chunks
    of one UploadWeights stream, the last one carrying `publish`. Every tensor is
    checked before this returns: a stream that ended early on the client's side
    would still complete, and stage what it had carried."""
    tensors = []
    for layer, value in weights.items():
        weight, bias = _split_weights(value)
        for role, tensor in ((models_pb2.TENSOR_ROLE_WEIGHT, weight),
                             (models_pb2.TENSOR_ROLE_BIAS, bias)):
            if tensor is not None:
                name = _wire.enum_name(models_pb2.TensorRole, role)  # "weight", "bias"
                _wire.check_numeric(tensor, f"{layer}.{name}")
                tensors.append((layer, role, tensor))

    def stream():
        first = True
        last = None
        for layer, role, tensor in tensors:
            for chunk in _chunks(model, layer, role, tensor, chunk_bytes):
                if first and warm_up is not None:  # the daemon reads the first chunk's
                    chunk.warm_up.CopyFrom(warm_up)
                first = False
                if last is not None:
                    yield last
                last = chunk
        if last is None:  # nothing to upload: one empty chunk names the model
            last = models_pb2.WeightChunk(model=model)
            if warm_up is not None:
                last.warm_up.CopyFrom(warm_up)
        last.publish = publish
        yield last

    return stream()
