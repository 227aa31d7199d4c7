"""mxserve.safetensors_io and mxserve.models: the file format against the spec, and
GPT-2 / Qwen2 against naive float64 implementations written here, on tiny
checkpoints the tests write themselves in Hugging Face's layout."""

import json
import math
import struct

import pytest

torch = pytest.importorskip("torch")

from mxserve import models  # noqa: E402
from mxserve.models import (KVCache, ModelConfig, apply_rotary, build_model,  # noqa: E402
                            load_pretrained, rotary_embedding, save_pretrained)
from mxserve.safetensors_io import (read_safetensors, read_safetensors_header,  # noqa: E402
                                    write_safetensors)

VOCAB = 50


def raw_safetensors(path, header: dict, data: bytes, header_size=None):
    """A safetensors file from its parts, written without the module under test."""
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded) if header_size is None else header_size))
        f.write(encoded)
        f.write(data)


# --- safetensors -------------------------------------------------------------------

def test_safetensors_reads_a_file_built_by_hand(tmp_path):
    # Two F32 values 1.5, -2 and one I64 7, laid out per the spec.
    data = struct.pack("<2f", 1.5, -2.0) + struct.pack("<q", 7)
    raw_safetensors(tmp_path / "a.safetensors",
                    {"x": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]},
                     "n": {"dtype": "I64", "shape": [], "data_offsets": [8, 16]},
                     "__metadata__": {"format": "pt"}}, data)
    tensors = read_safetensors(tmp_path / "a.safetensors")
    assert tensors["x"].tolist() == [[1.5], [-2.0]]
    assert tensors["n"].dtype == torch.int64 and tensors["n"].shape == () and tensors["n"] == 7
    assert read_safetensors_header(tmp_path / "a.safetensors").metadata == {"format": "pt"}


def test_safetensors_round_trips_every_dtype(tmp_path):
    tensors = {
        "f64": torch.randn(3, 2, dtype=torch.float64),
        "f32": torch.randn(4),
        "f16": torch.randn(2, 3).half(),
        "bf16": torch.randn(5, 1).bfloat16(),
        "i64": torch.tensor([-(2 ** 40), 3]),
        "i32": torch.tensor([[1, -2]], dtype=torch.int32),
        "i16": torch.tensor([-300], dtype=torch.int16),
        "i8": torch.tensor([-5, 5], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
        "strided": torch.arange(12.0).view(3, 4).t(),  # not contiguous
    }
    path = tmp_path / "all.safetensors"
    write_safetensors(path, tensors, metadata={"who": "test"})
    header_size = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert header_size % 8 == 0
    back = read_safetensors(path)
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert read_safetensors_header(path).metadata == {"who": "test"}


GOOD = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, data, header_size, message", [
    ({"w": GOOD}, b"\0" * 8, 10 ** 6, r"header length 1000000 is beyond"),
    ({"w": GOOD}, b"\0" * 8, 2 ** 40, r"header length"),
    (None, b"", None, r"not valid UTF-8 JSON"),
    ([1, 2], b"", None, r"JSON list, expected an object"),
    ({"w": {**GOOD, "dtype": "F8"}}, b"\0" * 8, None, r"'w': unknown dtype 'F8'"),
    ({"w": {**GOOD, "shape": [-2]}}, b"\0" * 8, None, r"'w': shape \[-2\]"),
    ({"w": {**GOOD, "shape": [2.0]}}, b"\0" * 8, None, r"'w': shape"),
    ({"w": {**GOOD, "data_offsets": [0, 16]}}, b"\0" * 8, None,
     r"'w': data_offsets \[0, 16\] lie outside the data buffer of 8 bytes"),
    ({"w": {**GOOD, "data_offsets": [4, 0]}}, b"\0" * 8, None, r"'w': data_offsets"),
    ({"w": {**GOOD, "shape": [3]}}, b"\0" * 12, None, r"'w': .* hold 8 bytes, but shape"),
    ({"w": {**GOOD, "extra": 1}}, b"\0" * 8, None, r"'w': header entry has keys"),
    ({"w": GOOD, "__metadata__": {"a": 1}}, b"\0" * 8, None, r"__metadata__"),
])
def test_safetensors_rejects_a_corrupt_header(tmp_path, header, data, header_size, message):
    path = tmp_path / "bad.safetensors"
    if header is None:  # a header that is not JSON
        path.write_bytes(struct.pack("<Q", 5) + b"{nope" + data)
    else:
        raw_safetensors(path, header, data, header_size)
    with pytest.raises(ValueError, match=message) as error:
        read_safetensors(path)
    assert str(path) in str(error.value)


def test_safetensors_rejects_a_truncated_file_and_duplicate_names(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\1\0\0")
    with pytest.raises(ValueError, match="too short"):
        read_safetensors(path)
    header = b'{"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"w":{}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ValueError, match="duplicate key 'w'"):
        read_safetensors(path)
