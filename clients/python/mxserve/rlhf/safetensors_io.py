"""Reads and writes the safetensors format in plain Python, numpy and torch.

A safetensors file is an 8-byte little-endian header length N, N bytes of a JSON
object, then one data buffer:

    {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
     "__metadata__": {"key": "value"}}

with each tensor's bytes at buffer[begin:end], little-endian, row-major. Model files
come from elsewhere, so the reader treats them as hostile: every field is checked
before any tensor is built, and every error is a ValueError naming the file and,
where there is one, the tensor.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

import numpy as np
import torch

# The longest header accepted: real headers are kilobytes to a few megabytes.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype name -> (torch dtype, little-endian numpy dtype it is read as).
# BF16 has no numpy dtype: its bits are read as int16 and reinterpreted by torch.
DTYPES: Dict[str, Tuple[torch.dtype, np.dtype]] = {
    "F64": (torch.float64, np.dtype("<f8")),
    "F32": (torch.float32, np.dtype("<f4")),
    "F16": (torch.float16, np.dtype("<f2")),
    "BF16": (torch.bfloat16, np.dtype("<i2")),
    "I64": (torch.int64, np.dtype("<i8")),
    "I32": (torch.int32, np.dtype("<i4")),
    "I16": (torch.int16, np.dtype("<i2")),
    "I8": (torch.int8, np.dtype("i1")),
    "U8": (torch.uint8, np.dtype("u1")),
    "BOOL": (torch.bool, np.dtype("?")),
}
_NAMES_BY_TORCH_DTYPE = {torch_dtype: name for name, (torch_dtype, _) in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """One header entry: where a tensor's bytes lie in the data buffer."""
    dtype: str
    shape: Tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked header: its tensors, its metadata, and where the data buffer starts."""
    tensors: Dict[str, TensorInfo]
    metadata: Dict[str, str]
    data_start: int


def _reject_duplicate_keys(pairs):
    """json object_pairs_hook: a name given twice would make the file ambiguous."""
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_entry(file: str, name: str, entry, buffer_size: int) -> TensorInfo:
    def bad(what: str) -> ValueError:
        return ValueError(f"{file}: tensor {name!r}: {what}")

    if not isinstance(entry, dict):
        raise bad("header entry is not a JSON object")
    if set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad(f"header entry has keys {sorted(entry)}, expected "
                  "['data_offsets', 'dtype', 'shape']")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise bad(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))):
        raise bad(f"data_offsets {offsets!r} is not a pair of integers")
    begin, end = offsets
    if not 0 <= begin <= end <= buffer_size:
        raise bad(f"data_offsets [{begin}, {end}] lie outside the data buffer "
                  f"of {buffer_size} bytes")
    expected = math.prod(shape) * DTYPES[dtype][1].itemsize
    if end - begin != expected:
        raise bad(f"data_offsets [{begin}, {end}] hold {end - begin} bytes, but shape "
                  f"{shape} of {dtype} needs {expected}")
    return TensorInfo(dtype, tuple(shape), begin, end)


def read_safetensors_header(path: os.PathLike | str) -> SafetensorsHeader:
    """Reads and checks a file's header without reading its tensors.

    Raises FileNotFoundError for a missing file and ValueError, naming the file and
    the tensor, for anything malformed: a header length beyond the file or
    MAX_HEADER_BYTES, a header that is not a UTF-8 JSON object, an unknown dtype, a
    shape that is not a list of non-negative integers, or data offsets that are out
    of the buffer or disagree with the shape.
    """
    file = os.fspath(path)
    file_size = os.path.getsize(file)
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{file}: {file_size} bytes is too short for a safetensors "
                             "file (it starts with an 8-byte header length)")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > MAX_HEADER_BYTES or 8 + header_size > file_size:
            raise ValueError(f"{file}: header length {header_size} is beyond the file's "
                             f"{file_size} bytes or the limit of {MAX_HEADER_BYTES}")
        raw = f.read(header_size)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{file}: the header is not valid UTF-8 JSON: {error}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: the header is a JSON {type(header).__name__}, "
                         "expected an object")
    metadata = header.pop("__metadata__", {})
    if not (isinstance(metadata, dict)
            and all(isinstance(v, str) for v in metadata.values())):
        raise ValueError(f"{file}: __metadata__ is not an object of strings")
    data_start = 8 + header_size
    buffer_size = file_size - data_start
    tensors = {name: _check_entry(file, name, entry, buffer_size)
               for name, entry in header.items()}
    return SafetensorsHeader(tensors, metadata, data_start)


def read_safetensors(path: os.PathLike | str) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, on the CPU, each in its own memory.

    The header is checked first (see read_safetensors_header), so a malformed file
    raises ValueError before any tensor is read.
    """
    header = read_safetensors_header(path)
    with open(path, "rb") as f:
        f.seek(header.data_start)
        buffer = f.read()
    tensors = {}
    for name, info in header.tensors.items():
        torch_dtype, np_dtype = DTYPES[info.dtype]
        count = (info.end - info.begin) // np_dtype.itemsize
        # astype copies: the bytes may be unaligned, the copy is aligned, in native
        # byte order and writable.
        array = np.frombuffer(buffer, dtype=np_dtype, count=count, offset=info.begin)
        tensor = torch.from_numpy(array.astype(np_dtype.newbyteorder("=")))
        if info.dtype == "BF16":
            tensor = tensor.view(torch.bfloat16)
        tensors[name] = tensor.reshape(info.shape)
    return tensors


def write_safetensors(path: os.PathLike | str, tensors: Mapping[str, torch.Tensor],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors (any device, any layout) to a safetensors file, sorted by name.

    The header is padded with spaces to a multiple of 8 bytes so that every tensor
    starting at an 8-byte multiple stays aligned when the file is mapped.
    """
    header: Dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError(f"{os.fspath(path)}: metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    blobs = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        if tensor.dtype not in _NAMES_BY_TORCH_DTYPE:
            raise ValueError(f"{os.fspath(path)}: tensor {name!r} has dtype {tensor.dtype}, "
                             "which safetensors_io does not write")
        bits = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
        blob = bits.numpy().tobytes()
        header[name] = {"dtype": _NAMES_BY_TORCH_DTYPE[tensor.dtype],
                        "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)
