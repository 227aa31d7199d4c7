"""Offload a PyTorch model's linear layers to mxserved.

    session = mxserve.torch.offload(model, client, name="policy")
    with client.phase("rollout"):
        tokens = generate(model, prompts)          # every nn.Linear runs on mxserve
    with client.phase("update"):
        loss = ppo_loss(model, batch)
        loss.backward()                            # through Compute.LayerBackward
    optimizer.step()
    session.sync_weights()                         # the new weights, as a new version
    session.restore()                              # the original modules, back in place

Every `nn.Linear` (and every Hugging Face `Conv1D`, GPT-2's linear layer, whose
weight is stored transposed) is registered under its `named_modules()` name and
replaced by an `OffloadedLinear` that shares the original's parameters, so an
optimizer built before or after `offload` steps the same tensors. Forward runs
`LayerForward` in the phase (and run) of the caller's `client.phase(...)` (and
`client.run(...)`) scope, in the format the model's policy gives that (phase, layer)
unless `format=` pins one. Backward runs `LayerBackward` in the phase and run the
forward ran in: grad_input remotely, grad_weight remotely (default) or locally in
FP32 (`grad_weight="local"`).

A call too large for one gRPC message (a vocabulary projection's logits, its
151936 × 896 weight gradient) is split into several, each under the client's
`max_message_bytes`: forwards and grad_input along the rows of X (M), grad_weight
along the rows of W (`weight_rows`). Every piece is bit-identical to the same part
of an unsplit call, and each is booked, so the energy ledger holds the whole.

`session.work(run)` counts the GEMMs the daemon booked for this session's calls,
split pieces included, as JSON-ready rows {phase, run, x_format, w_format, m, n,
k, kind, count} with m, n, k the daemon's EstimateGemm arguments: the input of
`mxserve.energy_model.phase_joules` and `saving_range`, which re-price the same
work under other model parameters. `session.reset_work(run)` clears it.
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from mxserve import _wire
from mxserve.client import ENVELOPE_BYTES, Client, MxserveError
from mxserve.energy_model import WorkKey, work_rows
from mxserve.types import ExecutionInfo, LayerSpec

__all__ = ["OffloadSession", "OffloadedLinear", "PhaseTotals", "offload"]


@dataclass
class PhaseTotals:
    """What the daemon reported for one phase's calls, summed over their
    ExecutionInfo: requests, compute and queue seconds, and the FPGA model's
    seconds and joules."""
    requests: int = 0
    compute_seconds: float = 0.0
    queue_seconds: float = 0.0
    model_seconds: float = 0.0
    model_joules: float = 0.0

    def add(self, info: ExecutionInfo) -> None:
        """Counts one response."""
        self.merge(PhaseTotals(1, info.compute_seconds, info.queue_seconds, info.model_seconds,
                               info.model_joules))

    def merge(self, other: "PhaseTotals") -> None:
        """Adds another set of totals (of another session) to these."""
        self.requests += other.requests
        self.compute_seconds += other.compute_seconds
        self.queue_seconds += other.queue_seconds
        self.model_seconds += other.model_seconds
        self.model_joules += other.model_joules


def _is_conv1d(module: nn.Module) -> bool:
    """transformers.pytorch_utils.Conv1D: y = x·W + b with W stored [in, out]."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and \
        getattr(module, "weight", None) is not None and module.weight.dim() == 2


def _offloadable(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or _is_conv1d(module)


class _RemoteLinear(torch.autograd.Function):
    """y = x·Wᵀ + b on the daemon; the backward pass on the daemon too."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer: "OffloadedLinear"):
        session = layer.session
        phase = session.client.current_phase
        # "" (not None) when untagged: the backward must not pick up whatever run
        # scope loss.backward() happens to be called in.
        run = session.client.current_run or ""
        x2d = x.reshape(-1, layer.in_features)
        fmt = layer.effective_format
        y, info = session.remote_forward(layer, x2d, fmt, phase, run)
        y = y.to(device=x.device, dtype=x.dtype)
        ctx.layer, ctx.phase, ctx.run, ctx.format = layer, phase, run, fmt
        ctx.version = info.weight_version
        ctx.input_shape = x.shape
        if weight.requires_grad:
            ctx.save_for_backward(x2d)
        return y.reshape(*x.shape[:-1], layer.out_features)

    @staticmethod
    @once_differentiable  # the daemon's gradients are not themselves differentiable
    def backward(ctx, grad_y):
        layer: OffloadedLinear = ctx.layer
        session = layer.session
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dy = grad_y.reshape(-1, layer.out_features)
        x2d = ctx.saved_tensors[0] if ctx.saved_tensors else None
        remote_w = need_w and session.grad_weight == "remote"
        grad_x, grad_w, grad_b = session.remote_backward(
            layer, dy, x2d if remote_w else None, need_x, need_b and session.grad_weight == "remote",
            ctx)
        if grad_x is not None:
            grad_x = grad_x.to(device=grad_y.device, dtype=grad_y.dtype).reshape(ctx.input_shape)
        if need_w and grad_w is None:  # local: FP32 dYᵀ·X
            grad_w = dy.float().t() @ x2d.float()
        if need_b and grad_b is None:
            grad_b = dy.float().sum(0)
        if grad_w is not None:
            weight = layer.weight
            grad_w = (grad_w.t() if layer.transposed else grad_w).to(weight.device, weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(layer.bias.device, layer.bias.dtype)
        return grad_x, grad_w, grad_b, None


class OffloadedLinear(nn.Module):
    """Stands in for one nn.Linear (or Conv1D): same parameters, remote arithmetic.

    `last_info` holds the ExecutionInfo of its latest forward (format, backend,
    kernel, weight version, modelled energy), `last_backward_info` of its backward.
    `format` pins this layer's format over the session's and the policy's (None:
    the session's choice); a backward runs in the format its forward ran in.
    """

    def __init__(self, session: "OffloadSession", layer_name: str, original: nn.Module):
        super().__init__()
        self.session = session
        self.layer_name = layer_name
        self.transposed = _is_conv1d(original)
        self.weight = original.weight  # the very Parameter objects: optimizers see no change
        self.bias = original.bias
        rows, cols = original.weight.shape
        self.out_features, self.in_features = (cols, rows) if self.transposed else (rows, cols)
        self.format: _wire.FormatLike = None
        self.last_info: Optional[ExecutionInfo] = None
        self.last_backward_info: Optional[ExecutionInfo] = None

    @property
    def effective_format(self) -> _wire.FormatLike:
        """The format this layer's calls ask for: its own pin, else the session's
        (None: the model's policy chooses)."""
        return self.format if self.format is not None else self.session.format

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self.layer_name}: input has {x.shape[-1]} features, "
                             f"the layer takes {self.in_features}")
        return _RemoteLinear.apply(x, self.weight, self.bias, self)

    def remote_weight(self) -> torch.Tensor:
        """W as the daemon holds it, [out_features, in_features]."""
        return self.weight.detach().t() if self.transposed else self.weight.detach()

    def extra_repr(self) -> str:
        return (f"{self.layer_name!r}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class OffloadSession:
    """The link between a local model and its copy on the daemon. See `offload`."""

    def __init__(self, model: nn.Module, client: Client, name: str, policy: str = "",
                 grad_weight: str = "remote", format: _wire.FormatLike = None,
                 replace: bool = False, chunk_bytes: int = 1 << 20):
        if grad_weight not in ("remote", "local"):
            raise ValueError(f"grad_weight: expected 'remote' or 'local', got {grad_weight!r}")
        _wire.format_to_wire(format)  # validate now, not at the first forward
        self.model = model
        self.client = client
        self.model_name = name
        self.grad_weight = grad_weight
        self.format = format
        self.chunk_bytes = chunk_bytes
        self.weight_version = 0
        self.layers: Dict[str, OffloadedLinear] = {}
        self.totals: Dict[str, PhaseTotals] = {}
        # The work ledger: a counter per distinct GEMM, not a record per call, so a
        # long run costs memory by its shapes, not its steps.
        self._work: Dict[WorkKey, int] = collections.Counter()
        self._originals: Dict[str, nn.Module] = {}
        self._uploaded: Dict[str, Tuple[int, int]] = {}

        if _offloadable(model):
            raise ValueError("offload: the model is itself one linear layer; wrap it, e.g. "
                             "nn.Sequential(layer), so there is a parent to swap it in")
        originals = [(n, m) for n, m in model.named_modules() if _offloadable(m)]
        if not originals:
            raise ValueError("offload: the model has no nn.Linear to offload")
        for layer_name, module in originals:
            self._originals[layer_name] = module
            self.layers[layer_name] = OffloadedLinear(self, layer_name, module)
        if replace:
            try:
                client.delete_model(name)
            except MxserveError as error:
                if error.code.name != "NOT_FOUND":
                    raise
        client.register_model(name, [
            LayerSpec(n, l.out_features, l.in_features, l.bias is not None)
            for n, l in self.layers.items()], policy=policy)
        try:
            self._upload(list(self.layers))
        except BaseException:
            client.delete_model(name)
            raise
        self._swap({id(m): self.layers[n] for n, m in self._originals.items()})

    def _weights_version(self, layer: OffloadedLinear) -> Tuple[int, int]:
        return (layer.weight._version, -1 if layer.bias is None else layer.bias._version)

    def _upload(self, names: List[str]) -> int:
        weights = {}
        for n in names:
            layer = self.layers[n]
            bias = None if layer.bias is None else layer.bias.detach()
            weights[n] = (layer.remote_weight(), bias)
        result = self.client.upload_weights(self.model_name, weights, publish=True,
                                            chunk_bytes=self.chunk_bytes)
        for n in names:
            self._uploaded[n] = self._weights_version(self.layers[n])
        self.weight_version = result.weight_version
        return self.weight_version

    def _swap(self, replacements: Dict[int, nn.Module]) -> None:
        # Walk every parent, so a module reachable twice (tied layers) is swapped everywhere.
        for parent in list(self.model.modules()):
            for child_name, child in list(parent._modules.items()):
                if child is not None and id(child) in replacements:
                    parent._modules[child_name] = replacements[id(child)]

    def changed_layers(self) -> List[str]:
        """Layers whose weight or bias was modified in place since the last upload."""
        return [n for n, layer in self.layers.items()
                if self._weights_version(layer) != self._uploaded[n]]

    def sync_weights(self, force: bool = False) -> int:
        """Uploads the layers whose parameters changed (all with `force`) and
        publishes them as a new weight version; returns the version. Later forwards
        require at least that version. Nothing changed: no new version."""
        names = list(self.layers) if force else self.changed_layers()
        if names:
            self._upload(names)
        return self.weight_version

    @contextlib.contextmanager
    def local(self) -> Iterator[nn.Module]:
        """Inside, the model runs here with its original modules: the layers'
        math in the parameters' own precision, no RPC (a calibration pass, a
        reference). The offloaded modules are back on exit."""
        self._swap({id(layer): self._originals[n] for n, layer in self.layers.items()})
        try:
            yield self.model
        finally:
            self._swap({id(m): self.layers[n] for n, m in self._originals.items()})

    # --- remote calls, split to fit in messages ---------------------------------------

    def _message_budget(self) -> int:
        """Tensor bytes one request or response may carry."""
        return max(1, self.client.max_message_bytes - ENVELOPE_BYTES)

    def _rows_per_call(self, row_bytes: int) -> int:
        return max(1, self._message_budget() // max(1, row_bytes))

    def remote_forward(self, layer: OffloadedLinear, x2d: torch.Tensor, fmt, phase: Optional[str],
                       run: str) -> Tuple[torch.Tensor, ExecutionInfo]:
        """Y = X·Wᵀ + b on the daemon, in as many calls as the messages need (rows of
        X and Y are independent, so the pieces are exact). Returns Y and the first
        call's ExecutionInfo; every call is accounted."""
        row_bytes = max(layer.in_features * x2d.element_size(), layer.out_features * 4)
        step = self._rows_per_call(row_bytes)
        outputs, first = [], None
        for start in range(0, x2d.shape[0], step):
            result = self.client.forward(self.model_name, layer.layer_name, x2d[start:start + step],
                                         format=fmt, phase=phase, run=run,
                                         min_weight_version=self.weight_version)
            self.account(phase, result.info)
            # What ForwardItem::Answer books: this request's rows, even when the
            # daemon batched it with others.
            self._count(phase, run, result.info, "forward", x2d[start:start + step].shape[0],
                        layer.out_features, layer.in_features)
            layer.last_info = result.info
            first = first or result.info
            outputs.append(result.output)
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), first

    def remote_backward(self, layer: OffloadedLinear, dy: torch.Tensor, x2d: Optional[torch.Tensor],
                        need_x: bool, need_b: bool, ctx) -> Tuple[Optional[torch.Tensor], ...]:
        """(grad_input if need_x, grad_weight if x2d is given, grad_bias if need_b)
        from the daemon; None for what was not asked or, for grad_bias, not had (the
        caller sums dY locally then). One call when everything fits in a message;
        otherwise grad_input along the rows of dY and grad_weight (with grad_bias)
        along the rows of W."""
        if not (need_x or x2d is not None or need_b):
            return None, None, None
        m, n, k = dy.shape[0], layer.out_features, layer.in_features
        x_bytes = 0 if x2d is None else m * k * x2d.element_size()
        request_bytes = m * n * dy.element_size() + x_bytes
        response_bytes = m * k * 4 + (0 if x2d is None else (n * k + n) * 4)
        budget = self._message_budget()
        if request_bytes <= budget and response_bytes <= budget:
            result = self._backward_call(layer, dy, x2d, ctx)
            return (result.grad_input if need_x else None, result.grad_weight,
                    result.grad_bias if need_b else None)
        grad_x = grad_w = grad_b = None
        if need_x:
            step = self._rows_per_call(max(n * dy.element_size(), k * 4))
            grad_x = torch.cat([self._backward_call(layer, dy[start:start + step], None,
                                                    ctx).grad_input
                                for start in range(0, m, step)])
        if x2d is not None:
            # Each slice carries all of X and its columns of dY; it returns its rows.
            width = min((budget - x_bytes) // (m * dy.element_size()) if x_bytes < budget else 0,
                        budget // ((k + 1) * 4))
            if width < 1:
                raise ValueError(
                    f"{layer.layer_name}: grad_weight needs all of the input X ({m} x {k}, "
                    f"{x_bytes} bytes) in each request, more than a message holds "
                    f"({self.client.max_message_bytes} bytes, the client's max_message_bytes): "
                    f"run backward on fewer tokens at a time, or use grad_weight='local'")
            slices = [self._backward_call(layer, dy[:, start:start + width].contiguous(), x2d, ctx,
                                          (start, min(start + width, n)))
                      for start in range(0, n, width)]
            grad_w = torch.cat([piece.grad_weight for piece in slices])
            if need_b:
                grad_b = torch.cat([piece.grad_bias for piece in slices])
        return grad_x, grad_w, grad_b

    def _backward_call(self, layer: OffloadedLinear, dy, x2d, ctx, weight_rows=None):
        result = self.client.backward(self.model_name, layer.layer_name, dy, x2d,
                                      format=ctx.format, phase=ctx.phase, run=ctx.run,
                                      min_weight_version=ctx.version, weight_rows=weight_rows)
        layer.last_backward_info = result.info
        self.account(ctx.phase, result.info)
        # What BackwardItem books, one response for up to two GEMMs: grad_input
        # (dY·W: m × k, over n) unless a weight_rows slice, grad_weight (dYᵀ·X:
        # n × k, over m) when X was sent; n is this call's columns of dY.
        m, n, k = dy.shape[0], dy.shape[1], layer.in_features
        if weight_rows is None:
            self._count(ctx.phase, ctx.run, result.info, "grad_input", m, k, n)
        if x2d is not None:
            self._count(ctx.phase, ctx.run, result.info, "grad_weight", n, k, m)
        return result

    def account(self, phase: Optional[str], info: ExecutionInfo) -> None:
        """Adds one response's ExecutionInfo to `totals[phase]`."""
        self.totals.setdefault(phase or "unspecified", PhaseTotals()).add(info)

    def _count(self, phase: Optional[str], run: str, info: ExecutionInfo, kind: str, m: int,
               n: int, k: int) -> None:
        # Formats from the response: a policy's choice is known only there.
        self._work[WorkKey(phase or "unspecified", run or "", info.format, info.weight_format,
                           int(m), int(n), int(k), kind)] += 1

    def work(self, run: Optional[str] = None) -> List[Dict[str, Any]]:
        """The GEMMs the daemon booked for this session's calls, one JSON-ready row
        per distinct GEMM: {phase, run, x_format, w_format, m, n, k, kind, count}
        (mxserve.energy_model.WorkKey's fields and the count); only run `run`'s
        ("" the untagged calls) when given, else all."""
        return work_rows({key: count for key, count in self._work.items()
                          if run is None or key.run == run})

    def reset_work(self, run: Optional[str] = None) -> None:
        """Forgets the ledger: run `run`'s entries, or all of them."""
        if run is None:
            self._work.clear()
        else:
            for key in [key for key in self._work if key.run == run]:
                del self._work[key]

    def last_infos(self) -> Dict[str, Optional[ExecutionInfo]]:
        """{layer: ExecutionInfo of its latest forward}."""
        return {n: layer.last_info for n, layer in self.layers.items()}

    def restore(self, delete: bool = True) -> None:
        """Puts the original modules back (they hold the trained parameters) and,
        with `delete`, removes the model from the daemon."""
        self._swap({id(layer): self._originals[n] for n, layer in self.layers.items()})
        if delete:
            try:
                self.client.delete_model(self.model_name)
            except MxserveError as error:  # already gone (deleted, or replaced) is fine
                if error.code.name != "NOT_FOUND":
                    raise

    def __enter__(self) -> "OffloadSession":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def offload(model: nn.Module, client: Client, name: str, policy: str = "",
            grad_weight: str = "remote", format: _wire.FormatLike = None,
            replace: bool = False) -> OffloadSession:
    """Registers every nn.Linear of `model` on the daemon as model `name` (with
    `policy`, default the daemon's), uploads the weights as version 1 and swaps in
    OffloadedLinear modules. `format` pins one format for every layer and phase
    instead of the policy's choice; `replace` deletes an existing model of that name
    first. Returns the session (also a context manager that restores on exit)."""
    return OffloadSession(model, client, name, policy=policy, grad_weight=grad_weight,
                          format=format, replace=replace)
