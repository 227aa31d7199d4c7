"""Plain result types: what the daemon's responses mean, without protobuf in the way."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mxserve import _wire
from mxserve.v1 import profiles_pb2


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

    @classmethod
    def from_proto(cls, tensor, info, like: Any = None) -> "ComputeResult":
        """An output tensor and its ExecutionInfo; a torch tensor when `like` is one."""
        return cls(_wire.from_tensor(tensor, like), ExecutionInfo.from_proto(info))


@dataclass
class BackwardResult:
    grad_input: Optional[Any]       # [M, in_features]; None for a weight_rows slice
    grad_weight: Optional[Any]      # [out_features or a slice's rows, in_features]; None without X
    grad_bias: Optional[Any]        # [out_features]; None for a layer without bias
    info: ExecutionInfo

    @classmethod
    def from_proto(cls, response, like: Any = None) -> "BackwardResult":
        """A LayerBackwardResponse; a gradient it leaves out (no shape) is None."""
        def optional(tensor):
            return _wire.from_tensor(tensor, like) if len(tensor.shape) else None
        return cls(optional(response.grad_input), optional(response.grad_weight),
                   optional(response.grad_bias), ExecutionInfo.from_proto(response.info))


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
    lease_seconds: float = 0.0  # 0: no lease
    owner: str = ""  # the principal that registered it ("anonymous" without --auth-tokens)
    # What --quota-weight-bytes charges the owner: staged and published FP32
    # weights and optimizer state; the cached copies in weight_bytes are the daemon's, charged to no one.
    quota_bytes: int = 0

    @classmethod
    def from_proto(cls, info) -> "ModelInfo":
        layers = tuple(
            LayerInfo(LayerSpec(l.spec.name, l.spec.out_features, l.spec.in_features, l.spec.bias),
                      tuple(_wire.format_name(f) for f in l.cached_formats)) for l in info.layers)
        return cls(info.name, layers, info.policy, info.weight_version, info.staged_tensors,
                   info.weight_bytes, info.lease_seconds, info.owner, info.quota_bytes)


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
class OptimizerStepResult:
    """What Models.StepOptimizer did: the version the stepped weights were
    published as, each stepped layer's ‖grad‖² (weight and bias, before clipping,
    FP64), the total gradient norm over them and the trainer's own parameters,
    and the clipping coefficient every gradient was multiplied by (FP32; 1: none)."""
    weight_version: int
    grad_sq_norms: Dict[str, float]
    total_grad_norm: float
    clip_coefficient: float

    @classmethod
    def from_proto(cls, response) -> "OptimizerStepResult":
        return cls(response.weight_version, {n.layer: n.sq_norm for n in response.layers},
                   response.total_grad_norm, response.clip_coefficient)


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    json: str  # the normalized document
    builtin: bool
    owner: str = ""  # the principal that put it; "" for built-ins and --policy-dir files

    @classmethod
    def from_proto(cls, info) -> "PolicyInfo":
        return cls(info.name, info.json, info.builtin, info.owner)

    @property
    def document(self) -> Dict[str, Any]:
        return json.loads(self.json)


@dataclass(frozen=True)
class ResolvedFormat:
    phase: str
    layer: str
    format: str
    rule: int  # index of the matching rule, -1 for the phase default
    # The policy's for the phase ("scale_rules", "roundings"): what the operands a
    # layer call brings get when the call sets neither.
    scale_rule: str = "floor"
    rounding: str = "even"

    @classmethod
    def from_proto(cls, e) -> "ResolvedFormat":
        return cls(_wire.phase_name(e.phase), e.layer, _wire.format_name(e.format), e.rule,
                   _wire.scale_rule_name(e.scale_rule), _wire.rounding_name(e.rounding))


@dataclass(frozen=True)
class ResolvedPolicy:
    policy: str
    entries: Tuple[ResolvedFormat, ...]

    def table(self) -> Dict[Tuple[str, str], str]:
        """{(phase, layer): format}."""
        return {(e.phase, e.layer): e.format for e in self.entries}

    def choices(self) -> Dict[Tuple[str, str], ResolvedFormat]:
        """{(phase, layer): entry}: the format with its scale rule and rounding."""
        return {(e.phase, e.layer): e for e in self.entries}


@dataclass(frozen=True)
class PowerSample:
    """One power reading. `timestamp` is Unix time in seconds. `run`: the run tag the
    device worked for (None: the `client.run(...)` scope's when sent; "": untagged)."""
    source: str
    device: str
    phase: str
    timestamp: float
    watts: float
    run: Optional[str] = None


@dataclass(frozen=True)
class PowerResult:
    samples_accepted: int
    joules_added: float


@dataclass(frozen=True)
class EnergyInterval:
    """Joules measured on one device over [start, end] (Unix seconds) of one phase,
    e.g. the difference of NVML's cumulative energy counter read at both ends.
    `run`: as PowerSample.run (None: the `client.run(...)` scope's when sent)."""
    source: str
    device: str
    phase: str
    start: float
    end: float
    joules: float
    run: Optional[str] = None


@dataclass(frozen=True)
class EnergyResult:
    intervals_accepted: int
    joules_added: float


@dataclass(frozen=True)
class WorkCall:
    """`count` identical layer calls a client computed itself (the daemon's numerics
    in its own process), for `Client.report_work`: the daemon books them as it books
    the LayerForward or LayerBackward they stand for.

    `call`: "forward" or "backward"; `format`: the format it ran in (X and W both;
    required, e.g. "MXFP4_E2M1" or "MXFP8"); `m`: rows of X (forward) or of
    grad_output (backward); `n`: 0 (out_features), or for a backward the width of
    a weight_rows slice (grad_weight only); `grad_input`, `grad_weight`: which
    GEMMs a backward ran (at least one; both False for a forward). `run`: the run
    tag ("" untagged; None: the `client.run(...)` scope's when sent)."""
    phase: str
    run: Optional[str]
    model: str
    layer: str
    call: str
    format: str
    m: int
    n: int = 0
    grad_input: bool = False
    grad_weight: bool = False
    count: int = 1


@dataclass(frozen=True)
class ReportWorkResult:
    """What `Client.report_work` booked: layer calls (the counts summed), and the FPGA
    model's joules and seconds of them (summed over the messages it sent)."""
    calls: int
    model_joules: float
    model_seconds: float


@dataclass(frozen=True)
class EnergyEntry:
    source: str
    phase: str
    joules: float
    busy_seconds: float
    requests: int
    # Of `requests`, the layer calls clients computed themselves and reported
    # (Client.report_work): booked as the daemon's own, and marked.
    emulated_requests: int = 0
    # With energy_report(by_model=True): the model ("": those folded away past
    # mxserved --max-energy-models).
    model: str = ""


@dataclass(frozen=True)
class EnergyReport:
    """Energy per (source, phase); `run` is the run it was read for ("": every run
    together)."""
    entries: Tuple[EnergyEntry, ...]
    since_seconds: float
    until_seconds: float
    run: str = ""

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



# --- profiles ----------------------------------------------------------------------------

# The columns of ExportProfile's CSV, and of Profile.to_csv: one row per layer and format.
PROFILE_COLUMNS = ("layer", "format", "out_features", "in_features", "tokens", "rel_error",
                   "sqnr_db", "fisher", "seconds_per_token", "joules_per_token",
                   "train_seconds_per_token", "train_joules_per_token", "weight_bits")
# The scores a profile ranks by: Score's names ("auto", "rel_error", "fisher", "mse").
PROFILE_SCORES = _wire.enum_names(profiles_pb2.Score)


@dataclass(frozen=True)
class ProfileRow:
    """One layer in one candidate format: its error against the full-precision
    reference on the calibration inputs (a weight-only profile: the weight's own),
    its Fisher score where output gradients were sent, and the FPGA model's cost."""
    layer: str
    format: str
    out_features: int
    in_features: int
    tokens: int                # calibration rows of this layer (0: weight-only)
    rel_error: float           # ‖Y_F − Y‖ / ‖Y‖
    sqnr_db: float             # 10·log10(‖Y‖² / ‖Y_F − Y‖²); inf where exact
    fisher: Optional[float]    # Σ (dL/dY)² (Y_F − Y)²; None without gradients
    seconds_per_token: float   # forward GEMM, at the profile's batch_tokens rows
    joules_per_token: float
    train_seconds_per_token: float  # forward and both backward GEMMs
    train_joules_per_token: float
    weight_bits: float         # the weight in this format, scales included


@dataclass(frozen=True)
class Profile:
    """A model's sensitivity profile: `rows` holds one ProfileRow per layer and
    format, layer-major in registration order. ListProfiles returns profiles
    without rows."""
    model: str
    weight_version: int
    source: str          # "weights", "activations" or "gradients"
    reference: str       # "fp32" or "fp64"
    batch_tokens: int
    formats: Tuple[str, ...]
    rows: Tuple[ProfileRow, ...]
    tokens: int          # calibration rows received, all layers
    created_unix_seconds: float
    compute_seconds: float

    @classmethod
    def from_proto(cls, profile) -> "Profile":
        rows = tuple(
            ProfileRow(layer=l.layer, format=_wire.format_name(s.format),
                       out_features=l.out_features, in_features=l.in_features, tokens=l.tokens,
                       rel_error=s.rel_error, sqnr_db=s.sqnr_db,
                       fisher=s.fisher if s.has_fisher else None,
                       seconds_per_token=s.seconds_per_token, joules_per_token=s.joules_per_token,
                       train_seconds_per_token=s.train_seconds_per_token,
                       train_joules_per_token=s.train_joules_per_token, weight_bits=s.weight_bits)
            for l in profile.layers for s in l.scores)
        return cls(model=profile.model, weight_version=profile.weight_version,
                   source=_wire.enum_name(profiles_pb2.ProfileSource, profile.source),
                   reference=_wire.enum_name(profiles_pb2.Reference, profile.reference),
                   batch_tokens=profile.batch_tokens,
                   formats=tuple(_wire.format_name(f) for f in profile.formats), rows=rows,
                   tokens=profile.tokens, created_unix_seconds=profile.created_unix_seconds,
                   compute_seconds=profile.compute_seconds)

    @property
    def layers(self) -> Tuple[str, ...]:
        """Profiled layers, in registration order."""
        return tuple(dict.fromkeys(r.layer for r in self.rows))

    @property
    def has_fisher(self) -> bool:
        return bool(self.rows) and all(r.fisher is not None for r in self.rows)

    def row(self, layer: str, format: _wire.FormatLike) -> ProfileRow:
        name = _wire.format_name(_wire.format_to_wire(format))
        for r in self.rows:
            if r.layer == layer and r.format == name:
                return r
        raise KeyError(f"profile of '{self.model}' has no row for layer {layer!r} in {name}")

    def resolve_score(self, score: str = "auto") -> str:
        """The column `score` names: "auto" is fisher where the profile has it (as
        the daemon's SCORE_AUTO), else rel_error."""
        if score not in PROFILE_SCORES:
            raise ValueError(f"score: expected one of {', '.join(PROFILE_SCORES)}, got {score!r}")
        if score == "auto":
            return "fisher" if self.has_fisher else "rel_error"
        if score == "fisher" and not self.has_fisher:
            raise ValueError(f"score: the profile of '{self.model}' has no Fisher scores "
                             f"(source {self.source}); profile with output gradients")
        return score

    def score(self, row: ProfileRow, score: str = "auto") -> float:
        """A row's score: rel_error, fisher, or mse (rel_error², which adds over layers)."""
        column = self.resolve_score(score)
        return row.rel_error ** 2 if column == "mse" else getattr(row, column)

    def matrix(self, score: str = "rel_error") -> np.ndarray:
        """[layers, formats] of a score, in the order of `layers` and `formats`."""
        index = {(r.layer, r.format): r for r in self.rows}
        return np.array([[self.score(index[(layer, fmt)], score) for fmt in self.formats]
                         for layer in self.layers], dtype=np.float64).reshape(
                             len(self.layers), len(self.formats))

    def scores(self, format: _wire.FormatLike, score: str = "auto") -> Dict[str, float]:
        """{layer: score} of one format, in registration order."""
        name = _wire.format_name(_wire.format_to_wire(format))
        if name not in self.formats:
            raise ValueError(f"format: {name} was not profiled (the profile has "
                             f"{', '.join(self.formats) or 'none'})")
        return {r.layer: self.score(r, score) for r in self.rows if r.format == name}

    def ranking(self, format: _wire.FormatLike, score: str = "auto") -> List[str]:
        """Layer names, most sensitive to `format` first (highest score; ties keep
        registration order)."""
        scores = self.scores(format, score)
        return sorted(scores, key=lambda layer: -scores[layer])

    def to_csv(self, path: Optional[str] = None) -> str:
        """The profile as CSV, in ExportProfile's layout (PROFILE_COLUMNS: a header,
        then one row per layer and format; fisher empty where absent), as the
        original research's sensitivity_matrix.csv had it. Written to `path` when
        given; returned either way."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(PROFILE_COLUMNS)
        for r in self.rows:
            writer.writerow(["" if getattr(r, c) is None else getattr(r, c)
                             for c in PROFILE_COLUMNS])
        text = out.getvalue()
        if path is not None:
            with open(path, "w", newline="") as file:
                file.write(text)
        return text

    def heatmap(self, path: str, score: str = "rel_error", title: Optional[str] = None) -> str:
        """Draws a layer × format heatmap of `score` to a PNG at `path` (matplotlib,
        Agg backend, log colour scale: errors span decades between MXFP4 and FP16).
        Layers run down the y axis, so a model of hundreds of layers stays readable
        in a tall figure. Returns `path`."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.colors import LogNorm
            from matplotlib.figure import Figure
        except ImportError as error:
            raise ImportError("Profile.heatmap needs matplotlib (Debian: python3-matplotlib)") \
                from error
        if not self.rows:
            raise ValueError(f"the profile of '{self.model}' has no rows to draw")
        values = self.matrix(score)
        positive = values[np.isfinite(values) & (values > 0)]
        floor = positive.min() if positive.size else 1e-12
        shown = np.clip(np.where(np.isfinite(values), values, floor), floor, None)
        layers, formats = self.layers, self.formats
        label_points = 4 if len(layers) > 80 else 7  # 168 layers at 4 pt: about 10 inches
        figure = Figure(figsize=(2.5 + 0.9 * len(formats),
                                 1.8 + len(layers) * label_points * 1.4 / 72))
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        image = axes.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis",
                            norm=LogNorm(vmin=floor, vmax=max(shown.max(), floor * 10)))
        axes.set_xticks(range(len(formats)), formats, rotation=45, ha="right", fontsize=7)
        axes.set_yticks(range(len(layers)), layers, fontsize=label_points)
        axes.set_title(title or f"{self.model} v{self.weight_version}: {self.resolve_score(score)}",
                       fontsize=9)
        figure.colorbar(image, ax=axes, label=self.resolve_score(score))
        figure.tight_layout()
        figure.savefig(path, dpi=150)
        return path


@dataclass(frozen=True)
class PhaseSummary:
    """One generated phase: the assignment's summed score and cost per token, and
    the same cost with every profiled layer in FP16 (the research's baseline)."""
    phase: str
    layers: int          # layers of the profile
    low_layers: int      # fraction kind: layers put in `low`
    score: float
    joules_per_token: float
    seconds_per_token: float
    weight_bits: float
    fp16_joules_per_token: float
    fp16_seconds_per_token: float
    budget: float        # the bound used (budget and tolerance kinds)

    @property
    def energy_saving(self) -> float:
        """1 − joules / FP16 joules: the share of the FP16 baseline's energy saved."""
        if not self.fp16_joules_per_token:
            return 0.0
        return 1.0 - self.joules_per_token / self.fp16_joules_per_token


@dataclass(frozen=True)
class GeneratedPolicy:
    """GeneratePolicy's answer: the policy (put unless dry_run), a summary per
    phase, and the phase × profiled-layer formats it gives."""
    policy: PolicyInfo
    phases: Tuple[PhaseSummary, ...]
    entries: Tuple[ResolvedFormat, ...]

    @classmethod
    def from_proto(cls, response) -> "GeneratedPolicy":
        phases = tuple(
            PhaseSummary(phase=_wire.phase_name(p.phase), layers=p.layers,
                         low_layers=p.low_layers, score=p.score,
                         joules_per_token=p.joules_per_token,
                         seconds_per_token=p.seconds_per_token, weight_bits=p.weight_bits,
                         fp16_joules_per_token=p.fp16_joules_per_token,
                         fp16_seconds_per_token=p.fp16_seconds_per_token, budget=p.budget)
            for p in response.phases)
        entries = tuple(ResolvedFormat.from_proto(e) for e in response.entries)
        return cls(PolicyInfo.from_proto(response.policy), phases, entries)

    @property
    def name(self) -> str:
        return self.policy.name

    def table(self) -> Dict[Tuple[str, str], str]:
        """{(phase, layer): format}."""
        return {(e.phase, e.layer): e.format for e in self.entries}

    def choices(self) -> Dict[Tuple[str, str], ResolvedFormat]:
        """{(phase, layer): entry}: the format with its scale rule and rounding."""
        return {(e.phase, e.layer): e for e in self.entries}

    def formats(self, phase: _wire.PhaseLike) -> Dict[str, str]:
        """{layer: format} of one phase, in registration order."""
        name = _wire.phase_name(_wire.phase_to_wire(phase))
        return {e.layer: e.format for e in self.entries if e.phase == name}

    def summary(self, phase: _wire.PhaseLike) -> PhaseSummary:
        name = _wire.phase_name(_wire.phase_to_wire(phase))
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(f"policy '{self.name}' has no summary of phase {name}")
