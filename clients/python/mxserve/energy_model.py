"""The FPGA cycle and energy model in Python, and how far its verdict can be trusted.

`fpga/model/energy_model.{h,cc}` is what the daemon books per request (the
`fpga_model` energy source, ExecutionInfo.model_joules). This module is a port of
it, operation for operation, so that the same work can be re-priced here under
other parameters without another run:

    model = load_energy_model()                       # fpga/model/energy_model.json
    joules = phase_joules(session.work(run), model)   # == what the daemon booked
    report = saving_range(mx_work, fp16_work, model)  # the saving and its range
    report.phases["total"].nominal, .min, .max, .swings[0].parameter

Every parameter in the JSON is an estimate (no synthesis, no board): its
"ranges" object gives a low and a high for each, with a source. `saving_range`
varies the parameters over that box, the configuration and the baseline under
the same draw (the saving is a ratio, so a parameter that moves both by the same
factor must cancel), and reports the nominal saving, its min and max over the
box, and a one-at-a-time swing per parameter. See fpga/README.md, "Parameter
ranges".

Work is what `mxserve.torch.OffloadSession.work()` records: rows of (phase, run,
x_format, w_format, m, n, k, kind, count), m, n, k being the arguments the daemon
passed to EstimateGemm (Y is m×n, the contraction is k), as JSON-ready dicts so a
run's work can be stored beside its results and re-priced later. Every function
here also takes {WorkKey: count} (`work_counts` turns rows into that).
"""

from __future__ import annotations

import itertools
import json
import math
import pathlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["BLOCK_SIZE", "DEFAULT_PATH", "ELEMENT_BITS", "EnergyModel", "EnergyModelError",
           "GemmEstimate", "ParamRange", "SavingRange", "SavingReport", "Swing", "WorkKey",
           "estimate_gemm", "load_energy_model", "packed_bytes", "parse_energy_model",
           "merge_work", "phase_joules", "recast", "saving_range", "work_counts", "work_rows"]

# The repository's parameter file, found from this package's place in the checkout
# (clients/python/mxserve/ → ../../../fpga/model/). An installed package has no
# checkout around it: pass the path then.
_HERE = pathlib.Path(__file__).resolve()
DEFAULT_PATH = (_HERE.parents[3] if len(_HERE.parents) > 3 else _HERE.parent) / "fpga" / \
    "model" / "energy_model.json"

# mx/format.cc: bits one element takes in the packed layout, by format, in the
# order of mx::Format (which is also the wire order, _wire.FORMATS).
ELEMENT_BITS = {"MXFP8_E4M3": 8, "MXFP8_E5M2": 8, "MXFP6_E3M2": 6, "MXFP6_E2M3": 6,
                "MXFP4_E2M1": 4, "MXINT8": 8, "INT8": 8, "BF16": 16, "FP16": 16, "FP32": 32,
                "NVFP4": 4, "NF4": 4, "BNB_FP4": 4, "LO_BCQ": 4}
FORMATS = tuple(ELEMENT_BITS)
_MX = frozenset(f for f in FORMATS if f.startswith("MX"))
BLOCK_SIZE = 32  # mx::kBlockSize: elements per MX block along K
NV_BLOCK_SIZE = 16  # mx::kNvBlockSize: elements per NVFP4 block
CODEBOOK_BLOCK_SIZE = 64  # mx::kCodebookBlockSize: NF4, BNB_FP4 (one FP32 absmax each)
# The lookup formats and their scale bytes per 64-element block: an FP32 absmax;
# LO_BCQ's FP32 scale and its 8 selector nibbles (mx::FormatTraits::block_scale_bytes).
_CODEBOOK_SCALE_BYTES = {"NF4": 4, "BNB_FP4": 4, "LO_BCQ": 8}
_CODEBOOKS = frozenset(_CODEBOOK_SCALE_BYTES)

# The scalar parameters, each a positive number in the JSON and each with a range.
_SCALARS = ("clock_hz", "hbm_bytes_per_second", "energy_per_byte_pj", "static_power_watts")
_PER_FORMAT = ("macs_per_pe_cycle", "energy_per_mac_pj")


class EnergyModelError(ValueError):
    """A parameter file that cannot be read or is not valid; the message names the
    file and the field."""


class WorkKey(NamedTuple):
    """One kind of GEMM the daemon booked: the EstimateGemm arguments and where."""
    phase: str
    run: str          # "" untagged
    x_format: str     # canonical names, as ExecutionInfo gives them
    w_format: str
    m: int
    n: int
    k: int
    kind: str         # "forward", "grad_input" or "grad_weight"


# Rows ({"phase", "run", "x_format", "w_format", "m", "n", "k", "kind", "count"}),
# or {WorkKey or 8-tuple: count}.
Work = Union[Iterable[Mapping[str, Any]], Mapping[Union[WorkKey, Tuple], int]]


@dataclass(frozen=True)
class ParamRange:
    """The low and high estimate of one parameter of the box.

    For a scalar parameter `low`, `nominal` and `high` are in its own unit. For a
    per-format parameter the range belongs to a group of formats (a datapath of
    the kernel) and `low`, `high` are factors on each format's nominal value
    (`nominal` is 1): a synthesis report would move a datapath's formats together,
    so varying them apart would invent differences nothing here knows about."""
    parameter: str                # JSON key, e.g. "static_power_watts", "energy_per_mac_pj"
    group: str                    # the format group for per-format parameters, else ""
    formats: Tuple[str, ...]      # the group's formats; () for a scalar
    low: float
    nominal: float
    high: float
    source: str

    @property
    def name(self) -> str:
        """'static_power_watts', or 'energy_per_mac_pj[mx_integer]' for a group."""
        return f"{self.parameter}[{self.group}]" if self.group else self.parameter

    @property
    def low_factor(self) -> float:
        return self.low / self.nominal

    @property
    def high_factor(self) -> float:
        return self.high / self.nominal


@dataclass(frozen=True)
class EnergyModel:
    """fpga_model::EnergyModelParams, formats by name, plus the ranges."""
    clock_hz: float
    pe_rows: int
    pe_cols: int
    macs_per_pe_cycle: Dict[str, float]
    energy_per_mac_pj: Dict[str, float]
    hbm_bytes_per_second: float
    energy_per_byte_pj: float
    static_power_watts: float
    ranges: Tuple[ParamRange, ...] = ()
    path: str = ""  # where it was read from ("" for a parsed string)

    def range(self, name: str) -> ParamRange:
        """The range called `name` ('clock_hz', 'energy_per_mac_pj[float]', ...)."""
        for r in self.ranges:
            if r.name == name:
                return r
        raise KeyError(f"energy model: no range {name!r}; have {[r.name for r in self.ranges]}")

    def scaled(self, factors: Mapping[str, float]) -> "EnergyModel":
        """These parameters with each named range's parameter multiplied by its factor
        (a scalar's value, or every format of a group): one point of the box."""
        values: Dict[str, Any] = {p: getattr(self, p) for p in _SCALARS}
        per_format = {p: dict(getattr(self, p)) for p in _PER_FORMAT}
        for name, factor in factors.items():
            r = self.range(name)
            if r.group:
                for f in r.formats:
                    per_format[r.parameter][f] *= factor
            else:
                values[r.parameter] *= factor
        return replace(self, **values, **per_format)


class GemmEstimate(NamedTuple):
    """fpga_model::GemmEstimate."""
    macs: float
    cycles: float   # PE-array cycles
    bytes: float
    seconds: float
    joules: float


# --- loading --------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive(obj: Mapping, key: str, field_name: str, where: str) -> float:
    """The C++ parser's PositiveNumber, with the same field names in errors."""
    if key not in obj:
        raise EnergyModelError(f"{where}energy_model.{field_name}: missing")
    v = obj[key]
    if not _is_number(v) or v <= 0:
        raise EnergyModelError(f"{where}energy_model.{field_name}: expected a positive number")
    return float(v)


def _per_format(doc: Mapping, key: str, where: str) -> Dict[str, float]:
    obj = doc.get(key)
    if not isinstance(obj, dict):
        raise EnergyModelError(f"{where}energy_model.{key}: expected an object of format: number")
    for name in obj:
        if name not in ELEMENT_BITS:
            raise EnergyModelError(f"{where}energy_model.{key}.{name}: unknown format")
    return {f: _positive(obj, f, f"{key}.{f}", where) for f in FORMATS}


def _ranges(doc: Mapping, model: Dict[str, Any], where: str) -> Tuple[ParamRange, ...]:
    """The "ranges" object: every scalar and every per-format parameter must have
    one (a parameter known exactly gets low = high = nominal), so that no estimate
    silently stays out of the box."""
    obj = doc.get("ranges")
    if obj is None:
        return ()
    if not isinstance(obj, dict):
        raise EnergyModelError(f"{where}energy_model.ranges: expected an object")
    known = set(_SCALARS) | set(_PER_FORMAT)
    for key in obj:
        if not key.startswith("_") and key not in known:
            raise EnergyModelError(f"{where}energy_model.ranges.{key}: not a parameter with a "
                                   f"range (expected one of {', '.join(sorted(known))})")

    def bounds(entry: Any, field_name: str, low_key: str, high_key: str, nominal: float):
        if not isinstance(entry, dict):
            raise EnergyModelError(f"{where}energy_model.{field_name}: expected an object")
        for key in entry:
            if not key.startswith("_") and key not in (low_key, high_key, "source", "formats"):
                raise EnergyModelError(f"{where}energy_model.{field_name}.{key}: unknown key")
        low = _positive(entry, low_key, f"{field_name}.{low_key}", where)
        high = _positive(entry, high_key, f"{field_name}.{high_key}", where)
        if not low <= nominal <= high:
            raise EnergyModelError(
                f"{where}energy_model.{field_name}: expected {low_key} <= {nominal:g} <= "
                f"{high_key}, got {low_key} {low:g} and {high_key} {high:g}")
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            raise EnergyModelError(f"{where}energy_model.{field_name}.source: expected the "
                                   "reason for the range, a non-empty string")
        return low, high, source

    out: List[ParamRange] = []
    for p in _SCALARS:
        if p not in obj:
            raise EnergyModelError(f"{where}energy_model.ranges.{p}: missing")
        low, high, source = bounds(obj[p], f"ranges.{p}", "low", "high", model[p])
        out.append(ParamRange(p, "", (), low, model[p], high, source))
    for p in _PER_FORMAT:
        groups = obj.get(p)
        if not isinstance(groups, dict):
            raise EnergyModelError(f"{where}energy_model.ranges.{p}: expected an object of "
                                   "group: {formats, low_factor, high_factor, source}")
        covered: Dict[str, str] = {}
        for group, entry in groups.items():
            if group.startswith("_"):
                continue
            field_name = f"ranges.{p}.{group}"
            low, high, source = bounds(entry, field_name, "low_factor", "high_factor", 1.0)
            formats = entry.get("formats")
            if not isinstance(formats, list) or not formats:
                raise EnergyModelError(f"{where}energy_model.{field_name}.formats: expected a "
                                       "non-empty list of format names")
            for f in formats:
                if f not in ELEMENT_BITS:
                    raise EnergyModelError(f"{where}energy_model.{field_name}.formats: unknown "
                                           f"format {f!r}")
                if f in covered:
                    raise EnergyModelError(f"{where}energy_model.{field_name}.formats: {f} is "
                                           f"already in group {covered[f]!r}")
                covered[f] = group
            out.append(ParamRange(p, group, tuple(formats), low, 1.0, high, source))
        missing = [f for f in FORMATS if f not in covered]
        if missing:
            raise EnergyModelError(f"{where}energy_model.ranges.{p}: no group holds "
                                   f"{', '.join(missing)}")
    return tuple(out)


def parse_energy_model(text: str, path: str = "") -> EnergyModel:
    """The JSON document as the daemon's ParseEnergyModel reads it (same checks,
    same field names in errors), plus its "ranges" when it has them."""
    where = f"{path}: " if path else ""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise EnergyModelError(f"{where}energy_model: not JSON ({error})") from None
    if not isinstance(doc, dict):
        raise EnergyModelError(f"{where}energy_model: not a JSON object")
    values: Dict[str, Any] = {p: _positive(doc, p, p, where) for p in _SCALARS}
    for p in ("pe_rows", "pe_cols"):
        # The C++ parser truncates the number to an int; so does this.
        values[p] = int(_positive(doc, p, p, where))
    for p in _PER_FORMAT:
        values[p] = _per_format(doc, p, where)
    return EnergyModel(**values, ranges=_ranges(doc, values, where), path=path)


def load_energy_model(path: Union[None, str, pathlib.Path] = None) -> EnergyModel:
    """Reads a parameter file; by default the repository's
    fpga/model/energy_model.json next to this package (DEFAULT_PATH)."""
    target = pathlib.Path(path) if path is not None else DEFAULT_PATH
    try:
        text = target.read_text(encoding="utf-8")
    except OSError as error:
        how = ("" if path is not None else
               " (the default: the repository's fpga/model/energy_model.json, looked for "
               "relative to the mxserve package; an installed package has no checkout "
               "around it, so pass path=)")
        raise EnergyModelError(f"energy model '{target}': cannot read: "
                               f"{error.strerror or error}{how}") from None
    except UnicodeDecodeError as error:
        raise EnergyModelError(f"{target}: energy_model: not UTF-8 text (byte "
                               f"{error.start})") from None
    return parse_energy_model(text, str(target))


# --- the model --------------------------------------------------------------------------


def packed_bytes(fmt: str, rows: int, k: int) -> float:
    """Bytes a rows × k matrix takes in mx/'s packed layout, scales included
    (fpga/model/energy_model.cc's PackedBytes over mx::RowBytes and
    mx::BlocksPerRow): MX rows are whole 32-element blocks plus one E8M0 scale
    byte per block, NVFP4 rows whole 16-element blocks plus one UE4M3 byte per
    block and an FP32 tensor scale, NF4/BNB_FP4 rows whole 64-element blocks plus
    one FP32 absmax per block (LO_BCQ: its FP32 scale and 4 selector bytes),
    INT8 rows one FP32 scale each, floats their elements."""
    bits = ELEMENT_BITS[fmt]
    block = BLOCK_SIZE if fmt in _MX else NV_BLOCK_SIZE if fmt == "NVFP4" else \
        CODEBOOK_BLOCK_SIZE if fmt in _CODEBOOKS else 0
    if block:
        blocks = (k + block - 1) // block
        row_bytes = blocks * (block * bits // 8)
    else:
        row_bytes = k * bits // 8
    total = float(rows) * float(row_bytes)
    if block:
        total += float(rows) * float((k + block - 1) // block) * _CODEBOOK_SCALE_BYTES.get(fmt, 1)
    if fmt in ("INT8", "NVFP4"):
        total += 4.0 * float(rows)
    return total


def estimate_gemm(params: EnergyModel, x_format: str, w_format: str, m: int, n: int,
                  k: int) -> GemmEstimate:
    """fpga_model::EstimateGemm: Y (m×n) = X (m×k, x_format) · Wᵀ (n×k, w_format).
    The same operations in the same order on IEEE doubles, so the result is the
    daemon's to the last bit (the tests hold it to that)."""
    rate = min(params.macs_per_pe_cycle[x_format], params.macs_per_pe_cycle[w_format])
    mac_pj = max(params.energy_per_mac_pj[x_format], params.energy_per_mac_pj[w_format])
    w_tiles = float((n + params.pe_cols - 1) // params.pe_cols)
    macs = float(m) * float(n) * float(k)
    cycles = (float((m + params.pe_rows - 1) // params.pe_rows) * w_tiles *
              float((k + BLOCK_SIZE - 1) // BLOCK_SIZE) * BLOCK_SIZE / rate)
    nbytes = (packed_bytes(w_format, n, k) + packed_bytes(x_format, m, k) * w_tiles +
              4.0 * float(m) * n)
    seconds = max(cycles / params.clock_hz, nbytes / params.hbm_bytes_per_second)
    joules = (macs * mac_pj + nbytes * params.energy_per_byte_pj) * 1e-12 + \
        params.static_power_watts * seconds
    return GemmEstimate(macs, cycles, nbytes, seconds, joules)


def _items(work: Work) -> Iterable[Tuple[WorkKey, int]]:
    if isinstance(work, Mapping):
        for key, count in work.items():
            yield (key if isinstance(key, WorkKey) else WorkKey(*key)), count
        return
    for row in work:
        try:
            yield WorkKey(*(row[f] for f in WorkKey._fields)), row["count"]
        except KeyError as error:
            raise ValueError(f"work: a row without {error.args[0]!r}: {dict(row)!r}") from None


def work_counts(work: Work) -> Dict[WorkKey, int]:
    """{WorkKey: count}, counts of equal keys summed."""
    out: Dict[WorkKey, int] = {}
    for key, count in _items(work):
        out[key] = out.get(key, 0) + count
    return out


def work_rows(work: Work) -> List[Dict[str, Any]]:
    """JSON-ready rows, one per distinct GEMM, in a stable order."""
    return [{**key._asdict(), "count": count}
            for key, count in sorted(work_counts(work).items())]


def merge_work(*works: Work) -> List[Dict[str, Any]]:
    """Several ledgers (sessions of one trainer, say) as one, counts summed."""
    return work_rows([row for work in works for row in work_rows(work)])


def phase_joules(work: Work, params: EnergyModel) -> Dict[str, float]:
    """Joules per phase of a work ledger (rows, or {WorkKey: count}) under these
    parameters: count × estimate_gemm summed, as the daemon books each call."""
    out: Dict[str, float] = {}
    for key, count in _items(work):
        e = estimate_gemm(params, key.x_format, key.w_format, key.m, key.n, key.k)
        out[key.phase] = out.get(key.phase, 0.0) + count * e.joules
    return out


def recast(work: Work, x_format: str, w_format: Optional[str] = None) -> List[Dict[str, Any]]:
    """The same GEMMs in other formats (w_format defaults to x_format): a uniform
    baseline (say FP16) priced on exactly the shapes a configuration ran, rather
    than on another run whose sampled lengths differ."""
    w_format = w_format or x_format
    for f in (x_format, w_format):
        if f not in ELEMENT_BITS:
            raise ValueError(f"recast: unknown format {f!r}; expected one of {', '.join(FORMATS)}")
    return merge_work([{**key._asdict(), "x_format": x_format, "w_format": w_format, "count": count}
                       for key, count in _items(work)])


# --- the saving and its range -------------------------------------------------------------


@dataclass
class Swing:
    """One-at-a-time: the saving with one parameter at its low and at its high
    estimate, everything else nominal. `low`/`high` are the parameter's values
    (factors for a format group)."""
    parameter: str
    low: float
    high: float
    saving_at_low: Optional[float]   # percent
    saving_at_high: Optional[float]

    @property
    def swing(self) -> float:
        """|saving at high − saving at low|, percentage points (0 where undefined)."""
        if self.saving_at_low is None or self.saving_at_high is None:
            return 0.0
        return abs(self.saving_at_high - self.saving_at_low)


@dataclass
class SavingRange:
    """The saving of one phase (or "total"), percent: 100·(1 − E_config / E_baseline).
    Positive: the configuration takes less energy. None where the baseline booked
    nothing in the phase (no ratio to take)."""
    nominal: Optional[float]
    min: Optional[float]
    max: Optional[float]
    config_joules: float     # at the nominal parameters
    baseline_joules: float
    swings: List[Swing] = field(default_factory=list)  # largest swing first

    def most_sensitive(self, n: int = 3) -> List[str]:
        """The names of the n parameters whose range moves the saving most."""
        return [s.parameter for s in self.swings[:n] if s.swing > 0]


@dataclass
class SavingReport:
    method: str                      # how the box was covered, in words
    draws: int                       # parameter points evaluated (nominal and swings included)
    seed: Optional[int]              # of the random part, None if there was none
    free_parameters: List[str]       # varied: a range of some width, used by the work
    fixed_parameters: List[str]      # low == high, or a format group neither work uses
    phases: Dict[str, SavingRange]   # per phase, and "total"

    def to_dict(self) -> Dict[str, Any]:
        """Plain data (JSON-ready), swings with their `swing` value included."""
        out = asdict(self)
        for phase, r in self.phases.items():
            for swing, d in zip(r.swings, out["phases"][phase]["swings"]):
                d["swing"] = swing.swing
        return out


class _Compiled:
    """A work ledger reduced to what the model needs, per distinct GEMM: the
    parameter-free parts (MACs, bytes, cycles at one MAC per cycle) and the count
    per phase, so that many parameter points cost one array operation each."""

    def __init__(self, work: Work, pe_rows: int, pe_cols: int, phases: Sequence[str]):
        shapes: Dict[Tuple[str, str, int, int, int], int] = {}
        rows: List[Tuple[str, str, int, int, int]] = []
        counts: Dict[Tuple[int, str], float] = {}
        for key, count in _items(work):
            shape = (key.x_format, key.w_format, key.m, key.n, key.k)
            if shape not in shapes:
                shapes[shape] = len(rows)
                rows.append(shape)
            i = (shapes[shape], key.phase)
            counts[i] = counts.get(i, 0) + count
        self.ix = np.array([FORMATS.index(r[0]) for r in rows], dtype=np.int64)
        self.iw = np.array([FORMATS.index(r[1]) for r in rows], dtype=np.int64)
        macs, cycles, nbytes = [], [], []
        for x, w, m, n, k in rows:
            w_tiles = float((n + pe_cols - 1) // pe_cols)
            macs.append(float(m) * float(n) * float(k))
            # Cycles before the division by the rate, in estimate_gemm's order.
            cycles.append(float((m + pe_rows - 1) // pe_rows) * w_tiles *
                          float((k + BLOCK_SIZE - 1) // BLOCK_SIZE) * BLOCK_SIZE)
            nbytes.append(packed_bytes(w, n, k) + packed_bytes(x, m, k) * w_tiles +
                          4.0 * float(m) * n)
        self.macs, self.cycles, self.bytes = (np.array(a, dtype=np.float64)
                                              for a in (macs, cycles, nbytes))
        # counts[phase] · joules per GEMM gives the phase's joules per draw.
        self.weights = np.zeros((len(rows), len(phases)))
        for (i, phase), count in counts.items():
            self.weights[i, phases.index(phase)] = count
        self.formats_used = {r[0] for r in rows} | {r[1] for r in rows}


def _draw_joules(c: _Compiled, params: EnergyModel, ranges: Sequence[ParamRange],
                 factors: np.ndarray) -> np.ndarray:
    """Joules [draw, phase] with factors [draw, range] applied to the nominal
    parameters: estimate_gemm, vectorized over draws and GEMMs."""
    draws = factors.shape[0]
    scalar = {p: np.full(draws, getattr(params, p)) for p in _SCALARS}
    table = {p: np.tile(np.array([getattr(params, p)[f] for f in FORMATS]), (draws, 1))
             for p in _PER_FORMAT}
    for j, r in enumerate(ranges):
        if r.group:
            for f in r.formats:
                table[r.parameter][:, FORMATS.index(f)] *= factors[:, j]
        else:
            scalar[r.parameter] = scalar[r.parameter] * factors[:, j]
    rate = np.minimum(table["macs_per_pe_cycle"][:, c.ix], table["macs_per_pe_cycle"][:, c.iw])
    mac_pj = np.maximum(table["energy_per_mac_pj"][:, c.ix], table["energy_per_mac_pj"][:, c.iw])
    seconds = np.maximum(c.cycles / rate / scalar["clock_hz"][:, None],
                         c.bytes / scalar["hbm_bytes_per_second"][:, None])
    joules = (c.macs * mac_pj + c.bytes * scalar["energy_per_byte_pj"][:, None]) * 1e-12 + \
        scalar["static_power_watts"][:, None] * seconds
    return joules @ c.weights


def _saving(config: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(baseline > 0, 100.0 * (1.0 - config / np.where(baseline > 0, baseline, 1)),
                        np.nan)


def _opt(v: float) -> Optional[float]:
    return None if not math.isfinite(v) else float(v)


def saving_range(config_work: Work, baseline_work: Work, params: EnergyModel, *,
                 max_corner_parameters: int = 12, samples: int = 1024,
                 seed: int = 0) -> SavingReport:
    """The energy saving of `config_work` against `baseline_work` per phase and in
    total: nominal, min and max over the parameter box of `params.ranges`, and a
    one-at-a-time swing per parameter, largest first.

    The box: every range whose low < high and which the work uses (a format
    group counts only if one of its formats appears in either ledger). Both works
    are priced under the same parameter point each time. Covering it:

    - at most `max_corner_parameters` free parameters: all 2^p corners, plus
      `samples` interior points drawn log-uniformly (seed `seed`). Joules are
      linear in the energies and the static power, and a ratio of linear
      functions takes its extremes at corners; clock, bandwidth and rates enter
      through max(compute, transfer) per GEMM, where an extreme can sit at a
      breakpoint inside the box — the interior points are there to catch that.
    - more: a Latin hypercube of `samples` points (log scale per parameter),
      seed `seed`; min and max are then those of the sample, not guaranteed bounds.

    The nominal point and the swing points are part of every evaluation, so the
    nominal always lies within [min, max]. `report.method` says which was used."""
    if not params.ranges:
        raise EnergyModelError(f"{params.path or 'energy model'}: no \"ranges\" object; "
                               "saving_range needs a low and a high for every parameter")
    config_items = work_counts(config_work)
    baseline_items = work_counts(baseline_work)
    phases = sorted({k.phase for k in config_items} | {k.phase for k in baseline_items})
    config = _Compiled(config_items, params.pe_rows, params.pe_cols, phases)
    baseline = _Compiled(baseline_items, params.pe_rows, params.pe_cols, phases)
    used = config.formats_used | baseline.formats_used
    ranges = list(params.ranges)
    free = [j for j, r in enumerate(ranges)
            if r.low < r.high and (not r.group or used.intersection(r.formats))]
    fixed = [r.name for j, r in enumerate(ranges) if j not in free]

    # Points as factors on the nominal: row 0 nominal, then low and high of each
    # free parameter alone (the swings), then the cover of the box.
    nominal = np.ones(len(ranges))
    points = [nominal]
    for j in free:
        for bound in (ranges[j].low_factor, ranges[j].high_factor):
            p = nominal.copy()
            p[j] = bound
            points.append(p)
    log_low = np.log([ranges[j].low_factor for j in free])
    log_high = np.log([ranges[j].high_factor for j in free])
    rng = np.random.default_rng(seed)
    used_seed: Optional[int] = seed
    if len(free) <= max_corner_parameters:
        for corner in itertools.product((0, 1), repeat=len(free)):
            p = nominal.copy()
            for j, high in zip(free, corner):
                p[j] = ranges[j].high_factor if high else ranges[j].low_factor
            points.append(p)
        interior = rng.random((samples, len(free))) if free else np.zeros((0, 0))
        method = (f"all {2 ** len(free)} corners of the {len(free)}-parameter box"
                  + (f" plus {samples} log-uniform interior points (seed {seed})"
                     if free and samples else ""))
        if not (free and samples):
            used_seed = None
    else:
        # Latin hypercube: each parameter's log range cut into `samples` strata,
        # one point in each, the strata paired at random across parameters.
        strata = np.stack([rng.permutation(samples) for _ in free], axis=1)
        interior = (strata + rng.random((samples, len(free)))) / samples
        method = (f"Latin hypercube of {samples} points over the {len(free)}-parameter box "
                  f"(log scale, seed {seed}): min and max are the sample's, not bounds")
    if interior.size:
        for u in interior:
            p = nominal.copy()
            p[free] = np.exp(log_low + u * (log_high - log_low))
            points.append(p)
    factors = np.array(points)

    # Both works under the same points; in chunks so that big ledgers stay small.
    saving_rows = []
    for start in range(0, len(factors), 2048):
        chunk = factors[start:start + 2048]
        cj = _draw_joules(config, params, ranges, chunk)
        bj = _draw_joules(baseline, params, ranges, chunk)
        saving_rows.append(np.column_stack([_saving(cj, bj),
                                            _saving(cj.sum(1), bj.sum(1))]))
        if start == 0:
            nominal_config, nominal_baseline = cj[0], bj[0]
    savings = np.vstack(saving_rows)  # [point, phase…, total]

    out: Dict[str, SavingRange] = {}
    for col, phase in enumerate(phases + ["total"]):
        s = savings[:, col]
        swings = []
        for i, j in enumerate(free):
            r = ranges[j]
            swings.append(Swing(r.name, r.low, r.high, _opt(s[1 + 2 * i]), _opt(s[2 + 2 * i])))
        swings.sort(key=lambda w: -w.swing)
        finite = s[np.isfinite(s)]
        cfg = float(nominal_config.sum() if phase == "total" else nominal_config[col])
        base = float(nominal_baseline.sum() if phase == "total" else nominal_baseline[col])
        out[phase] = SavingRange(_opt(s[0]), float(finite.min()) if finite.size else None,
                                 float(finite.max()) if finite.size else None, cfg, base, swings)
    return SavingReport(method, len(factors), used_seed, [ranges[j].name for j in free], fixed,
                        out)
