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

Siblings that take one input — a Llama/Qwen2 block's q_proj, k_proj and v_proj,
its gate_proj and up_proj — run as one `Compute.LayersForward` when the first of
them is called (`fuse=True`, the default); the others' outputs are kept for their
own calls with the very same tensor object, unmodified (its version counter),
in the same phase, run, weight version and format, so a block costs 4 round
trips, not 7, with the same bits. A group whose siblings turn out to take
different inputs (cross-attention) is not fused again; inference-mode tensors
(no version counter) are not fused.

A call too large for one gRPC message (a vocabulary projection's logits, its
151936 × 896 weight gradient) is split into several, each under the client's
`max_message_bytes`: forwards and grad_input along the rows of X (M), grad_weight
along the rows of W (`weight_rows`). Every piece is bit-identical to the same part
of an unsplit call, and each is booked, so the energy ledger holds the whole.

`offload(..., compute="local")` runs every offloaded layer in this process instead,
on the layer's own device, with `mxserve.torch.emulator` — the daemon's numerics bit for
bit (MX and INT8 exactly, the float formats as the same FP32 fma chain) — in the
format the daemon's policy gives (phase, layer), with the phase's scale rule and
rounding, resolved once per session from `Policies.ResolvePolicy` and cached
(`refresh_policy()` asks again). Stochastic rounding draws from the seeds
daemon mode would send, piece by piece where a split call's pieces round
differently (stochastic rounding, NVFP4's tensor scale), so both modes give the
same bits. Nothing is
uploaded and `sync_weights()` has nothing to do: the weights are the trainer's own
tensors, quantized once per in-place change. The daemon stays the policy and
energy authority: the session registers the model's layers (never their weights)
and reports the calls it ran, batched, through `Telemetry.ReportWork`
(`flush_work()`, also when the buffer fills and on `restore()`), so the daemon's
energy ledger, `GetEnergyReport` and its metrics hold what they would had the
daemon run them — split exactly as daemon calls would have been — marked as
client-emulated.

`offload(..., optimizer=RemoteAdamW(lr=..., max_grad_norm=...))` runs the
optimizer where the GEMMs run: each offloaded layer's backward adds its weight
gradient to an accumulator on the daemon (`LayerBackward` with accumulate_grad:
nothing as large as W comes back), and `session.step(local_optimizer)` makes one
`Models.StepOptimizer` call — torch.optim.AdamW's step, bit for bit, on the
daemon's FP32 masters, published as the next version with nothing warmed — then
clips the trainer's own gradients by the coefficient the daemon worked out over
both sides and steps `local_optimizer` (build it over
`session.local_parameters()`, with the same hyperparameters). No weight crosses
the wire while training; the local copies of the offloaded weights go stale
until `session.fetch_weights()` (and `restore()`, which fetches) read the
masters back. A layer whose weight is also another module's parameter (a
vocabulary projection tied to the embedding) stays with the local optimizer:
its gradient comes back, the local optimizer steps the shared parameter, and
`step` uploads it (in its own dtype) — the one weight that still travels.

`session.work(run)` counts the GEMMs the daemon booked for this session's calls,
split pieces included, as JSON-ready rows {phase, run, x_format, w_format, m, n,
k, kind, count} with m, n, k the daemon's EstimateGemm arguments: the input of
`mxserve.energy_model.phase_joules` and `saving_range`, which re-price the same
work under other model parameters. `session.reset_work(run)` clears it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from mxserve import _wire
from mxserve.client import ENVELOPE_BYTES, Client, MxserveError
from mxserve.energy_model import WorkKey, work_rows
from mxserve.types import (ExecutionInfo, LayerSpec, OptimizerStepResult, ResolvedFormat,
                           WorkCall)

COMPUTE_MODES = ("daemon", "local")
# Sibling layers that take one input, fused into one LayersForward call (fuse=True):
# Llama/Qwen2 attention's projections and MLP's gate and up.
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Buffered work calls (after merging identical neighbours) that trigger a flush.
WORK_FLUSH_CALLS = 4096

__all__ = ["COMPUTE_MODES", "OffloadSession", "OffloadedLinear", "PhaseTotals", "RemoteAdamW",
           "offload", "offloadable"]


@dataclass(frozen=True)
class RemoteAdamW:
    """torch.optim.AdamW (amsgrad and maximize off) run by the daemon on its FP32
    masters of the offloaded layers, with torch.nn.utils.clip_grad_norm_'s global
    clipping over them and the trainer's own parameters when `max_grad_norm` is
    set. The trainer's own parameters need a local torch.optim.AdamW with the same
    lr, betas, eps and weight_decay (`local_optimizer(session)` builds one)."""
    lr: float = 1e-3
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    max_grad_norm: Optional[float] = None

    def local_optimizer(self, session: "OffloadSession") -> torch.optim.AdamW:
        """The local half: torch.optim.AdamW over `session.local_parameters()`."""
        return torch.optim.AdamW(session.local_parameters(), lr=self.lr, betas=self.betas,
                                 eps=self.eps, weight_decay=self.weight_decay)


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


@dataclass(frozen=True)
class _Call:
    """One LayerBackward request of a backward pass: the rows of dY it carries,
    the rows of W it is about (None: all, and grad_input comes back), and whether
    it carries X (grad_weight)."""
    rows: range
    weight_rows: Optional[Tuple[int, int]]
    with_input: bool


def _is_conv1d(module: nn.Module) -> bool:
    """transformers.pytorch_utils.Conv1D: y = x·W + b with W stored [in, out]."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and \
        getattr(module, "weight", None) is not None and module.weight.dim() == 2


def offloadable(module: nn.Module) -> bool:
    """Whether `offload` replaces this module: an nn.Linear, or transformers' Conv1D
    (GPT-2's projections). `mxserve.torch.profile` picks the same layers with it."""
    return isinstance(module, nn.Linear) or _is_conv1d(module)


class _OffloadedLinearFunction(torch.autograd.Function):
    """y = x·Wᵀ + b through the session — on the daemon, or here with its numerics
    (compute="local") — and the backward pass the same way."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer: "OffloadedLinear"):
        session = layer.session
        phase = session.client.current_phase
        # "" (not None) when untagged: the backward must not pick up whatever run
        # scope loss.backward() happens to be called in.
        run = session.client.current_run or ""
        x2d = x.reshape(-1, layer.in_features)
        y, ctx.format, ctx.version = session.layer_forward(layer, x2d, phase, run, source=x)
        ctx.layer, ctx.phase, ctx.run = layer, phase, run
        ctx.input_shape = x.shape
        if weight.requires_grad:
            ctx.save_for_backward(x2d)
        return y.to(device=x.device, dtype=x.dtype).reshape(*x.shape[:-1], layer.out_features)

    @staticmethod
    @once_differentiable  # the daemon's gradients are not themselves differentiable
    def backward(ctx, grad_y):
        layer: OffloadedLinear = ctx.layer
        session = layer.session
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dy = grad_y.reshape(-1, layer.out_features)
        x2d = ctx.saved_tensors[0] if ctx.saved_tensors else None
        stepped = layer.layer_name in session.remote_stepped  # (compute="daemon" only)
        if session.compute == "local":
            grad_x, grad_w, grad_b = session.local_backward(layer, dy, x2d, need_x, need_w,
                                                            need_b, ctx)
        elif stepped:
            # The gradients stay on the daemon, for session.step().
            grad_x, _, _ = session.remote_backward(layer, dy, x2d if need_w or need_b else None,
                                                   need_x, False, ctx, accumulate=True)
        else:
            remote = session.grad_weight == "remote"
            grad_x, grad_w, grad_b = session.remote_backward(
                layer, dy, x2d if need_w and remote else None, need_x, need_b and remote, ctx)
        if grad_x is not None:
            grad_x = grad_x.to(device=grad_y.device, dtype=grad_y.dtype).reshape(ctx.input_shape)
        if stepped:
            return grad_x, None, None, None
        grad_w, grad_b = layer.parameter_grads(dy, x2d, grad_w, grad_b, need_w, need_b)
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
    def spec(self) -> LayerSpec:
        """The layer as the daemon registers it."""
        return LayerSpec(self.layer_name, self.out_features, self.in_features,
                         self.bias is not None)

    @property
    def effective_format(self) -> _wire.FormatLike:
        """The format this layer's calls ask for: its own pin, else the session's
        (None: the model's policy chooses)."""
        return self.format if self.format is not None else self.session.format

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self.layer_name}: input has {x.shape[-1]} features, "
                             f"the layer takes {self.in_features}")
        return _OffloadedLinearFunction.apply(x, self.weight, self.bias, self)

    def remote_weight(self) -> torch.Tensor:
        """W as the daemon holds it, [out_features, in_features]."""
        return self.weight.detach().t() if self.transposed else self.weight.detach()

    def parameter_grads(self, dy, x2d, grad_w, grad_b, need_w: bool, need_b: bool):
        """grad_weight and grad_bias as the parameters take them: computed here in
        FP32 where the backward did not bring them (grad_weight="local"), W's
        layout and dtype, the parameters' device."""
        if need_w and grad_w is None:  # local: FP32 dYᵀ·X
            grad_w = dy.float().t() @ x2d.float()
        if need_b and grad_b is None:
            grad_b = dy.float().sum(0)
        if grad_w is not None:
            grad_w = (grad_w.t() if self.transposed else grad_w).to(self.weight.device,
                                                                    self.weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(self.bias.device, self.bias.dtype)
        return grad_w, grad_b

    def extra_repr(self) -> str:
        return (f"{self.layer_name!r}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class OffloadSession:
    """The link between a local model and its copy on the daemon. See `offload`."""

    def __init__(self, model: nn.Module, client: Client, name: str, policy: str = "",
                 grad_weight: str = "remote", format: _wire.FormatLike = None,
                 replace: bool = False, chunk_bytes: int = 1 << 20, compute: str = "daemon",
                 seed: int = 0, optimizer: Optional[RemoteAdamW] = None, fuse: bool = True):
        if grad_weight not in ("remote", "local"):
            raise ValueError(f"grad_weight: expected 'remote' or 'local', got {grad_weight!r}")
        if optimizer is not None and not isinstance(optimizer, RemoteAdamW):
            raise TypeError(f"optimizer: expected mxserve.torch.RemoteAdamW, got "
                            f"{type(optimizer).__name__}")
        if optimizer is not None and (compute != "daemon" or grad_weight != "remote"):
            raise ValueError("optimizer: a RemoteAdamW needs compute='daemon' and "
                             "grad_weight='remote' (the gradients must be on the daemon)")
        if compute not in COMPUTE_MODES:
            raise ValueError(f"compute: expected 'daemon' or 'local', got {compute!r}")
        _wire.format_to_wire(format)  # validate now, not at the first forward
        self.compute = compute
        self.model = model
        self.client = client
        # Every daemon call carries a seed drawn from (seed, call number): where the
        # policy (or `format`'s call) rounds stochastically, each call gets its own
        # random bits, and the same run of calls the same bits again.
        self._seed = seed
        self._calls = 0
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
        # compute="local": the policy's (phase, layer) → format, scale rule and
        # rounding, each layer's weight quantized per format (forward and transposed
        # layouts, keyed by the parameter's version), and the calls not yet reported
        # to the daemon.
        # fuse: the sibling groups whose forwards go as one LayersForward (layer →
        # its group, in FUSED_SIBLINGS' order: the first one's call fetches all),
        # and the outputs of the siblings not yet asked for: layer → (weak
        # reference to the input, key of the call, Y, ExecutionInfo).
        self.fused_groups: Dict[str, Tuple[str, ...]] = {}
        self._fused: Dict[str, Tuple[weakref.ref, tuple, torch.Tensor, ExecutionInfo]] = {}
        self._unfused: set = set()  # groups whose siblings proved to take different inputs
        # optimizer=RemoteAdamW: the layers the daemon steps (not tied to another
        # module's parameter), and whether their local copies are behind its masters.
        self.optimizer = optimizer
        self.remote_stepped: set = set()
        self.weights_stale = False
        self._policy_choices: Optional[Dict[Tuple[str, str], ResolvedFormat]] = None
        self._quantized: Dict[Tuple[str, str, bool], Tuple[Tuple[int, int], Any]] = {}
        self._pending: List[WorkCall] = []

        if offloadable(model):
            raise ValueError("offload: the model is itself one linear layer; wrap it, e.g. "
                             "nn.Sequential(layer), so there is a parent to swap it in")
        originals = [(n, m) for n, m in model.named_modules() if offloadable(m)]
        if not originals:
            raise ValueError("offload: the model has no nn.Linear to offload")
        for layer_name, module in originals:
            self._originals[layer_name] = module
            self.layers[layer_name] = OffloadedLinear(self, layer_name, module)
        if fuse and compute == "daemon":
            self.fused_groups = _sibling_groups(model, self.layers)
        if optimizer is not None:
            # A parameter another module also holds (a tied embedding) is stepped
            # here: the daemon cannot see that module's gradient.
            elsewhere = collections.Counter(
                id(p) for m in model.modules() if not offloadable(m)
                for p in m.parameters(recurse=False))
            # ... and so is one two offloaded layers share: the daemon holds two masters.
            for layer in self.layers.values():
                for p in (layer.weight, layer.bias):
                    if p is not None:
                        elsewhere[id(p)] += 1
            for n, layer in self.layers.items():
                params = [layer.weight] + ([] if layer.bias is None else [layer.bias])
                # The daemon steps weight and bias together: both must train (a
                # frozen weight sends no input back; a frozen bias would move).
                if all(p.requires_grad for p in params) and \
                        all(elsewhere[id(p)] == 1 for p in params):
                    self.remote_stepped.add(n)
            if not self.remote_stepped:
                raise ValueError("optimizer: no offloaded layer can be stepped on the daemon "
                                 "(each is tied to another module's parameter or frozen); "
                                 "use a local optimizer")
        if replace:
            try:
                client.delete_model(name)
            except MxserveError as error:
                if error.code.name != "NOT_FOUND":
                    raise
        client.register_model(name, [l.spec for l in self.layers.values()], policy=policy)
        try:
            if compute == "daemon":
                self._upload(list(self.layers))
            else:
                self.refresh_policy()
        except BaseException:
            client.delete_model(name)
            raise
        self._swap({id(m): self.layers[n] for n, m in self._originals.items()})

    def _weights_version(self, layer: OffloadedLinear) -> Tuple[int, int]:
        return (layer.weight._version, -1 if layer.bias is None else layer.bias._version)

    def _upload(self, names: List[str], warm_up=None) -> int:
        weights = {}
        for n in names:
            layer = self.layers[n]
            bias = None if layer.bias is None else layer.bias.detach()
            weights[n] = (layer.remote_weight(), bias)
        result = self.client.upload_weights(self.model_name, weights, publish=True,
                                            chunk_bytes=self.chunk_bytes, warm_up=warm_up)
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
        """Layers whose weight or bias was modified in place since the last upload
        (none with compute="local": nothing is uploaded, nothing goes stale)."""
        if self.compute == "local":
            return []
        return [n for n, layer in self.layers.items()
                if self._weights_version(layer) != self._uploaded[n]]

    def sync_weights(self, force: bool = False, warm_up=None) -> int:
        """Uploads the layers whose parameters changed (all with `force`) and
        publishes them as a new weight version, warming `warm_up` (as
        Client.upload_weights: None, the previous version's copies; "none"; a list
        of formats); returns the version. Later forwards require at least that
        version. Nothing changed: no new version. With compute="local" there is
        nothing to upload (the layers read the parameters themselves); returns 0.
        With a RemoteAdamW, `force` while the local copies are stale (after a step,
        before fetch_weights) is refused: it would send old weights up."""
        if self.compute == "local":
            return self.weight_version
        if force and self.weights_stale:
            raise RuntimeError("sync_weights(force=True): the daemon's optimizer has stepped "
                               "weights this process has not fetched; fetch_weights() first")
        names = list(self.layers) if force else self.changed_layers()
        if names:
            self._upload(names, warm_up)
        return self.weight_version

    # --- optimizer=RemoteAdamW --------------------------------------------------------

    def local_parameters(self) -> List[nn.Parameter]:
        """The model's parameters the trainer steps itself: all but the weights
        and biases of the layers the daemon steps (`remote_stepped`)."""
        remote = {id(p) for n in self.remote_stepped for p in
                  (self.layers[n].weight, self.layers[n].bias) if p is not None}
        return [p for p in self.model.parameters() if id(p) not in remote]

    def step(self, local_optimizer: Optional[torch.optim.Optimizer] = None,
             warm_up="none") -> "OptimizerStepResult":
        """One optimizer step of the whole model: Models.StepOptimizer on the daemon
        (the RemoteAdamW's hyperparameters, clipping over the daemon's gradients and
        the local ones), then the local gradients multiplied by the coefficient it
        returns (as clip_grad_norm_ multiplies them), `local_optimizer.step()`, and
        an upload of the tied layers it changed. The new version has `warm_up`
        warmed (default none: PPO epochs; pass "previous" before rollouts to have
        the daemon quantize ahead). Gradients are not zeroed."""
        if self.optimizer is None:
            raise RuntimeError("step: the session has no RemoteAdamW (offload(..., "
                               "optimizer=RemoteAdamW(...)))")
        local = [p for p in self.local_parameters() if p.grad is not None]
        other = sum(float(p.grad.detach().double().pow(2).sum()) for p in local)
        opt = self.optimizer
        result = self.client.step_optimizer(
            self.model_name, lr=opt.lr, betas=opt.betas, eps=opt.eps,
            weight_decay=opt.weight_decay, max_grad_norm=opt.max_grad_norm,
            other_grad_sq_norm=other, warm_up=warm_up)
        self.weight_version = result.weight_version
        # A step with no remote gradient publishes nothing: nothing to fetch.
        self.weights_stale = self.weights_stale or bool(result.grad_sq_norms)
        if opt.max_grad_norm:
            with torch.no_grad():
                for p in local:
                    p.grad.mul_(result.clip_coefficient)  # an FP32 scalar, as torch's
        if local_optimizer is not None:
            local_optimizer.step()
        tied = [n for n in self.changed_layers() if n not in self.remote_stepped]
        if tied:
            self._upload(tied, warm_up)
        return result

    def discard_gradients(self) -> int:
        """Forgets the gradients accumulated on the daemon since the last step (call
        it when a backward pass failed midway: its finished layers' gradients are
        already there and would count twice after a retry); returns how many
        layers had one. The local gradients are the caller's to zero."""
        return len(self.client.discard_gradients(self.model_name).grad_sq_norms)

    def fetch_weights(self) -> int:
        """Reads the daemon's masters of the layers it steps into the local
        parameters (in place, in their dtype); returns the weight version read.
        Costs what an upload of those layers costs; call it before evaluating
        or checkpointing locally (`restore` calls it)."""
        if not self.weights_stale:
            return self.weight_version
        with torch.no_grad():
            for n in sorted(self.remote_stepped):
                layer = self.layers[n]
                spec = layer.spec
                weight = torch.from_numpy(self.client.download_weights(
                    self.model_name, n, spec=spec))
                layer.weight.copy_(weight.t() if layer.transposed else weight)
                if layer.bias is not None:
                    layer.bias.copy_(torch.from_numpy(self.client.download_weights(
                        self.model_name, n, bias=True, spec=spec)))
                self._uploaded[n] = self._weights_version(layer)
        self.weights_stale = False
        return self.weight_version

    @contextlib.contextmanager
    def local(self) -> Iterator[nn.Module]:
        """Inside, the model runs here with its original modules: the layers'
        math in the parameters' own precision, no RPC (a calibration pass, a
        reference). The offloaded modules are back on exit. With a RemoteAdamW,
        the daemon's stepped weights are fetched first."""
        if self.weights_stale:
            self.fetch_weights()
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

    def layer_forward(self, layer: OffloadedLinear, x2d: torch.Tensor, phase: Optional[str],
                      run: str, source: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, _wire.FormatLike, int]:
        """Y (FP32) for one forward, where the session computes; with the format and
        weight version its backward must use. `source`: the tensor the module was
        called with (x2d is its 2-D view), which fused siblings are matched by."""
        if self.compute == "local":
            fmt = self.local_format(layer, phase)
            return self.local_forward(layer, x2d, fmt, phase, run), fmt, self.weight_version
        fmt = layer.effective_format
        group = self.fused_groups.get(layer.layer_name)
        if (group is not None and group not in self._unfused and source is not None
                and not source.is_inference()):  # inference tensors keep no version
            # The very tensor the first sibling got (held by a weak reference, so
            # never another one at its address), not modified since, in the same
            # phase, run, weight version and format.
            key = (source._version, phase, run, self.weight_version, fmt)
            held = self._fused.pop(layer.layer_name, None)
            if held is not None:
                if held[0]() is source and held[1] == key:
                    return held[2], fmt, held[3].weight_version
                # Siblings on different inputs (cross-attention): stop fusing them.
                self._unfused.add(group)
                self._drop_fused(group)
            elif layer.layer_name == group[0]:
                self._drop_fused(group)
                fused = self._fused_forward(layer, group, x2d, fmt, phase, run,
                                            weakref.ref(source), key)
                if fused is not None:
                    return fused
        y, info = self.remote_forward(layer, x2d, fmt, phase, run)
        return y, fmt, info.weight_version

    def _drop_fused(self, group: Tuple[str, ...]) -> None:
        for name in group:
            self._fused.pop(name, None)

    def _book_forward(self, layer: OffloadedLinear, phase: Optional[str], run: str,
                      info: ExecutionInfo, rows: int) -> None:
        """One LayerForward answer in the session's totals and work ledger: what
        ForwardItem::Answer books, this request's rows even when the daemon
        batched it with others."""
        self.account(phase, info)
        self._count(phase, run, info, "forward", rows, layer.out_features, layer.in_features)
        layer.last_info = info

    def _fused_forward(self, layer: OffloadedLinear, group: Tuple[str, ...], x2d: torch.Tensor,
                       fmt, phase: Optional[str], run: str, source: weakref.ref, key: tuple):
        """Y of `layer` from one LayersForward of its whole group, keeping its
        siblings' outputs for their own calls; None (run it alone) where the group
        does not share a format or its call would not fit in a message."""
        members = [self.layers[n] for n in group]
        if any(m.effective_format != fmt for m in members):
            return None
        m = x2d.shape[0]
        budget = self._message_budget()
        if (x2d.numel() * x2d.element_size() > budget or
                m * sum(s.out_features for s in members) * 4 > budget):
            return None
        seeds = [self._next_seed() for _ in members]  # each its own, as unfused calls draw
        results = self.client.forward_many(self.model_name, list(group), x2d, format=fmt,
                                           phase=phase, run=run,
                                           min_weight_version=self.weight_version, seeds=seeds,
                                           output_dtype=_output_dtype(x2d))
        mine = None
        for member, result in zip(members, results):
            self._book_forward(member, phase, run, result.info, m)
            if member is layer:
                mine = result
            else:
                self._fused[member.layer_name] = (source, key, result.output, result.info)
        return mine.output, fmt, mine.info.weight_version

    def _next_seed(self) -> int:
        """splitmix64 of (session seed, call number): a fresh 64-bit seed per call."""
        self._calls += 1
        z = (self._seed * 0x9E3779B97F4A7C15 + self._calls * 0xBF58476D1CE4E5B9) & (2 ** 64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2 ** 64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2 ** 64 - 1)
        return z ^ (z >> 31)

    def remote_forward(self, layer: OffloadedLinear, x2d: torch.Tensor, fmt, phase: Optional[str],
                       run: str) -> Tuple[torch.Tensor, ExecutionInfo]:
        """Y = X·Wᵀ + b on the daemon, in as many calls as the messages need (rows of
        X and Y are independent, so the pieces are exact). Returns Y and the first
        call's ExecutionInfo; every call is accounted."""
        outputs, first = [], None
        for rows in self._forward_pieces(layer, x2d.shape[0], x2d.element_size()):
            result = self.client.forward(self.model_name, layer.layer_name,
                                         x2d[rows.start:rows.stop], format=fmt, phase=phase,
                                         run=run, min_weight_version=self.weight_version,
                                         seed=self._next_seed(),
                                         output_dtype=_output_dtype(x2d))
            self._book_forward(layer, phase, run, result.info, len(rows))
            first = first or result.info
            outputs.append(result.output)
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), first

    def _forward_pieces(self, layer: OffloadedLinear, m: int, element_size: int) -> List[range]:
        """The rows of X each LayerForward call carries: as many as a message holds
        (rows of X and Y are independent, so the pieces are exact)."""
        step = self._rows_per_call(max(layer.in_features * element_size, layer.out_features * 4))
        return [range(start, min(m, start + step)) for start in range(0, m, step)]

    def _backward_plan(self, layer: OffloadedLinear, m: int, dy_size: int,
                       x_size: Optional[int], need_x: bool, need_b: bool) -> List["_Call"]:
        """The LayerBackward calls a backward takes: one when everything fits in a
        message (it brings grad_input, and grad_weight when X is sent); otherwise
        grad_input along the rows of dY, and grad_weight (with grad_bias) along the
        rows of W, each slice carrying all of X. `x_size`: X's element size, None
        when grad_weight is not asked. An accumulated grad_weight is planned the
        same: the daemon still makes it whole per call, bounded as an answer is."""
        if not (need_x or x_size is not None or need_b):
            return []
        n, k = layer.out_features, layer.in_features
        x_bytes = 0 if x_size is None else m * k * x_size
        request_bytes = m * n * dy_size + x_bytes
        response_bytes = m * k * 4 + (0 if x_size is None else (n * k + n) * 4)
        budget = self._message_budget()
        if request_bytes <= budget and response_bytes <= budget:
            return [_Call(range(m), None, x_size is not None)]
        calls = []
        if need_x:
            step = self._rows_per_call(max(n * dy_size, k * 4))
            calls += [_Call(range(start, min(m, start + step)), None, False)
                      for start in range(0, m, step)]
        if x_size is not None:
            width = min((budget - x_bytes) // (m * dy_size) if x_bytes < budget else 0,
                        budget // ((k + 1) * 4))
            if width < 1:
                raise ValueError(
                    f"{layer.layer_name}: grad_weight needs all of the input X ({m} x {k}, "
                    f"{x_bytes} bytes) in each request, more than a message holds "
                    f"({self.client.max_message_bytes} bytes, the client's max_message_bytes): "
                    f"run backward on fewer tokens at a time, or use grad_weight='local'")
            calls += [_Call(range(m), (start, min(start + width, n)), True)
                      for start in range(0, n, width)]
        return calls

    def remote_backward(self, layer: OffloadedLinear, dy: torch.Tensor, x2d: Optional[torch.Tensor],
                        need_x: bool, need_b: bool, ctx, accumulate: bool = False
                        ) -> Tuple[Optional[torch.Tensor], ...]:
        """(grad_input if need_x, grad_weight if x2d is given, grad_bias if need_b)
        from the daemon; None for what was not asked or, for grad_bias, not had (the
        caller sums dY locally then), in the calls `_backward_plan` gives. With
        `accumulate`, grad_weight and grad_bias are added up on the daemon instead
        (None here)."""
        plan = self._backward_plan(layer, dy.shape[0], dy.element_size(),
                                   None if x2d is None else x2d.element_size(), need_x, need_b)
        if len(plan) == 1 and plan[0].weight_rows is None:
            result = self._backward_call(layer, dy, x2d if plan[0].with_input else None, ctx,
                                         seed=self._next_seed(), accumulate=accumulate)
            return (result.grad_input if need_x else None, result.grad_weight,
                    result.grad_bias if need_b else None)
        grad_x, slices = [], []
        slice_seed = self._next_seed()  # one for every weight_rows slice: the unsplit bits
        for call in plan:
            if call.weight_rows is None:
                rows = dy[call.rows.start:call.rows.stop]
                grad_x.append(self._backward_call(layer, rows, None, ctx,
                                                  seed=self._next_seed()).grad_input)
            else:
                start, stop = call.weight_rows
                slices.append(self._backward_call(layer, dy[:, start:stop].contiguous(), x2d, ctx,
                                                  call.weight_rows, seed=slice_seed,
                                                  accumulate=accumulate))
        if accumulate:
            return (torch.cat(grad_x) if grad_x else None), None, None
        grad_w = torch.cat([piece.grad_weight for piece in slices]) if slices else None
        grad_b = torch.cat([piece.grad_bias for piece in slices]) if slices and need_b else None
        return (torch.cat(grad_x) if grad_x else None), grad_w, grad_b

    def _backward_call(self, layer: OffloadedLinear, dy, x2d, ctx, weight_rows=None, *,
                       seed: int, accumulate: bool = False):
        result = self.client.backward(self.model_name, layer.layer_name, dy, x2d,
                                      format=ctx.format, phase=ctx.phase, run=ctx.run,
                                      min_weight_version=ctx.version, weight_rows=weight_rows,
                                      seed=seed, accumulate_grad=accumulate and x2d is not None)
        layer.last_backward_info = result.info
        self.account(ctx.phase, result.info)
        self._count_backward(ctx.phase, ctx.run, result.info, layer, dy.shape[0], dy.shape[1],
                             weight_rows is None, x2d is not None)
        return result

    def _count_backward(self, phase: Optional[str], run: str, info: ExecutionInfo,
                        layer: OffloadedLinear, m: int, n: int, input_grad: bool,
                        weight_grad: bool) -> None:
        """What BackwardItem books, one response for up to two GEMMs: grad_input
        (dY·W: m × k, over n) unless a weight_rows slice, grad_weight (dYᵀ·X: n × k,
        over m) when X was sent; n is the call's columns of dY."""
        k = layer.in_features
        if input_grad:
            self._count(phase, run, info, "grad_input", m, k, n)
        if weight_grad:
            self._count(phase, run, info, "grad_weight", n, k, m)


    # --- compute="local": the emulator, here -------------------------------------------

    def refresh_policy(self) -> Dict[Tuple[str, str], str]:
        """Asks the daemon for the model's (phase, layer) → format table again (after
        `set_active_policy`, or a policy's replacement), with each phase's scale
        rule and rounding; local layers use them. Returns the format table."""
        resolved = self.client.resolve_policy(self.model_name)
        self._policy_choices = resolved.choices()
        return resolved.table()

    def _policy_choice(self, layer: OffloadedLinear, phase: Optional[str]) -> ResolvedFormat:
        if phase is None:
            raise ValueError(f"{layer.layer_name}: phase: required for compute='local' (as the "
                             "daemon requires it); run the model inside "
                             "client.phase('rollout' | 'reward' | 'update')")
        if self._policy_choices is None:
            self.refresh_policy()
        choice = self._policy_choices.get((phase, layer.layer_name))
        if choice is None:
            raise ValueError(f"{layer.layer_name}: the daemon's policy table for model "
                             f"{self.model_name!r} has no entry for phase {phase!r}")
        return choice

    def local_format(self, layer: OffloadedLinear, phase: Optional[str]) -> str:
        """The format a local call runs in: the layer's or the session's pin, else the
        policy's for (phase, layer), canonical."""
        choice = self._policy_choice(layer, phase)
        pinned = layer.effective_format
        if pinned is not None:  # an alias or a wire value: canonical, as the daemon answers
            return _wire.format_name(_wire.format_to_wire(pinned))
        return choice.format

    def local_numerics(self, layer: OffloadedLinear, phase: Optional[str]) -> Tuple[str, str]:
        """(scale rule, rounding) of the operands a local call brings: the policy's
        for the phase, as the daemon applies them to a layer call that names
        neither — a pinned format included."""
        choice = self._policy_choice(layer, phase)
        return choice.scale_rule, choice.rounding

    @staticmethod
    def _split_matters(fmt: str, rounding: str) -> bool:
        """Whether daemon calls split into pieces give other bits than one whole
        call, so a local call must compute piece by piece: stochastic draws are
        keyed by each request's seed and index, and NVFP4 takes its tensor scale
        over the operand a request brings."""
        return rounding == "stochastic" or fmt == "NVFP4"

    def _weight_operand(self, layer: OffloadedLinear, fmt: str, transposed: bool):
        """W [N, K] (or Wᵀ [K, N]) quantized to `fmt`, cached until the parameter
        changes in place (its version) or is replaced."""
        from mxserve.torch import emulator

        key = (layer.layer_name, fmt, transposed)
        version = (id(layer.weight), layer.weight._version)
        cached = self._quantized.get(key)
        if cached is None or cached[0] != version:
            w = layer.remote_weight()
            cached = (version, emulator.quantize(w.t() if transposed else w, fmt))
            self._quantized[key] = cached
        return cached[1]

    def local_forward(self, layer: OffloadedLinear, x2d: torch.Tensor, fmt: str,
                      phase: str, run: str) -> torch.Tensor:
        """Y = X·Wᵀ + b with the emulator on X's device, FP32, with the policy's scale
        rule and rounding; booked as the LayerForward calls the daemon would have
        served, and with their bits: each call's seed is the one daemon mode would
        send, and where the split changes bits the pieces are computed apart."""
        from mxserve.torch import emulator

        rule, rounding = self.local_numerics(layer, phase)
        pieces = self._forward_pieces(layer, x2d.shape[0], x2d.element_size())
        seeds = [self._next_seed() for _ in pieces]  # one per request, as daemon mode's
        if len(pieces) == 1 or not self._split_matters(fmt, rounding):
            pieces, seeds = [range(x2d.shape[0])], seeds[:1]
        started = time.perf_counter()
        bias = None if layer.bias is None else layer.bias.detach()
        w = self._weight_operand(layer, fmt, False)
        outputs = [emulator.linear(
            emulator.quantize(x2d[rows.start:rows.stop], fmt, rounding, rule, seed=seed,
                              stream=emulator.STREAMS["forward_input"]), w, bias)
            for rows, seed in zip(pieces, seeds)]
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        seconds = time.perf_counter() - started
        for rows in self._forward_pieces(layer, x2d.shape[0], x2d.element_size()):
            m = len(rows)
            estimate = _estimate(fmt, m, layer.out_features, layer.in_features)
            info = self._local_info(fmt, estimate, seconds * m / max(1, x2d.shape[0]))
            layer.last_info = info
            self.account(phase, info)
            self._count(phase, run, info, "forward", m, layer.out_features, layer.in_features)
            self._book(WorkCall(phase=phase, run=run, model=self.model_name,
                                layer=layer.layer_name, call="forward", format=fmt, m=m,
                                n=layer.out_features))
        return y

    def local_backward(self, layer: OffloadedLinear, dy: torch.Tensor,
                       x2d: Optional[torch.Tensor], need_x: bool, need_w: bool, need_b: bool,
                       ctx) -> Tuple[Optional[torch.Tensor], ...]:
        """grad_input, grad_weight and grad_bias as `remote_backward` returns them
        (None for what is not computed here), with the emulator; booked as the
        LayerBackward calls of `_backward_plan`."""
        from mxserve.torch import emulator

        fmt, phase, run = ctx.format, ctx.phase, ctx.run
        emulated_w = need_w and self.grad_weight == "remote"
        plan = self._backward_plan(layer, dy.shape[0], dy.element_size(),
                                   x2d.element_size() if emulated_w else None, need_x,
                                   need_b and self.grad_weight == "remote")
        rule, rounding = self.local_numerics(layer, phase)
        # The seeds daemon mode sends (remote_backward): one for an unsplit call;
        # else one shared by the weight_rows slices, then one per grad_input piece.
        if len(plan) == 1 and plan[0].weight_rows is None:
            slice_seed = self._next_seed()
            input_pieces, input_seeds = [range(dy.shape[0])], [slice_seed]
        else:
            slice_seed = self._next_seed()
            input_pieces = [c.rows for c in plan if c.weight_rows is None]
            input_seeds = [self._next_seed() for _ in input_pieces]
        split = self._split_matters(fmt, rounding)
        if not split and len(input_pieces) > 1:  # the same bits in one piece
            input_pieces, input_seeds = [range(dy.shape[0])], input_seeds[:1]
        started = time.perf_counter()
        grad_x = grad_w = grad_b = None
        if need_x:
            wt = self._weight_operand(layer, fmt, True)
            parts = [emulator.grad_input(dy[rows.start:rows.stop], wt, fmt, rounding, seed=seed,
                                         scale_rule=rule)
                     for rows, seed in zip(input_pieces, input_seeds)]
            grad_x = parts[0] if len(parts) == 1 else torch.cat(parts)
        if emulated_w:
            slices = [c.weight_rows for c in plan if c.weight_rows is not None]
            if split and slices:
                grad_w = torch.cat([self._local_grad_weight_slice(dy, x2d, fmt, rule, rounding,
                                                                  slice_seed, rows)
                                    for rows in slices])
            else:
                grad_w = emulator.grad_weight(dy, x2d, fmt, rounding, seed=slice_seed,
                                              scale_rule=rule)
        if need_b and self.grad_weight == "remote":
            grad_b = emulator.column_sums(dy)
        seconds = time.perf_counter() - started
        n, k = layer.out_features, layer.in_features
        for call in plan:
            rows = len(call.rows)
            cols = n if call.weight_rows is None else call.weight_rows[1] - call.weight_rows[0]
            with_input_grad = call.weight_rows is None
            estimate = _sum_estimates(
                _estimate(fmt, rows, k, cols) if with_input_grad else None,
                _estimate(fmt, cols, k, rows) if call.with_input else None)
            info = self._local_info(fmt, estimate, seconds / len(plan))
            layer.last_backward_info = info
            self.account(phase, info)
            self._count_backward(phase, run, info, layer, rows, cols, with_input_grad,
                                 call.with_input)
            self._book(WorkCall(phase=phase, run=run, model=self.model_name,
                                layer=layer.layer_name, call="backward", format=fmt, m=rows,
                                n=cols, grad_input=with_input_grad, grad_weight=call.with_input))
        return grad_x, grad_w, grad_b

    @staticmethod
    def _local_grad_weight_slice(dy: torch.Tensor, x2d: torch.Tensor, fmt: str, rule: str,
                                 rounding: str, seed: int, rows: Tuple[int, int]) -> torch.Tensor:
        """Rows [begin, end) of grad_weight as a LayerBackward with weight_rows gives
        them: dY's columns there, drawing the whole dY's stochastic bits (index
        offset begin, row stride N), NVFP4 under the slice's own tensor scale."""
        from mxserve.torch import emulator

        begin, end = rows
        dyt = emulator.quantize(dy[:, begin:end].t(), fmt, rounding, rule, seed=seed,
                                stream=emulator.STREAMS["grad_output_columns"], transposed=True,
                                index_offset=begin, index_row_stride=dy.shape[1])
        xt = emulator.quantize(x2d.t(), fmt, rounding, rule, seed=seed,
                               stream=emulator.STREAMS["input_columns"], transposed=True)
        return emulator.linear(dyt, xt)

    def _local_info(self, fmt: str, estimate, seconds: float) -> ExecutionInfo:
        return ExecutionInfo(format=fmt, weight_format=fmt, backend="local", kernel="emulator",
                             weight_version=self.weight_version, batch_size=1, queue_seconds=0.0,
                             compute_seconds=seconds, model_seconds=estimate.seconds,
                             model_joules=estimate.joules)

    def _book(self, call: WorkCall) -> None:
        """Buffers a call for the daemon's ledger, merged with an identical
        predecessor (the daemon books each of `count` in order, so nothing changes)."""
        if self._pending and dataclasses.replace(self._pending[-1], count=call.count) == call:
            last = self._pending[-1]
            self._pending[-1] = dataclasses.replace(last, count=last.count + call.count)
        else:
            self._pending.append(call)
        if len(self._pending) >= WORK_FLUSH_CALLS:
            self.flush_work()

    def flush_work(self) -> int:
        """Reports the buffered local calls to the daemon (Telemetry.ReportWork), which
        books them as it books its own; returns how many calls were reported. Call
        it before reading the daemon's energy report."""
        if not self._pending:
            return 0
        pending, self._pending = self._pending, []
        try:
            return self.client.report_work(pending).calls
        except BaseException:
            self._pending = pending + self._pending  # nothing booked: keep them
            raise

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
        with `delete`, removes the model from the daemon — after reporting any
        local calls not yet reported. With a RemoteAdamW, the daemon's stepped
        weights are fetched into them first."""
        try:
            if self.weights_stale:
                self.fetch_weights()
        finally:
            self._swap({id(layer): self._originals[n] for n, layer in self.layers.items()})
        self.flush_work()
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
            replace: bool = False, compute: str = "daemon", seed: int = 0,
            optimizer: Optional[RemoteAdamW] = None, fuse: bool = True) -> OffloadSession:
    """Registers every nn.Linear of `model` on the daemon as model `name` (with
    `policy`, default the daemon's), uploads the weights as version 1 and swaps in
    OffloadedLinear modules. `format` pins one format for every layer and phase
    instead of the policy's choice; `replace` deletes an existing model of that name
    first. `compute="local"` runs the layers here with the daemon's numerics
    (`mxserve.torch.emulator`) instead: no upload, the daemon's policy and energy ledger
    still in charge (see the module's docstring). `seed` keys the stochastic
    rounding a policy may ask for (its "roundings"): each daemon call gets its own
    seed from it and the call's number. `optimizer=RemoteAdamW(...)` steps the
    offloaded layers on the daemon (`session.step`; see the module's docstring).
    `fuse` (daemon compute): sibling layers that take one input (q, k and v;
    gate and up) run as one LayersForward when the first of them is called, the
    others' outputs kept for their own calls on the same, unchanged tensor.
    Returns the session (also a context manager that restores on exit)."""
    return OffloadSession(model, client, name, policy=policy, grad_weight=grad_weight,
                          format=format, replace=replace, compute=compute, seed=seed,
                          optimizer=optimizer, fuse=fuse)


def _output_dtype(x: torch.Tensor) -> Optional[str]:
    """A BF16 model's outputs travel as BF16: the daemon rounds them to nearest
    even, as the forward's `.to(x.dtype)` would, for half the bytes."""
    return "bf16" if x.dtype == torch.bfloat16 else None


def _sibling_groups(model: nn.Module, layers: Dict[str, "OffloadedLinear"]
                    ) -> Dict[str, Tuple[str, ...]]:
    """layer → its group of offloaded siblings that take one input (FUSED_SIBLINGS
    under one parent, the same in_features), for every layer in such a group."""
    groups: Dict[str, Tuple[str, ...]] = {}
    for parent_name, parent in model.named_modules():
        for names in FUSED_SIBLINGS:
            full = [f"{parent_name}.{n}" if parent_name else n for n in names
                    if n in parent._modules]
            members = [n for n in full if n in layers]
            if len(members) < 2 or len({layers[n].in_features for n in members}) != 1:
                continue
            for n in members:
                groups[n] = tuple(members)
    return groups


def _estimate(fmt: str, m: int, n: int, k: int):
    """The FPGA model's estimate of one GEMM (fpga/model/energy_model.json, as the
    daemon's default), for the session's local totals; zeros without the file."""
    from mxserve import energy_model

    params = _energy_params()
    if params is None:
        return energy_model.GemmEstimate(0.0, 0.0, 0.0, 0.0, 0.0)
    return energy_model.estimate_gemm(params, fmt, fmt, m, n, k)


def _sum_estimates(a, b):
    """fpga_model's Sum of two estimates (either may be None), field by field."""
    if a is None or b is None:
        return a if b is None else b
    return type(a)(*(x + y for x, y in zip(a, b)))


_ENERGY_PARAMS: List[Any] = []


def _energy_params():
    if not _ENERGY_PARAMS:
        from mxserve import energy_model
        try:
            _ENERGY_PARAMS.append(energy_model.load_energy_model())
        except (energy_model.EnergyModelError, OSError):
            _ENERGY_PARAMS.append(None)
    return _ENERGY_PARAMS[0]
