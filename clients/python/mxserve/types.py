"""Plain result types: what the daemon's responses mean, without protobuf in the way."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from mxserve import _wire


@dataclass(frozen=True)
class LayerSpec:
    """One linear layer: W is [out_features, in_features]."""
    name: str
    out_features: int
    in_features: int
    bias: bool = False


@dataclass(frozen=True)
class ExecutionInfo:
    """How a compute request ran (every compute response carries one)."""
    format: str          # activation format, e.g. "MXFP4_E2M1"
    weight_format: str   # weight (or B) format
    backend: str         # "cpu", "hls-sim", "fpga", "null"
    kernel: str          # e.g. "avx2/mx_i8", "hls/mx_integer", "reference"
    weight_version: int  # 0 for Gemm
    batch_size: int      # requests fused into the GEMM that served this one
    queue_seconds: float
    compute_seconds: float
    model_seconds: float  # the FPGA model's time for this request's share
    model_joules: float   # ... and its energy

    @classmethod
    def from_proto(cls, info) -> "ExecutionInfo":
        return cls(format=_wire.format_name(info.format),
                   weight_format=_wire.format_name(info.weight_format), backend=info.backend,
                   kernel=info.kernel, weight_version=info.weight_version,
                   batch_size=info.batch_size, queue_seconds=info.queue_seconds,
                   compute_seconds=info.compute_seconds, model_seconds=info.model_seconds,
                   model_joules=info.model_joules)


@dataclass
class ComputeResult:
    """Gemm / LayerForward: the FP32 output (numpy, or torch when the input was)."""
    output: Any
    info: ExecutionInfo


@dataclass
class BackwardResult:
    grad_input: Any                 # [M, in_features]
    grad_weight: Optional[Any]      # [out_features, in_features]; None without input
    grad_bias: Optional[Any]        # [out_features]; None for a layer without bias
    info: ExecutionInfo


@dataclass(frozen=True)
class LayerInfo:
    spec: LayerSpec
    cached_formats: Tuple[str, ...]  # formats whose quantized copy is held


@dataclass(frozen=True)
class ModelInfo:
    name: str
    layers: Tuple[LayerInfo, ...]
    policy: str
    weight_version: int  # 0 until the first publish
    staged_tensors: int
    weight_bytes: int

    @classmethod
    def from_proto(cls, info) -> "ModelInfo":
        layers = tuple(
            LayerInfo(LayerSpec(l.spec.name, l.spec.out_features, l.spec.in_features, l.spec.bias),
                      tuple(_wire.format_name(f) for f in l.cached_formats)) for l in info.layers)
        return cls(info.name, layers, info.policy, info.weight_version, info.staged_tensors,
                   info.weight_bytes)


@dataclass(frozen=True)
class UploadResult:
    model: str
    tensors_staged: int
    bytes_received: int
    weight_version: int  # the published version when publishing was asked, else 0

    @classmethod
    def from_proto(cls, response) -> "UploadResult":
        return cls(response.model, response.tensors_staged, response.bytes_received,
                   response.weight_version)


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    json: str  # the normalized document
    builtin: bool

    @classmethod
    def from_proto(cls, info) -> "PolicyInfo":
        return cls(info.name, info.json, info.builtin)

    @property
    def document(self) -> Dict[str, Any]:
        return json.loads(self.json)


@dataclass(frozen=True)
class ResolvedFormat:
    phase: str
    layer: str
    format: str
    rule: int  # index of the matching rule, -1 for the phase default


@dataclass(frozen=True)
class ResolvedPolicy:
    policy: str
    entries: Tuple[ResolvedFormat, ...]

    def table(self) -> Dict[Tuple[str, str], str]:
        """{(phase, layer): format}."""
        return {(e.phase, e.layer): e.format for e in self.entries}


@dataclass(frozen=True)
class PowerSample:
    """One power reading. `timestamp` is Unix time in seconds."""
    source: str
    device: str
    phase: str
    timestamp: float
    watts: float


@dataclass(frozen=True)
class PowerResult:
    samples_accepted: int
    joules_added: float


@dataclass(frozen=True)
class EnergyEntry:
    source: str
    phase: str
    joules: float
    busy_seconds: float
    requests: int


@dataclass(frozen=True)
class EnergyReport:
    entries: Tuple[EnergyEntry, ...]
    since_seconds: float
    until_seconds: float

    def joules(self, source: Optional[str] = None, phase: Optional[str] = None) -> float:
        """Total joules, optionally of one source and/or phase."""
        return sum(e.joules for e in self._select(source, phase))

    def busy_seconds(self, source: Optional[str] = None, phase: Optional[str] = None) -> float:
        return sum(e.busy_seconds for e in self._select(source, phase))

    def by_phase(self, source: str) -> Dict[str, EnergyEntry]:
        """One source's entries, keyed by phase."""
        return {e.phase: e for e in self.entries if e.source == source}

    def _select(self, source, phase) -> List[EnergyEntry]:
        return [e for e in self.entries
                if (source is None or e.source == source) and (phase is None or e.phase == phase)]

