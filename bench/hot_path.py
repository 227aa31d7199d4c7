#!/usr/bin/python3
"""The trainer's hot path on a Qwen2.5-0.5B-shaped model (issue 20), as ratios.

Builds a Qwen2 model of Qwen2.5-0.5B's shape (24 blocks, hidden 896, 14 heads,
2 KV heads, intermediate 4864, vocabulary 151936, tied embeddings: 494 M
parameters, 169 linear layers) with random weights (nothing is downloaded),
offloads its nn.Linear layers with mxserve.torch.offload, and measures, each
beside its peer in the same run:

  1. rollout decode step: one new token for each of --batch sequences after a
     --prompt-token KV cache (prefilled locally, not timed), offloaded in phase
     rollout (cpu backend, --kernel-threads, policy --policy) against the same
     step in local torch BF16.                        target: ratio <= 1.0
  2. per-layer-call overhead: client.forward of an 8x896 input through one
     896x896 layer on a null-backend daemon (no compute), ms per call.
                                                      target: <= 0.15 ms
  3. sync_weights(): every parameter modified in place, then the upload and
     publish of all offloaded weights (target <= 3 s); then of 10 % of the
     linear layers, spread evenly over the blocks (target <= 0.5 s).
  4. PPO update step: forward and backward of --batch x --update-tokens tokens
     in phase update, an AdamW step and sync_weights(), against the same step in
     local torch FP32 (no sync).                      target: ratio <= 1.5
     The loss is the token cross-entropy against random target tokens (minus
     the mean log-probability: a policy-gradient loss with advantage 1).
  5. the same PPO update step with the optimizer on the daemon
     (offload(..., optimizer=RemoteAdamW), issue 37): the gradients accumulate
     there, one StepOptimizer call steps and publishes (nothing warmed), the
     local AdamW steps the rest; the bytes of weights that crossed the wire are
     counted (only a tied projection's upload).     target: ratio <= 1.5

Every figure is the best of --repeat timed runs after --warmup untimed ones,
the sides interleaved run by run; ratios divide best by best (on a shared
machine noise only adds time). Torch runs on --threads threads on both sides.

It starts its own daemons on free 127.0.0.1 ports (--backend cpu and
--backend null) and stops them on exit, Ctrl-C included; --server and
--null-server use running ones instead. Progress goes to stderr, the report to
stdout, every figure to --json. Exit status 0 whether or not the targets are
met; 1 when a measurement failed, 2 when a daemon could not be started.

Run after `make build` (or `make bench-hot-path`):
    /usr/bin/python3 bench/hot_path.py                    # the 0.5B shape, ~7 min
    /usr/bin/python3 bench/hot_path.py --scale small      # 2 small blocks, seconds
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import ctypes
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))  # daemon_process

try:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import mxserve
    from daemon_process import DaemonProcess
    from mxserve.rlhf.machine import cpu_model
    from mxserve.rlhf.models import KVCache, ModelConfig, build_model
    from mxserve.torch import OffloadSession, RemoteAdamW, offload
except ImportError as error:
    sys.exit(f"hot_path.py: cannot import what it needs ({error}).\n"
             "Run it with /usr/bin/python3 after `make build` (python3-grpcio, -protobuf, "
             "-numpy, -torch, and the stubs the build generates).")

# Model shapes; --layers and --vocab override either.
SCALES = {
    "full": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "small": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  intermediate_size=704, vocab_size=4096),
}
OVERHEAD_SHAPE = (8, 896, 896)   # rows, in_features, out_features of the overhead layer
SYNC_FRACTION = 0.10             # of the linear layers, for the partial sync
DELTA = 1e-6                     # what "modify in place" adds
LEARNING_RATE = 1e-5

# The targets: key -> (what, target on the ratio, what the ratio divides by).
TARGETS = {
    "rollout_decode": ("rollout decode step", 1.0, "torch BF16"),
    "layer_call": ("per-layer call, null backend", 1.0, "0.15 ms"),
    "sync_all": ("sync_weights, all weights", 1.0, "3 s"),
    "sync_part": ("sync_weights, 10 % of layers", 1.0, "0.5 s"),
    "ppo_update": ("PPO update step", 1.5, "torch FP32"),
    "ppo_update_remote": ("PPO update, RemoteAdamW", 1.5, "torch FP32"),
}
BUDGETS = {"layer_call": 0.15e-3, "sync_all": 3.0, "sync_part": 0.5}  # seconds

_START = time.monotonic()


def progress(message: str) -> None:
    print(f"[{time.monotonic() - _START:7.1f} s] {message}", file=sys.stderr, flush=True)


# --- timing ------------------------------------------------------------------------

@dataclass
class Timing:
    """The timed runs of one side: seconds, and what each run reported besides."""
    samples: List[float] = field(default_factory=list)
    extras: List[dict] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best_extras(self) -> dict:
        return self.extras[self.samples.index(self.best)]

    def as_json(self) -> dict:
        return {"best": self.best, "median": self.median, "samples": self.samples,
                "extras": self.extras}


Run = Callable[[], Tuple[float, dict]]  # one run: its own seconds (setup left out), extras


def measure(sides: Dict[str, Run], repeat: int, warmup: int) -> Dict[str, Timing]:
    """Runs every side warmup + repeat times, interleaved (a, b, a, b, ...) so
    that drift on a shared machine hits all sides alike; keeps the timed runs."""
    timings = {name: Timing() for name in sides}
    for index in range(warmup + repeat):
        for name, run in sides.items():
            seconds, extras = run()
            if index >= warmup:
                timings[name].samples.append(seconds)
                timings[name].extras.append(extras)
    return timings


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def timed_locally(function: Callable[[], object]) -> Tuple[float, dict]:
    """Seconds of a local-only run, and the process's CPU seconds in it (their
    ratio says how many threads torch really kept busy)."""
    cpu = time.process_time()
    seconds = timed(function)
    return seconds, {"cpu_s": time.process_time() - cpu}


def limit_blas_threads(threads: int) -> str:
    """torch.set_num_threads does not reach the OpenBLAS that Debian's torch calls
    for float32 GEMMs, which keeps one thread per core: a "one thread" peer would
    run on all of them. Sets every loaded OpenBLAS to `threads`; says what it found."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return "unknown (no /proc/self/maps)"
    paths = sorted({line.split()[-1] for line in maps
                    if len(line.split()) >= 6 and "blas" in Path(line.split()[-1]).name})
    counts = set()
    for path in paths:
        library = ctypes.CDLL(path)
        if hasattr(library, "openblas_set_num_threads"):
            library.openblas_set_num_threads(threads)
            counts.add(str(library.openblas_get_num_threads()))
    return f"OpenBLAS on {'/'.join(sorted(counts))} thread(s)" if counts else "no OpenBLAS"


# --- daemons -----------------------------------------------------------------------

class SetupError(Exception):
    """A daemon could not be started or reached."""


def find_mxserved(flag: Optional[str]) -> str:
    """--mxserved, else $MXSERVED, else $MXSERVE_BIN_DIR/mxserved, else build/bin."""
    if flag:
        return flag
    if os.environ.get("MXSERVED"):
        return os.environ["MXSERVED"]
    return str(Path(os.environ.get("MXSERVE_BIN_DIR", REPO / "build" / "bin")) / "mxserved")


def daemon_flags(args: argparse.Namespace, backend: str) -> List[str]:
    return ["--listen", "127.0.0.1:0", "--metrics-listen", "off", "--backend", backend,
            "--kernel-threads", str(args.kernel_threads), "--default-policy", args.policy,
            "--weight-memory-bytes", args.weight_memory_bytes,
            "--max-message-bytes", str(args.max_message_bytes)]


@contextlib.contextmanager
def connect(args: argparse.Namespace, backend: str) -> Iterator[mxserve.Client]:
    """A client to the daemon given for `backend` (--server, --null-server), or to
    one started here and stopped on leaving, however the block is left."""
    given = args.server if backend == "cpu" else args.null_server
    daemon = None
    if not given:
        binary = find_mxserved(args.mxserved)
        if not os.access(binary, os.X_OK):
            raise SetupError(f"{binary} is not an executable: build it (make build), or "
                             "pass --mxserved or set MXSERVED")
        progress(f"starting {binary} --backend {backend}")
        try:
            daemon = DaemonProcess(binary, *daemon_flags(args, backend))
        except RuntimeError as error:
            raise SetupError(str(error)) from None
    try:
        with mxserve.Client(given or daemon.address, timeout=args.call_timeout,
                            max_message_bytes=args.max_message_bytes) as client:
            try:
                client.wait_ready(timeout=30)
            except mxserve.MxserveError as error:
                raise SetupError(f"{client.address}: {error}") from None
            yield client
    finally:
        if daemon is not None:
            code = daemon.stop()
            if code != 0:
                progress(f"mxserved --backend {backend} exited {code}; its log ends:\n"
                         + "\n".join(daemon.log_lines[-10:]))


# --- the model ---------------------------------------------------------------------

def model_config(args: argparse.Namespace) -> ModelConfig:
    shape = dict(SCALES[args.scale])
    if args.layers:
        shape["num_layers"] = args.layers
    if args.vocab:
        shape["vocab_size"] = args.vocab
    return ModelConfig(arch="qwen2", max_positions=32768, norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=True, **shape)


@dataclass
class Inputs:
    prompt: torch.Tensor       # [batch, prompt] token ids, prefilled into the cache
    next_ids: torch.Tensor     # [batch, 1] the decode step's tokens
    update_ids: torch.Tensor   # [batch, update_tokens] the PPO step's tokens
    targets: torch.Tensor      # [batch, update_tokens] its random target tokens


def make_inputs(args: argparse.Namespace, vocab: int) -> Inputs:
    generator = torch.Generator().manual_seed(args.seed + 1)

    def ids(length: int) -> torch.Tensor:
        return torch.randint(vocab, (args.batch, length), generator=generator)

    return Inputs(ids(args.prompt_tokens), ids(1), ids(args.update_tokens),
                  ids(args.update_tokens))


def offloaded_parameters(session: OffloadSession) -> int:
    return sum(l.in_features * l.out_features + (l.out_features if l.bias is not None else 0)
               for l in session.layers.values())


def decode_step(model: nn.Module, inputs: Inputs, cache: KVCache) -> None:
    with torch.no_grad():
        model(inputs.next_ids, cache=cache)


def daemon_totals(session: OffloadSession, phase: str) -> Tuple[int, float]:
    totals = session.totals.get(phase)
    return (totals.requests, totals.compute_seconds) if totals else (0, 0.0)


def offloaded(session: OffloadSession, phase: str, function: Callable[[], Optional[dict]]
              ) -> Tuple[float, dict]:
    """Runs `function` in `phase`; its seconds, and the daemon's requests and
    compute seconds for it beside what it reports itself."""
    requests, compute = daemon_totals(session, phase)
    with session.client.phase(phase):
        start = time.perf_counter()
        extras = function() or {}
        seconds = time.perf_counter() - start
    after_requests, after_compute = daemon_totals(session, phase)
    return seconds, {**extras, "requests": after_requests - requests,
                     "daemon_compute_s": after_compute - compute}


def compute_by_kind(infos: Dict[str, Optional[mxserve.ExecutionInfo]]) -> Dict[str, float]:
    """Daemon compute seconds of the layers' latest calls, by kind (q_proj, ...)."""
    kinds: Dict[str, float] = collections.defaultdict(float)
    for name, info in infos.items():
        if info is not None:
            kinds[name.rsplit(".", 1)[-1]] += info.compute_seconds
    return dict(kinds)


def formats_used(session: OffloadSession) -> Dict[str, int]:
    """How many layers' latest forward ran in which format, with which kernel."""
    return dict(collections.Counter(f"{info.format}/{info.kernel}"
                                    for info in session.last_infos().values() if info is not None))


# --- 1. rollout decode -------------------------------------------------------------

def bf16_copy(session: OffloadSession) -> nn.Module:
    """A local BF16 copy of the model, its original linear layers included."""
    with session.local() as model:
        return copy.deepcopy(model).to(torch.bfloat16).requires_grad_(False)


def measure_decode(args, model, session, inputs, cache) -> Dict[str, Timing]:
    progress("making the local BF16 copy")
    bf16_model = bf16_copy(session)
    cache16 = KVCache([k.bfloat16() for k in cache.keys], [v.bfloat16() for v in cache.values])

    def local_bf16():
        return timed_locally(lambda: decode_step(bf16_model, inputs, cache16))

    def local_fp32():
        with session.local():
            return timed_locally(lambda: decode_step(model, inputs, cache))

    def remote():
        seconds, extras = offloaded(session, "rollout", lambda: decode_step(model, inputs, cache))
        return seconds, {**extras, "compute_by_kind": compute_by_kind(session.last_infos())}

    return measure({"torch BF16": local_bf16, "torch FP32": local_fp32, "offloaded": remote},
                   args.repeat, args.warmup)


# --- 2. per-layer-call overhead ----------------------------------------------------

def measure_call_overhead(args, client: mxserve.Client, name: str) -> Dict[str, Timing]:
    """Seconds per call of one OVERHEAD_SHAPE layer: client.forward, and the same
    layer as an offloaded nn.Linear called under torch.no_grad."""
    rows, k, n = OVERHEAD_SHAPE
    torch.manual_seed(args.seed + 2)
    x, weight = torch.randn(rows, k), torch.randn(n, k) * k ** -0.5
    client.register_model(name, [("layer", n, k, False)], policy=args.policy)
    client.upload_weights(name, {"layer": weight}, publish=True)
    net = nn.Sequential(nn.Linear(k, n, bias=False))
    session = offload(net, client, f"{name}-module", policy=args.policy)

    def per_call(call: Callable[[], object]) -> Tuple[float, dict]:
        with client.phase("rollout"), torch.no_grad():
            return timed(lambda: [call() for _ in range(args.calls)]) / args.calls, {}

    sides = {"client.forward": lambda: per_call(lambda: client.forward(name, "layer", x)),
             "OffloadedLinear": lambda: per_call(lambda: net(x))}
    try:
        return measure(sides, args.repeat, args.warmup)
    finally:
        session.restore()
        client.delete_model(name)


def measure_null_backend(args, client, model, inputs, cache, name) -> dict:
    progress(f"null backend: {args.calls} calls of an {OVERHEAD_SHAPE[0]}x{OVERHEAD_SHAPE[1]} "
             f"input through a {OVERHEAD_SHAPE[2]}x{OVERHEAD_SHAPE[1]} layer, x{args.repeat}")
    calls = measure_call_overhead(args, client, f"{name}-overhead")
    progress("null backend: uploading the model for its decode step")
    start = time.perf_counter()
    session = offload(model, client, name, policy=args.policy)
    upload = time.perf_counter() - start
    try:
        step = lambda: offloaded(session, "rollout", lambda: decode_step(model, inputs, cache))
        decode = measure({"offloaded": step}, args.repeat, args.warmup)["offloaded"]
        return {"calls": calls, "decode": decode, "linear_layers": len(session.layers),
                "upload_s": upload}
    finally:
        session.restore()


# --- 3. sync_weights ---------------------------------------------------------------

def partial_layers(session: OffloadSession, tied_head: bool) -> List[str]:
    """SYNC_FRACTION of the linear layers, evenly spread in model order; not the
    tied LM head (it is the embedding, which a partial fine-tune leaves alone)."""
    count = max(1, round(SYNC_FRACTION * len(session.layers)))
    names = [n for n in session.layers if not (tied_head and n == "lm_head")]
    return [names[i * len(names) // count] for i in range(count)]


def nudge(parameters) -> None:
    """Modifies parameters in place (their _version moves, as an optimizer's step does)."""
    with torch.no_grad():
        for p in parameters:
            p.add_(DELTA)


def measure_sync(args, model, session, inputs, cache, part: List[str]) -> Dict[str, Timing]:
    def sync_all():
        nudge(model.parameters())
        changed = len(session.changed_layers())
        seconds = timed(session.sync_weights)
        after, _ = offloaded(session, "rollout", lambda: decode_step(model, inputs, cache))
        return seconds, {"layers": changed, "decode_after_sync_s": after}

    def sync_part():
        nudge(p for n in part for p in session.layers[n].parameters())
        changed = len(session.changed_layers())
        return timed(session.sync_weights), {"layers": changed}

    timings = measure({"all": sync_all}, args.repeat, 0)
    timings.update(measure({"part": sync_part}, args.repeat, 0))
    return timings


# --- 4. PPO update -----------------------------------------------------------------

def ppo_step(model: nn.Module, inputs: Inputs, optimizer: torch.optim.Optimizer,
             session: Optional[OffloadSession] = None) -> dict:
    """One update: forward, loss, backward, AdamW step (and sync_weights when
    offloaded; session.step, which is both, with a RemoteAdamW); the seconds of
    each part."""
    parts = {}
    optimizer.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logits = model(inputs.update_ids).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                           inputs.targets.reshape(-1))
    parts["forward_s"] = time.perf_counter() - start
    parts["backward_s"] = timed(loss.backward)
    if session is not None and session.optimizer is not None:
        client = session.client
        moved = weight_bytes_moved(client)
        parts["optimizer_s"] = timed(lambda: session.step(optimizer))
        parts["weight_bytes_moved"] = weight_bytes_moved(client) - moved
        return parts
    parts["optimizer_s"] = timed(optimizer.step)
    if session is not None:
        parts["sync_s"] = timed(session.sync_weights)
    return parts


def weight_bytes_moved(client: mxserve.Client) -> int:
    """Bytes of uploads and downloads of weights this client sent or received."""
    return (client.bytes_sent["UploadWeights"] + client.bytes_received["DownloadWeights"])


def measure_update(args, model, session, inputs, side: str = "offloaded") -> Dict[str, Timing]:
    optimizer = (session.optimizer.local_optimizer(session) if session.optimizer is not None
                 else torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE))
    local_optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)

    def remote():
        return offloaded(session, "update", lambda: ppo_step(model, inputs, optimizer, session))

    def local():
        with session.local():
            cpu = time.process_time()
            parts = ppo_step(model, inputs, local_optimizer)
            parts["cpu_s"] = time.process_time() - cpu
        return sum(v for k, v in parts.items() if k != "cpu_s"), parts

    return measure({side: remote, "torch FP32": local}, args.repeat, args.warmup)


# --- the run -----------------------------------------------------------------------

def weight_bytes_per_parameter(client, session: OffloadSession) -> float:
    return client.describe_model(session.model_name).weight_bytes / offloaded_parameters(session)


def run(args: argparse.Namespace) -> dict:
    config = model_config(args)
    torch.manual_seed(args.seed)
    progress(f"building the model ({config.num_layers} blocks, hidden {config.hidden_size}, "
             f"vocabulary {config.vocab_size}), random weights")
    model = build_model(config)
    parameters = sum(p.numel() for p in model.parameters())
    inputs = make_inputs(args, config.vocab_size)
    progress(f"prefilling {args.batch}x{args.prompt_tokens} prompt tokens locally (not timed)")
    with torch.no_grad():
        cache = model(inputs.prompt, use_cache=True).cache
    name = f"hot-path-{os.getpid()}"
    results = {"model": {"blocks": config.num_layers, "hidden": config.hidden_size,
                         "vocab": config.vocab_size, "parameters": parameters,
                         "linear_layers": sum(isinstance(m, nn.Linear) for m in model.modules())}}

    with connect(args, "null") as client:
        results["null"] = measure_null_backend(args, client, model, inputs, cache, name)

    with connect(args, "cpu") as client:
        progress(f"cpu backend: uploading {parameters / 1e6:.1f} M parameters (offload)")
        start = time.perf_counter()
        session = offload(model, client, name, policy=args.policy, grad_weight=args.grad_weight)
        results["upload_s"] = time.perf_counter() - start
        try:
            results.update(run_cpu(args, model, session, inputs, cache))
        finally:
            session.restore()
        progress("cpu backend: uploading again for the RemoteAdamW session")
        session = offload(model, client, name + "-remote-adamw", policy=args.policy,
                          optimizer=RemoteAdamW(lr=LEARNING_RATE))
        try:
            progress(f"PPO update step with RemoteAdamW, x{args.warmup + args.repeat} "
                     "(offloaded, local FP32)")
            results["update_remote"] = measure_update(args, model, session, inputs,
                                                      side="remote AdamW")
            results["remote_stepped"] = len(session.remote_stepped)
        except (mxserve.MxserveError, ValueError) as failure:
            progress(f"PPO update step with RemoteAdamW: not measured: {failure}")
            results["update_remote_error"] = str(failure)
        finally:
            session.restore()
    return results


def run_cpu(args, model, session, inputs, cache) -> dict:
    client, results = session.client, {}
    results["bytes_per_parameter"] = {"upload": weight_bytes_per_parameter(client, session)}
    results["offloaded_parameters"] = offloaded_parameters(session)
    progress(f"rollout decode step, x{args.warmup + args.repeat} "
             "(local BF16, local FP32, offloaded)")
    results["decode"] = measure_decode(args, model, session, inputs, cache)
    results["decode_formats"] = formats_used(session)
    results["bytes_per_parameter"]["rollout"] = weight_bytes_per_parameter(client, session)

    part = partial_layers(session, model.config.tie_word_embeddings)
    progress(f"sync_weights: all {len(session.layers)} layers, then {len(part)}, x{args.repeat}")
    results["sync"] = measure_sync(args, model, session, inputs, cache, part)
    results["sync_part_parameters"] = sum(p.numel() for n in part
                                          for p in session.layers[n].parameters())

    progress(f"PPO update step, {args.batch}x{args.update_tokens} tokens, "
             f"x{args.warmup + args.repeat} (offloaded, local FP32)")
    try:
        results["update"] = measure_update(args, model, session, inputs)
        results["update_formats"] = formats_used(session)
        results["bytes_per_parameter"]["update"] = weight_bytes_per_parameter(client, session)
    except (mxserve.MxserveError, ValueError) as failure:  # a call the daemon or client refused
        progress(f"PPO update step: not measured: {failure}")
        results["update_error"] = str(failure)
    return results


# --- the report --------------------------------------------------------------------

@dataclass
class Ratio:
    key: str
    measured: Optional[Timing]    # mxserve's side, seconds
    peer: Optional[Timing]        # the peer's side (None: a fixed budget)
    note: str = ""

    @property
    def value(self) -> Optional[float]:
        if self.measured is None:
            return None
        against = self.peer.best if self.peer else BUDGETS[self.key]
        return self.measured.best / against

    @property
    def target(self) -> float:
        return TARGETS[self.key][1]

    @property
    def met(self) -> Optional[bool]:
        return None if self.value is None else self.value <= self.target


def ratios(results: dict) -> List[Ratio]:
    decode, sync, update = results.get("decode"), results.get("sync"), results.get("update")
    update_remote = results.get("update_remote")
    return [
        Ratio("rollout_decode", decode and decode["offloaded"], decode and decode["torch BF16"]),
        Ratio("layer_call", results["null"]["calls"]["client.forward"], None),
        Ratio("sync_all", sync and sync["all"], None),
        Ratio("sync_part", sync and sync["part"], None),
        Ratio("ppo_update", update and update["offloaded"], update and update["torch FP32"],
              results.get("update_error", "")),
        Ratio("ppo_update_remote", update_remote and update_remote["remote AdamW"],
              update_remote and update_remote["torch FP32"],
              results.get("update_remote_error", "")),
    ]


def seconds_text(timing: Timing, scale: float = 1.0) -> str:
    return f"{timing.best * scale:.4g} ({timing.median * scale:.4g})"


def ratio_line(ratio: Ratio) -> str:
    what, target, against = TARGETS[ratio.key]
    unit, scale = ("ms", 1e3) if ratio.key == "layer_call" else ("s", 1.0)
    if ratio.value is None:
        return f"{what + ' (' + unit + ')':<36} not measured: {ratio.note}"
    peer = f"{against} {seconds_text(ratio.peer)}" if ratio.peer else f"budget {against}"
    verdict = "met" if ratio.met else "MISSED"
    line = (f"{what + ' (' + unit + ')':<36} {seconds_text(ratio.measured, scale):>22} "
            f"{peer:>32} {ratio.value:7.3f}  <= {target:<4} {verdict}")
    return line + (f"  [{ratio.note}]" if ratio.note else "")


def header_lines(args, results, machine: dict) -> List[str]:
    m = results["model"]
    return [
        f"hot path: Qwen2.5-0.5B-shaped model, {m['blocks']} blocks, hidden {m['hidden']}, "
        f"vocabulary {m['vocab']}: {m['parameters'] / 1e6:.1f} M parameters, "
        f"{m['linear_layers']} linear layers, random weights",
        f"machine: {machine['cpu']}, {machine['cpus']} CPUs; torch {machine['torch']} on "
        f"{args.threads} thread(s), {machine['blas']}",
        f"daemon: mxserved --backend cpu --kernel-threads {args.kernel_threads}, policy "
        f"{args.policy}, max message {args.max_message_bytes} B",
        f"batch {args.batch}: decode after {args.prompt_tokens} prompt tokens, update of "
        f"{args.update_tokens} tokens (grad_weight {args.grad_weight}); best of {args.repeat} "
        f"after {args.warmup} warm-up (median); ratio = best / best",
    ]


def detail_lines(args, results) -> List[str]:
    lines = []
    null = results["null"]
    module_call = seconds_text(null["calls"]["OffloadedLinear"], 1e3)
    per_layer = null["decode"].best / null["linear_layers"]
    lines.append(f"null backend: OffloadedLinear call {module_call} ms; decode step "
                 f"{seconds_text(null['decode'])} s = {per_layer * 1e3:.3f} ms per linear layer "
                 f"({null['linear_layers']} layers, local attention and norms included)")
    if "upload_s" in results:
        lines.append(f"offload() upload of the weights: {results['upload_s']:.2f} s to the cpu "
                     f"backend, {null['upload_s']:.2f} s to the null backend")
    if "decode" in results:
        lines += decode_details(results)
    if "sync" in results:
        sync = results["sync"]
        lines.append(f"sync_weights: all {sync['all'].best_extras['layers']} layers "
                     f"{seconds_text(sync['all'])} s; {sync['part'].best_extras['layers']} layers "
                     f"({results['sync_part_parameters'] / 1e6:.3g} M parameters) "
                     f"{seconds_text(sync['part'])} s; decode step right after a full sync "
                     f"{min(e['decode_after_sync_s'] for e in sync['all'].extras):.4g} s")
    if "update" in results:
        lines += update_details(args, results)
    per = results.get("bytes_per_parameter", {})
    if per:
        lines.append("daemon bytes per parameter (ModelInfo.weight_bytes / "
                     f"{results['offloaded_parameters'] / 1e6:.1f} M offloaded): "
                     + ", ".join(f"{v:.2f} after {k}" for k, v in per.items()))
    return lines


def busy(timing: Timing) -> float:
    """CPU seconds per second of a local side's best run: the threads it kept busy."""
    return timing.best_extras["cpu_s"] / timing.best


def decode_details(results) -> List[str]:
    decode = results["decode"]
    best = decode["offloaded"].best_extras
    kinds = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(best["compute_by_kind"].items(),
                                                             key=lambda kv: -kv[1]))
    return [
        f"decode, local torch FP32: {seconds_text(decode['torch FP32'])} s "
        f"(offloaded / FP32 = {decode['offloaded'].best / decode['torch FP32'].best:.3f}); "
        f"threads busy: BF16 {busy(decode['torch BF16']):.2f}, FP32 "
        f"{busy(decode['torch FP32']):.2f}",
        f"decode, offloaded: {best['requests']} calls, daemon compute "
        f"{best['daemon_compute_s']:.4g} s, the rest (RPC, client, local attention) "
        f"{decode['offloaded'].best - best['daemon_compute_s']:.4g} s; formats "
        f"{results['decode_formats']}",
        f"decode, daemon compute by layer kind (ms): {kinds}",
    ]


def update_details(args, results) -> List[str]:
    update = results["update"]
    remote, local = update["offloaded"].best_extras, update["torch FP32"].best_extras

    def parts(extras):
        return ", ".join(f"{k[:-2]} {v:.3g}" for k, v in extras.items()
                         if k.endswith("_s") and k not in ("daemon_compute_s", "cpu_s"))

    lines = [f"PPO update, offloaded (grad_weight {args.grad_weight}, local AdamW + sync): "
             f"{parts(remote)} s; {remote['requests']} calls, daemon compute "
             f"{remote['daemon_compute_s']:.4g} s; formats {results['update_formats']}",
             f"PPO update, local torch FP32: {parts(local)} s; threads busy "
             f"{busy(update['torch FP32']):.2f}"]
    if "update_remote" in results:
        stepped = results["update_remote"]["remote AdamW"].best_extras
        lines.append(f"PPO update, RemoteAdamW ({results['remote_stepped']} layers stepped on the "
                     f"daemon): {parts(stepped)} s; {stepped['requests']} calls, daemon compute "
                     f"{stepped['daemon_compute_s']:.4g} s; weights over the wire "
                     f"{stepped['weight_bytes_moved'] / 1e6:.1f} MB (tied projections' uploads)")
    return lines


def report(args, results: dict, machine: dict) -> List[Ratio]:
    found = ratios(results)
    print("\n".join(header_lines(args, results, machine)))
    print(f"\n{'':<36} {'mxserve best (median)':>22} {'against best (median)':>32} "
          f"{'ratio':>7}  target")
    for ratio in found:
        print(ratio_line(ratio))
    print()
    print("\n".join(detail_lines(args, results)))
    return found


def write_json(path: str, args, results: dict, machine: dict, found: List[Ratio]) -> None:
    def plain(value):
        if isinstance(value, Timing):
            return value.as_json()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    document = {
        "machine": machine, "config": vars(args), "results": plain(results),
        "ratios": {r.key: {"what": TARGETS[r.key][0], "value": r.value, "target": r.target,
                           "met": r.met, "against": TARGETS[r.key][2], "note": r.note}
                   for r in found},
    }
    Path(path).write_text(json.dumps(document, indent=2) + "\n")


# --- command line ------------------------------------------------------------------

def byte_size(text: str) -> int:
    """'64M', '1G', '1048576' -> bytes (powers of 1024, as mxserved reads them)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_argument_group("model and workload")
    model.add_argument("--scale", choices=sorted(SCALES), default="full",
                       help="full: Qwen2.5-0.5B's shape (default); small: 2 blocks of hidden "
                            "128, vocabulary 4096, for smoke runs")
    model.add_argument("--layers", type=positive, help="transformer blocks (overrides --scale)")
    model.add_argument("--vocab", type=positive, help="vocabulary size (overrides --scale)")
    model.add_argument("--batch", type=positive, default=8, help="sequences (default 8)")
    model.add_argument("--prompt-tokens", type=positive, default=32,
                       help="KV cache length before the decode step (default 32)")
    model.add_argument("--update-tokens", type=positive, default=47,
                       help="tokens per sequence in the PPO step (default 47)")
    model.add_argument("--grad-weight", choices=("remote", "local"), default="remote",
                       help="where the PPO step's weight gradients are computed (default remote)")
    model.add_argument("--seed", type=int, default=0)
    timing = p.add_argument_group("timing")
    timing.add_argument("--repeat", type=positive, default=3,
                        help="timed runs per side; best and median reported (default 3)")
    timing.add_argument("--warmup", type=int, default=1,
                        help="untimed runs per side first (default 1)")
    timing.add_argument("--calls", type=positive, default=500,
                        help="calls per overhead run (default 500)")
    timing.add_argument("--threads", type=positive, default=1,
                        help="torch and OpenBLAS threads, every side (default 1)")
    daemon = p.add_argument_group("daemons")
    daemon.add_argument("--server", help="a running cpu-backend mxserved (default: start one)")
    daemon.add_argument("--null-server",
                        help="a running null-backend mxserved (default: start one)")
    daemon.add_argument("--mxserved", help="the binary to start (default: $MXSERVED, else "
                                           "$MXSERVE_BIN_DIR/mxserved, else build/bin/mxserved)")
    daemon.add_argument("--kernel-threads", type=positive, default=1,
                        help="--kernel-threads of a started daemon (default 1)")
    daemon.add_argument("--policy", default="D",
                        help="the offloaded model's policy (default D, phase-adaptive)")
    daemon.add_argument("--weight-memory-bytes", default="16G",
                        help="--weight-memory-bytes of a started daemon (default 16G)")
    daemon.add_argument("--max-message-bytes", type=byte_size, default=64 << 20,
                        help="the client's and a started daemon's message limit (default "
                             "64M, the daemon's default)")
    daemon.add_argument("--call-timeout", type=float, default=600.0,
                        help="deadline of each call, seconds (default 600)")
    p.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup must be 0 or more")
    return args


def _terminate(signum, frame):
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the daemons are stopped


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    torch.set_num_threads(args.threads)
    machine = {"cpu": cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__,
               "torch_threads": torch.get_num_threads(), "blas": limit_blas_threads(args.threads),
               "python": platform.python_version()}
    try:
        results = run(args)
    except SetupError as error:
        print(f"hot_path: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hot_path: interrupted", file=sys.stderr)
        return 130
    found = report(args, results, machine)
    if args.json:
        write_json(args.json, args, results, machine, found)
    return 0 if all(r.value is not None and math.isfinite(r.value) for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
