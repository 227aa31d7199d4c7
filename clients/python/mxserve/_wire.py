"""Names and tensors on the wire: enum names, phases, formats, run tags, and arrays ↔
mxserve.v1.Tensor.

Every enum of mxserve.v1 has names by one rule, the C++ side's too (proto/convert;
tests/test_enums.py compares them): a value's name is its proto name lower-cased
without the enum's prefix, which is the enum's type name in UPPER_SNAKE_CASE and
"_" (Phase: PHASE_ROLLOUT → "rollout"; Score: SCORE_REL_ERROR → "rel_error";
CostMetric: COST_METRIC_ENERGY → "energy"; DType: DTYPE_FP32 → "fp32"). Formats
are the one exception in spelling: upper case ("MXFP8_E4M3"), as mx/ and mxctl
write them.

Arrays cross as raw little-endian bytes through the buffer protocol: one copy into
the request, one copy out of the response, no Python loop over elements.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Dict, Iterable, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np

from mxserve.v1 import common_pb2 as pb

# --- enums ---------------------------------------------------------------------------

# A generated enum (common_pb2.Phase) or its EnumDescriptor.
EnumType = Any


class _Enum(NamedTuple):
    type_name: str                # "CostMetric"
    prefix: str                   # "COST_METRIC_"
    noun: str                     # "cost metric", for messages
    names: Dict[int, str]         # number → name, in declaration order
    unspecified: Optional[int]    # the number of <prefix>UNSPECIFIED, if declared


_ENUMS: Dict[str, _Enum] = {}


def enum_prefix(enum_type: EnumType) -> str:
    """The enum's type name in UPPER_SNAKE_CASE and "_": an underscore before each
    capital that follows a lower-case letter or a digit (CostMetric → COST_METRIC_,
    DType → DTYPE_)."""
    name = getattr(enum_type, "DESCRIPTOR", enum_type).name
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper() + "_"


def _enum(enum_type: EnumType) -> _Enum:
    descriptor = getattr(enum_type, "DESCRIPTOR", enum_type)
    known = _ENUMS.get(descriptor.full_name)
    if known is None:
        prefix = enum_prefix(descriptor)
        names = {v.number: (v.name[len(prefix):] if v.name.startswith(prefix) else v.name).lower()
                 for v in descriptor.values}
        unspecified = descriptor.values_by_name.get(prefix + "UNSPECIFIED")
        known = _ENUMS[descriptor.full_name] = _Enum(
            descriptor.name, prefix, prefix[:-1].lower().replace("_", " "), names,
            None if unspecified is None else unspecified.number)
    return known


def enum_name(enum_type: EnumType, number: int) -> str:
    """A wire value's name by the rule ("rollout", "unspecified"); one outside the
    enum is "<type name lower-cased>#N" ("phase#7", "profilesource#9"), as in C++."""
    e = _enum(enum_type)
    return e.names.get(number, f"{e.type_name.lower()}#{number}")


def enum_numbers(enum_type: EnumType, *, skip_unspecified: bool = True) -> Dict[str, int]:
    """{name: number} in declaration order, without <PREFIX>UNSPECIFIED unless asked."""
    e = _enum(enum_type)
    return {name: number for number, name in e.names.items()
            if not (skip_unspecified and number == e.unspecified)}


def enum_names(enum_type: EnumType, *, skip_unspecified: bool = True) -> Tuple[str, ...]:
    """The names, in declaration order: enum_names(common_pb2.Phase) is
    ("rollout", "reward", "update")."""
    return tuple(enum_numbers(enum_type, skip_unspecified=skip_unspecified))


def either(words: Iterable[Any]) -> str:
    """"a", "a or b", "a, b or c": the names a message says it expected."""
    words = [str(w) for w in words]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def enum_value(enum_type: EnumType, value: Union[str, int], field: str, *,
               unspecified: bool = False, aliases: Optional[Mapping[str, str]] = None) -> int:
    """A name (short or full, any case: "rel_error", "SCORE_REL_ERROR"), an alias
    (aliases maps lower-case alias → name) or a wire value → the wire value.
    <PREFIX>UNSPECIFIED is refused unless `unspecified`. Anything else raises
    ValueError naming `field` and the names it takes: "phase: unknown phase
    'warmup'; expected rollout, reward or update", "phase: unknown wire value 7;
    expected 1, 2 or 3"."""
    e = _enum(enum_type)
    choices = enum_numbers(enum_type, skip_unspecified=not unspecified)
    if isinstance(value, (int, np.integer)):
        if value in choices.values():
            return int(value)
        raise ValueError(f"{field}: unknown wire value {value}; expected "
                         f"{either(choices.values())}")
    aliases = aliases or {}
    name = str(value).lower()
    name = aliases.get(name, name)
    if name not in choices and name.startswith(e.prefix.lower()):
        name = name[len(e.prefix):]
    if name in choices:
        return choices[name]
    raise ValueError(f"{field}: unknown {e.noun} {value!r}; expected "
                     f"{either([*choices, *aliases])}")


# --- phases, formats, runs ----------------------------------------------------------

PHASES = enum_names(pb.Phase)  # ("rollout", "reward", "update")
_PHASE_TO_WIRE = enum_numbers(pb.Phase)
_WIRE_TO_PHASE = {v: k for k, v in _PHASE_TO_WIRE.items()}

# Canonical names, as mx/ and mxctl spell them (the rule's, upper case), in wire
# order (FORMAT_* = index + 1).
FORMATS = tuple(name.upper() for name in enum_names(pb.Format))
_FORMAT_ALIASES = {"MXFP8": "MXFP8_E4M3", "MXFP6": "MXFP6_E2M3", "MXFP4": "MXFP4_E2M1"}
_POLICY_WORDS = ("", "POLICY", "AUTO")

# A run tag: the daemon's rule for client-chosen labels (server/base/label.h).
_RUN_TAG = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")

PhaseLike = Union[str, int]
FormatLike = Union[None, str, int]


def phase_to_wire(phase: Optional[PhaseLike]) -> int:
    """'rollout' | 'reward' | 'update' (any case, 'PHASE_' prefix allowed) or a wire value.

    None becomes PHASE_UNSPECIFIED, which the daemon rejects with a message naming
    the field; compute calls fill it from `Client.phase(...)` first.
    """
    if phase is None:
        return pb.PHASE_UNSPECIFIED
    return enum_value(pb.Phase, phase, "phase")


def run_to_wire(run: Optional[str], field: str = "run") -> str:
    """A run tag as requests carry it: None or '' (untagged) become '', anything
    else must be 1-64 characters of [A-Za-z0-9_.:/-], the daemon's rule, checked
    here so that a bad tag fails before anything is sent."""
    if run is None or run == "":
        return ""
    if not isinstance(run, str) or not _RUN_TAG.fullmatch(run):
        raise ValueError(f"{field}: expected 1-64 characters of [A-Za-z0-9_.:/-], got {run!r}")
    return run


def phase_name(wire: int) -> str:
    return enum_name(pb.Phase, wire)


# Rounding's names as the client's arguments and the emulator take them.
_ROUNDING_WORDS = {"nearest_even": "even", "nearest_away": "away"}


def rounding_name(wire: int) -> str:
    """"even", "away" or "stochastic" (what `rounding=` arguments take)."""
    name = enum_name(pb.Rounding, wire)
    return _ROUNDING_WORDS.get(name, name)


def scale_rule_name(wire: int) -> str:
    """"floor", "no_saturation", "ceil" or "rceil"; SCALE_RULE_UNSPECIFIED (a daemon
    that does not say) is "floor", the rule it then applies."""
    return "floor" if wire == pb.SCALE_RULE_UNSPECIFIED else enum_name(pb.ScaleRule, wire)


def format_to_wire(fmt: FormatLike) -> int:
    """A format name (case-insensitive; 'MXFP8', 'MXFP6', 'MXFP4' as shorthands) or
    wire value; None, '' or 'policy' leave the choice to the model's policy."""
    if fmt is None:
        return pb.FORMAT_UNSPECIFIED
    if isinstance(fmt, int):
        if not 0 <= fmt <= len(FORMATS):
            raise ValueError(f"format: unknown wire value {fmt}; expected 0..{len(FORMATS)}")
        return fmt
    name = str(fmt).upper()
    if name.startswith("FORMAT_"):
        name = name[len("FORMAT_"):]
    if name in _POLICY_WORDS:
        return pb.FORMAT_UNSPECIFIED
    name = _FORMAT_ALIASES.get(name, name)
    if name not in FORMATS:
        raise ValueError(f"format: unknown format {fmt!r}; expected one of {', '.join(FORMATS)} "
                         "(or MXFP8, MXFP6, MXFP4, or None for the policy's choice)")
    return FORMATS.index(name) + 1


def format_name(wire: int) -> str:
    """The canonical name of a wire format; 'policy' for FORMAT_UNSPECIFIED."""
    if wire == pb.FORMAT_UNSPECIFIED:
        return "policy"
    if 1 <= wire <= len(FORMATS):
        return FORMATS[wire - 1]
    return f"format#{wire}"


# --- tensors -------------------------------------------------------------------------

_NUMPY_DTYPES = {pb.DTYPE_FP32: np.dtype("<f4"), pb.DTYPE_FP16: np.dtype("<f2"),
                 pb.DTYPE_BF16: np.dtype("<u2")}  # BF16: the raw 16-bit codes


def _torch_module():
    # torch is optional for the core client: only look at it when already imported.
    return sys.modules.get("torch")


def is_torch(value: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


def check_numeric(value: Any, field: str) -> None:
    """Raises TypeError unless `value` converts to a real numeric tensor (no copy)."""
    if is_torch(value):
        if value.dtype.is_complex:
            raise TypeError(f"{field}: expected a real tensor, got {value.dtype}")
        return
    kind = np.asarray(value).dtype.kind
    if kind not in "fiub":
        raise TypeError(f"{field}: expected a numeric array, got dtype "
                        f"{np.asarray(value).dtype}")


def to_tensor(value: Any, field: str = "tensor") -> pb.Tensor:
    """A numpy array, torch tensor or nested sequence → Tensor.

    float32, float16 and (torch) bfloat16 travel as they are; every other numeric
    type is converted to float32 first. Torch tensors may live on any device.
    """
    if is_torch(value):
        return _torch_to_tensor(value, field)
    array = np.asarray(value)
    if array.dtype == np.float16:
        array = np.ascontiguousarray(array, dtype="<f2")
        dtype = pb.DTYPE_FP16
    else:
        check_numeric(array, field)
        array = np.ascontiguousarray(array, dtype="<f4")
        dtype = pb.DTYPE_FP32
    return pb.Tensor(shape=array.shape, dtype=dtype, data=array.tobytes())


def _torch_to_tensor(value, field: str) -> pb.Tensor:
    torch = _torch_module()
    check_numeric(value, field)
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        codes = t.contiguous().view(torch.int16).numpy()
        return pb.Tensor(shape=t.shape, dtype=pb.DTYPE_BF16, data=codes.astype("<i2").tobytes())
    if t.dtype == torch.float16:
        return pb.Tensor(shape=t.shape, dtype=pb.DTYPE_FP16,
                         data=t.contiguous().numpy().astype("<f2", copy=False).tobytes())
    array = t.to(torch.float32).contiguous().numpy()
    return pb.Tensor(shape=t.shape, dtype=pb.DTYPE_FP32, data=array.astype("<f4", copy=False).tobytes())


def widen_bf16(data: bytes) -> np.ndarray:
    """Little-endian BF16 bytes as float32, exactly (the bits, 16 places up)."""
    return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def from_tensor(tensor: pb.Tensor, like: Any = None):
    """Tensor → a writable numpy float array (float32, or float16 for FP16), or a CPU
    torch tensor when `like` is one. BF16 is widened to float32 exactly."""
    if tensor.dtype not in _NUMPY_DTYPES:
        raise ValueError(f"response tensor has dtype {tensor.dtype}; expected FP32, FP16 or BF16")
    shape = tuple(tensor.shape)
    if tensor.dtype == pb.DTYPE_BF16:
        array = widen_bf16(tensor.data)
    else:
        array = np.frombuffer(tensor.data, dtype=_NUMPY_DTYPES[tensor.dtype])
        array = array.astype(array.dtype.newbyteorder("="), copy=True)
    array = array.reshape(shape)
    if is_torch(like):
        return _torch_module().from_numpy(array)
    return array
