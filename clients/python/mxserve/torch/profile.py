"""Sensitivity profiling: which layers of a model tolerate which format, measured.

    from mxserve.torch import profile as mxprofile
    data = mxprofile.capture(session, calibration_batches)       # full precision, here
    prof = mxprofile.profile(client, session, data)               # scored by the daemon
    prof.to_csv("sensitivity_matrix.csv"); prof.heatmap("sensitivity.png")
    client.generate_policy(session.model_name, "D-measured", fraction={"rollout": 0.8,
                           "reward": 0.5, "update": 0.2}, low="MXFP4", high="FP16")

`capture` runs the model once over calibration batches at full precision and keeps,
for every linear layer, its inputs X and the loss gradient at its output dL/dY. The
daemon then runs each layer in each candidate format on those inputs and scores the
output error; with the gradients, Σ (dL/dY)² (Y_F − Y)² (the Fisher score) estimates
how much the model's output distribution moves. `end_to_end` is the slow check the
scores stand in for: one layer quantized at a time, the whole model run, the KL
divergence of its outputs measured; `spearman` compares the two rankings.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from itertools import product
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import torch
import torch.nn.functional as F
from torch import nn

from mxserve import _wire, stats
from mxserve.client import Client
from mxserve.torch.offloading import OffloadedLinear, OffloadSession, offloadable
from mxserve.types import Profile

__all__ = ["Capture", "EndToEnd", "EndToEndRow", "capture", "end_to_end", "profile", "spearman"]

LossFn = Callable[[Any, Any], torch.Tensor]
ForwardFn = Callable[[nn.Module, Any], Any]
Progress = Callable[[int, int, "EndToEndRow"], None]


# --- capture -------------------------------------------------------------------------------

@dataclass
class Capture:
    """Calibration data from one full-precision pass, per linear layer in the
    model's module order: inputs X [tokens, in_features] and, when gradients were
    taken, output gradients dL/dY [tokens, out_features]; float32 on the CPU.

    Iterating yields (layer, X, dL/dY or None), one layer after the other: what
    `Client.profile` streams, in the order the daemon wants."""
    inputs: Dict[str, torch.Tensor]
    output_grads: Optional[Dict[str, torch.Tensor]]

    @property
    def layers(self) -> List[str]:
        return list(self.inputs)

    @property
    def tokens(self) -> int:
        """Rows captured, all layers."""
        return sum(x.shape[0] for x in self.inputs.values())

    def __iter__(self) -> Iterator[Tuple[str, torch.Tensor, Optional[torch.Tensor]]]:
        for layer, x in self.inputs.items():
            yield layer, x, None if self.output_grads is None else self.output_grads[layer]


class _Tap(torch.autograd.Function):
    """Identity on a layer's output whose backward keeps dL/dY for that call.

    It also takes a shared anchor leaf, so `torch.autograd.grad(loss, anchor)`
    reaches every tap without computing (or accumulating) any parameter's gradient,
    and a layer whose input needs no gradient still gets one at its output. The
    output is a copy, so an in-place op after the layer (ReLU(inplace=True)) does
    not change what the tap sees: its gradient is the pre-op output's."""

    @staticmethod
    def forward(ctx, output, anchor, call):
        ctx.call = call
        return output.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.call.grad = _rows(grad)
        return grad, None, None


class _Call:
    """One call of a captured layer within a batch."""

    def __init__(self, layer: str, x: torch.Tensor, out_features: int):
        self.layer, self.x, self.out_features = layer, x, out_features
        self.grad: Optional[torch.Tensor] = None


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A detached float32 CPU copy of `t` as rows of its last dimension."""
    return t.detach().reshape(-1, t.shape[-1]).to("cpu", torch.float32, copy=True)


def _session_of(target: Union[nn.Module, OffloadSession]) -> Optional[OffloadSession]:
    """The offload session of `target`: itself, or the one whose OffloadedLinear
    modules it holds; None for a plain model."""
    if isinstance(target, OffloadSession):
        return target
    sessions = {id(m.session): m.session for m in target.modules()
                if isinstance(m, OffloadedLinear)}
    if len(sessions) > 1:
        raise ValueError("the model holds layers of several offload sessions; pass the session")
    return next(iter(sessions.values()), None)


def _linear_layers(model: nn.Module, layers: Optional[Iterable[str]],
                   session: Optional[OffloadSession]) -> Dict[str, nn.Module]:
    """{name: module} of the model's nn.Linear (and Conv1D) layers, in module order,
    or of the named ones. Within an offload session (its original modules in
    place) they go by the names the daemon knows, also for a part of the model."""
    if session is not None:
        inside = {id(m) for m in model.modules()}
        found = {name: m for name, m in session._originals.items() if id(m) in inside}
    else:
        found = {name: m for name, m in model.named_modules() if offloadable(m)}
    if layers is None:
        return found
    wanted = [layers] if isinstance(layers, str) else list(layers)
    for name in wanted:
        if name not in found:
            raise ValueError(f"layers: the model has no linear layer {name!r}")
    return {name: m for name, m in found.items() if name in wanted}


def _run(model: nn.Module, batch: Any, forward: Optional[ForwardFn]) -> Any:
    """The model on one batch: forward(model, batch) when given, else model(**batch)
    for a mapping, model(*batch) for a tuple or list, model(batch) otherwise."""
    if forward is not None:
        return forward(model, batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _output_tensor(output: Any) -> torch.Tensor:
    """The tensor a model's output stands for: itself, its `.logits` (Hugging Face
    outputs) or `["logits"]`, or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find the output tensor in a {type(output).__name__}; pass forward= "
                    "returning a tensor, or a callable loss")


def _is_logits(y: torch.Tensor, model: nn.Module, logits: Optional[bool]) -> bool:
    """Whether the output is a language model's logits: as told, else when its last
    dimension is the vocabulary of one of the model's embeddings."""
    if logits is not None:
        return logits
    vocabularies = {m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)}
    return y.dim() >= 1 and y.shape[-1] > 1 and y.shape[-1] in vocabularies


def _fisher_loss(y: torch.Tensor, as_logits: bool, generator: torch.Generator) -> torch.Tensor:
    """A loss whose per-token gradient at the output is a sample of the model's own
    Fisher information, so Σ (dL/dY)² (ΔY)² estimates twice the KL divergence that
    a perturbation ΔY of a layer's output causes (summed over tokens).

    Logits: cross-entropy against labels sampled from the model's own softmax.
    Other outputs: the Gaussian analogue, 0.5·‖f − (f + ε)‖² with ε ~ N(0, 1) and
    f + ε held constant, whose gradient is −ε pulled back through the model."""
    flat = (y.reshape(-1, y.shape[-1]) if y.dim() >= 2 else y.reshape(-1, 1)).float()
    if as_logits:
        probs = torch.softmax(flat.detach(), dim=-1).cpu()
        labels = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        return F.cross_entropy(flat, labels.to(flat.device), reduction="sum")
    noise = torch.randn(flat.shape, generator=generator).to(flat.device)
    return 0.5 * (flat - (flat.detach() + noise)).pow(2).sum()


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """model.eval() inside; every module's own training flag back on exit."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


def capture(model_or_session: Union[nn.Module, OffloadSession], batches: Iterable[Any], *,
            loss: Union[str, LossFn] = "fisher", layers: Optional[Iterable[str]] = None,
            gradients: bool = True, seed: int = 0, logits: Optional[bool] = None,
            forward: Optional[ForwardFn] = None) -> Capture:
    """One full-precision pass over `batches` that records, for every linear layer,
    its inputs X and (with `gradients`) the loss gradient at its output dL/dY.

    model_or_session: an offload session, or a model (or part of one) holding
    OffloadedLinear modules: the pass runs here on the original modules
    (`session.local()`), so no format
    touches it and no RPC is made; or a plain model, whose nn.Linear (and Conv1D)
    layers are captured under their module names. layers: names to capture (None:
    all). Each batch runs as model(batch), model(*batch) or model(**batch), or as
    forward(model, batch).

    loss: "fisher" samples the model's own predictive distribution (labels from its
    softmax for logits, Gaussian noise for other outputs; see `_fisher_loss`),
    seeded by `seed`, so the gradients measure sensitivity without any labels;
    `logits` says whether the output is logits (None: when its last dimension is
    the vocabulary of one of the model's nn.Embedding). A callable loss(output,
    batch) returns a scalar to differentiate instead. The model runs in eval mode;
    its modes, hooks and parameters' gradients are as they were afterwards.
    """
    if not callable(loss) and loss != "fisher":
        raise ValueError(f"loss: expected 'fisher' or a callable loss(output, batch), got {loss!r}")
    session = _session_of(model_or_session)
    model = session.model if isinstance(model_or_session, OffloadSession) else model_or_session
    with session.local() if session is not None else contextlib.nullcontext(), _eval_mode(model):
        modules = _linear_layers(model, layers, session)
        inputs: Dict[str, List[torch.Tensor]] = {name: [] for name in modules}
        grads: Dict[str, List[torch.Tensor]] = {name: [] for name in modules}
        generator = torch.Generator().manual_seed(seed)
        anchor = torch.zeros((), requires_grad=True)
        calls: List[_Call] = []

        def hook(name: str):
            def record(module, args, output):
                call = _Call(name, _rows(args[0]), output.shape[-1])
                calls.append(call)
                return _Tap.apply(output, anchor, call) if gradients else None
            return record

        handles = [m.register_forward_hook(hook(name)) for name, m in modules.items()]
        try:
            for batch in batches:
                calls.clear()
                with torch.enable_grad() if gradients else torch.no_grad():
                    output = _run(model, batch, forward)
                    if gradients:
                        if callable(loss):
                            objective = loss(output, batch)
                        else:
                            y = _output_tensor(output)
                            objective = _fisher_loss(y, _is_logits(y, model, logits), generator)
                        if objective.requires_grad:
                            torch.autograd.grad(objective, anchor, allow_unused=True)
                for call in calls:
                    inputs[call.layer].append(call.x)
                    if gradients:  # an output the loss does not depend on: zero gradient
                        grads[call.layer].append(call.grad if call.grad is not None else
                                                 torch.zeros(call.x.shape[0], call.out_features))
                calls.clear()
        finally:
            for handle in handles:
                handle.remove()
    ran = [name for name in modules if inputs[name]]
    return Capture({name: torch.cat(inputs[name]) for name in ran},
                   {name: torch.cat(grads[name]) for name in ran} if gradients else None)


# --- profile -------------------------------------------------------------------------------

def profile(client: Client, model: Union[str, OffloadSession], captured: Optional[Any] = None,
            formats: Union[None, _wire.FormatLike, Iterable[_wire.FormatLike]] = None,
            layers: Optional[Iterable[str]] = None, reference: str = "fp32",
            batch_tokens: int = 0, timeout: Optional[float] = None) -> Profile:
    """Profiles a model on the daemon with captured calibration data (a Capture, or
    any iterable of (layer, X, dL/dY or None)); without it, from the weights alone.

    model: the daemon's model name, or an offload session, whose weights must be
    the ones the capture ran with (refused when a layer changed since the last
    `sync_weights()`). layers: None profiles the captured layers (every layer for
    a weight-only profile); with a Capture, only the named layers' data is sent.
    formats, reference, batch_tokens: as `Client.profile`.
    """
    name = model
    if isinstance(model, OffloadSession):
        changed = model.changed_layers()
        if changed:
            raise ValueError(f"layer {changed[0]!r} changed since its last upload: call "
                             "session.sync_weights() first, so the daemon profiles the "
                             "weights the capture ran with")
        name = model.model_name
    if isinstance(captured, Capture):
        if not captured.layers:
            raise ValueError("the capture holds no calibration data (no captured layer ran)")
        if layers is None:
            layers = captured.layers
        else:
            wanted = set([layers] if isinstance(layers, str) else layers)
            captured = [item for item in captured if item[0] in wanted]
    return client.profile(name, captured, formats=formats, layers=layers, reference=reference,
                          batch_tokens=batch_tokens, timeout=timeout)


# --- end to end ----------------------------------------------------------------------------

END_TO_END_METRICS = ("kl", "mse")


@dataclass(frozen=True)
class EndToEndRow:
    layer: str
    format: str
    value: float  # the metric with this layer alone in this format


@dataclass(frozen=True)
class EndToEnd:
    """What quantizing each layer alone does to the model's output, per format:
    metric "kl" is KL(p_full ‖ p_quantized) of the softmax over the last dimension,
    averaged over tokens; "mse" the mean squared output difference."""
    metric: str
    rows: Tuple[EndToEndRow, ...]
    tokens: int  # output rows compared per (layer, format)

    def values(self, format: _wire.FormatLike) -> Dict[str, float]:
        """{layer: value} of one format, in the order measured."""
        name = _format_name(format)
        return {r.layer: r.value for r in self.rows if r.format == name}

    def ranking(self, format: _wire.FormatLike) -> List[str]:
        """Layers, the most harmful to quantize in `format` first."""
        values = self.values(format)
        return sorted(values, key=lambda layer: -values[layer])

    def to_csv(self, path: Optional[str] = None) -> str:
        """layer,format,<metric>: a header, then one row per layer and format."""
        text = "".join([f"layer,format,{self.metric}\n"] +
                       [f"{r.layer},{r.format},{r.value!r}\n" for r in self.rows])
        if path is not None:
            with open(path, "w", newline="") as file:
                file.write(text)
        return text


def _format_name(fmt: _wire.FormatLike) -> str:
    wire = _wire.format_to_wire(fmt)
    if wire == 0:
        raise ValueError(f"format: {fmt!r} is not a format")
    return _wire.format_name(wire)


def _print_progress(done: int, total: int, row: EndToEndRow, started: float) -> None:
    print(f"end_to_end {done}/{total}: {row.layer} {row.format} {row.value:.3e} "
          f"({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)


def _divergence(reference: torch.Tensor, output: torch.Tensor, metric: str) -> Tuple[float, int]:
    """(the metric summed over rows, rows): KL over the softmax of the last
    dimension, in float64 so small divergences survive; or squared error per row."""
    ref = reference.reshape(-1, reference.shape[-1]).double()
    out = output.reshape(-1, output.shape[-1]).double()
    if metric == "kl":
        log_p, log_q = ref.log_softmax(-1), out.log_softmax(-1)
        return (log_p.exp() * (log_p - log_q)).sum().item(), ref.shape[0]
    return ((out - ref) ** 2).mean(-1).sum().item(), ref.shape[0]


def end_to_end(session: Union[OffloadSession, nn.Module], batches: Iterable[Any],
               formats: Sequence[_wire.FormatLike], layers: Optional[Iterable[str]] = None,
               metric: str = "kl", *, phase: _wire.PhaseLike = "rollout",
               forward: Optional[ForwardFn] = None,
               progress: Union[bool, Progress] = True) -> EndToEnd:
    """The slow measurement the profile's scores estimate: for each layer and
    format, that layer alone runs on the daemon in that format, every other layer
    in FP32, and the model's outputs on `batches` are compared with the all-FP32
    outputs (KL of the softmax over the last dimension, averaged over tokens, or
    the mean squared error for models that are not language models).

    Needs an offload session (or a model holding its layers, which is then what
    runs on the batches): the formats are pinned per layer
    (OffloadedLinear.format), so neither the model's policy nor the daemon's
    state changes; the pins, the session's format and the modules' modes are as
    they were afterwards. The calls carry `phase` (only the energy accounting
    sees it). It costs (layers × formats + 1) passes over the batches; progress
    is printed to stderr (True), a callable progress(done, total, row), or
    nothing (False). Batches run as in `capture`.
    """
    offloaded = _session_of(session)
    if offloaded is None:
        raise TypeError("end_to_end needs an offloaded model (mxserve.torch.offload)")
    model = session if isinstance(session, nn.Module) else offloaded.model
    if metric not in END_TO_END_METRICS:
        raise ValueError(f"metric: expected one of {', '.join(END_TO_END_METRICS)}, got {metric!r}")
    names = [_format_name(f) for f in formats]
    inside = {id(m) for m in model.modules()}
    wanted = [n for n, l in offloaded.layers.items() if id(l) in inside] if layers is None \
        else ([layers] if isinstance(layers, str) else list(layers))
    for layer in wanted:
        if layer not in offloaded.layers:
            raise ValueError(f"layers: model '{offloaded.model_name}' has no layer {layer!r}")
    batches = list(batches)
    started = time.monotonic()
    report = (lambda done, total, row: _print_progress(done, total, row, started)) \
        if progress is True else (progress or None)

    def run_all() -> List[torch.Tensor]:
        return [_output_tensor(_run(model, b, forward)).detach().float().cpu() for b in batches]

    pins = {name: layer.format for name, layer in offloaded.layers.items()}
    session_format = offloaded.format
    rows: List[EndToEndRow] = []
    tokens = 0
    try:
        with _eval_mode(model), torch.no_grad(), offloaded.client.phase(phase):
            offloaded.format = "FP32"
            for layer in offloaded.layers.values():
                layer.format = None
            references = run_all()
            total = len(wanted) * len(names)
            for done, (layer, fmt) in enumerate(product(wanted, names), 1):
                offloaded.layers[layer].format = fmt
                try:
                    outputs = run_all()
                finally:
                    offloaded.layers[layer].format = None
                sums = [_divergence(r, o, metric) for r, o in zip(references, outputs)]
                tokens = sum(n for _, n in sums)
                row = EndToEndRow(layer, fmt, sum(s for s, _ in sums) / max(1, tokens))
                rows.append(row)
                if report:
                    report(done, total, row)
    finally:
        offloaded.format = session_format
        for name, layer in offloaded.layers.items():
            layer.format = pins[name]
    return EndToEnd(metric, tuple(rows), tokens)


# --- rank correlation ----------------------------------------------------------------------

def spearman(a: Union[Sequence[float], Mapping[str, float]],
             b: Union[Sequence[float], Mapping[str, float]]) -> float:
    """Spearman's rank correlation ρ of two score lists, or of two {layer: score}
    mappings over the layers both have (e.g. a profile's scores and an end-to-end
    measurement). Ties take average ranks; nan when either side is constant
    (mxserve.stats.spearman, the one implementation the experiment uses too)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys = [k for k in a if k in b]
        a, b = [a[k] for k in keys], [b[k] for k in keys]
    return stats.spearman(a, b)
