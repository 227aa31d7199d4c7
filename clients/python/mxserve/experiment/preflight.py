"""Before any training: how much memory and time an experiment needs, from the
model's shapes and the matrix's size, and whether it fits this machine.

    est = estimate(model_config, Shape(batch_size=8, prompt_tokens=256, response_tokens=256))
    print(est.render())
    problems = est.check(available_memory())   # [] when it fits

Memory is counted per role, in bytes (P parameters, V vocabulary, H hidden, I MLP
width, L layers, A heads, B batch, b = ⌈B / minibatches⌉, S = prompt + response
tokens, R response tokens, E the evaluation batch):

- policy + value head in FP32 (P·4), its gradients (P·4), Adam's two states (P·8);
- the frozen models in their dtype (`task.frozen_dtype`, 2 bytes for BF16, else 4):
  the reference (P), the reward model (its body: P less an untied LM head) and the
  judge (a second reward model); the task's initial policy and reward model, which
  every run copies (P + body); the judges' copy of the seed's trained FP16 baseline
  in FP32 (P·4: BF16 would blur its small PPO updates);
- update activations: L·b·S·(10·H + 4·I + 2·A·S)·4 (what autograd keeps per token
  and layer: the norms', projections' and MLP's inputs, and two A×S attention
  tensors, softmax's output and the masked probabilities), the full logits and their gradient (2·b·S·V·4) and the response
  slice's float copy, scaled copy, log-softmax and its exp (4·b·R·V·4); the
  vocabulary projection dominates at V = 151,936;
- evaluation: the baseline's logits (E·S·V·4) and six E×R×V FP32 tensors (the
  rollout's kept logits, two log-softmaxes, the slice, q and q·log ratio);
- the KV cache of sampling: 2·L·max(B, E)·S·(kv heads · head dim)·4;
- an FP32 copy of the trained policy (P·4) when a baseline is handed to the judges.

The peak is the models plus the largest of these three transients (they never
overlap). Measured on an H200 (one FP32 PPO step, BF16 frozen models, the
trainer's models only): 23.4 GiB against an estimate of 21.9 GiB at 256 + 64 tokens,
34.5 against 34.2 GiB at 256 + 256. With `compute="daemon"` the daemon holds every offloaded model's
linear weights as FP32 masters plus one 16-bit copy (6 bytes a weight: policy,
reference, reward, judge, baseline), within its --weight-memory-bytes; with
`compute="local"` no weight is uploaded. On a GPU (`device="cuda"`) the trainer's
and judges' models and transients are on the device, the task's copies on the host.

Time: FLOPs per PPO step 2·N·B·S for each of the rollout, reward, reference and
learner forwards plus 6·N·b·S per minibatch and PPO epoch (N: parameters in linear
layers), and 8·N·S per held-out prompt (sampling, judge, own reward, baseline);
over configurations × seeds × steps, at an assumed rate per compute mode (stated in
the output: an order of magnitude, not a promise).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

from mxserve.rlhf.models import ModelConfig

__all__ = ["Available", "Estimate", "Shape", "available_memory", "estimate", "gib",
           "linear_parameters", "parameter_count"]

# Assumed sustained rates, FLOP/s. On the GPU, measured: one FP32 PPO step of
# Qwen2.5-0.5B's shape (batch 8, 256 + 256 tokens, 4 epochs; 64.8 TFLOP by the count
# above) took 14.0 s on an H200, most of it token-by-token sampling (the origin's
# FP16 anchor: 5.6 s). The daemon's CPU emulation: a few GFLOP/s per core.
RATES = {"local:cuda": 64.8e12 / 14.0, "local:cpu": 50e9, "daemon": 10e9}
DAEMON_WEIGHT_BYTES = 6  # FP32 master + one 16-bit copy per weight on the daemon


def gib(value: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    if value >= 2 ** 30:
        return f"{value / 2 ** 30:.2f} GiB"
    return f"{value / 2 ** 20:.1f} MiB"


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def parameter_count(config: ModelConfig) -> int:
    """Parameters of `mxserve.rlhf.models.build_model(config)` (a tied LM head counted once)."""
    h, i, v, layers = config.hidden_size, config.intermediate_size, config.vocab_size, \
        config.num_layers
    kv = config.num_kv_heads * config.head_dim
    if config.arch == "gpt2":
        per_layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
        total = v * h + config.max_positions * h + layers * per_layer + 2 * h
    else:
        per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
        total = v * h + layers * per_layer + h
    return total + (0 if config.tie_word_embeddings else v * h)


def linear_parameters(config: ModelConfig, lm_head: bool = True) -> int:
    """Weights and biases of the model's nn.Linear layers (what offload uploads); the
    LM head counts (it is a Linear, tied or not) unless `lm_head` is False."""
    h, v, layers = config.hidden_size, config.vocab_size, config.num_layers
    if config.arch == "gpt2":
        embeddings, norms = v * h + config.max_positions * h, 4 * h * layers + 2 * h
    else:
        embeddings, norms = v * h, 2 * h * layers + h
    body = parameter_count(config) - embeddings - norms - \
        (0 if config.tie_word_embeddings else v * h)
    return body + (v * h if lm_head else 0)


@dataclasses.dataclass
class Shape:
    """The run's sizes: what the memory and time depend on."""
    batch_size: int
    prompt_tokens: int
    response_tokens: int
    mini_batches: int = 1
    epochs: int = 4
    eval_batch_size: int = 0          # 0: the batch size
    eval_prompts: int = 200
    frozen_bytes: int = 4             # 2 for BF16 frozen models
    steps: int = 100
    runs: int = 1                     # trained runs (configurations × seeds × repetitions)
    untrained_runs: int = 0           # evaluated only

    @property
    def sequence(self) -> int:
        return self.prompt_tokens + self.response_tokens


@dataclasses.dataclass
class Estimate:
    parameters: int
    client: Dict[str, int]            # role → bytes in the trainer's process (host)
    gpu: Dict[str, int]               # role → bytes on the GPU
    daemon: Dict[str, int]            # role → bytes in mxserved
    transients: Dict[str, Dict[str, int]]  # "update"/"evaluation" → role → bytes
    flops_per_step: float
    total_flops: float
    seconds: float
    rate: float
    compute: str
    device: str
    shape: Shape

    @property
    def peak_transient(self) -> Tuple[str, int]:
        name = max(self.transients, key=lambda k: sum(self.transients[k].values()))
        return name, sum(self.transients[name].values())

    @property
    def host_bytes(self) -> int:
        """The trainer process's peak on the host."""
        return sum(self.client.values()) + (0 if self.on_gpu else self.peak_transient[1])

    @property
    def gpu_bytes(self) -> int:
        return sum(self.gpu.values()) + (self.peak_transient[1] if self.on_gpu else 0)

    @property
    def daemon_bytes(self) -> int:
        return sum(self.daemon.values())

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def render(self) -> str:
        """The estimate as text lines, largest roles first."""
        s = self.shape
        lines = [f"preflight: {self.parameters:,} parameters, batch {s.batch_size}, "
                 f"{s.prompt_tokens} + {s.response_tokens} tokens, {s.runs} trained runs "
                 f"× {s.steps} steps (+ {s.untrained_runs} untrained), "
                 f"{s.eval_prompts} held-out prompts per run; compute {self.compute} on "
                 f"{self.device}"]

        def block(title: str, roles: Dict[str, int], total: int) -> None:
            lines.append(f"  {title}: {gib(total)}")
            for role, size in sorted(roles.items(), key=lambda kv: -kv[1]):
                if size:
                    lines.append(f"    {gib(size):>11}  {role}")

        name, size = self.peak_transient
        where = "GPU" if self.on_gpu else "trainer process"
        block("trainer process (host)", self.client, self.host_bytes)
        if self.on_gpu:
            block("GPU", self.gpu, self.gpu_bytes)
        lines.append(f"    {gib(size):>11}  peak transient ({name}) in the {where}:")
        for role, part in sorted(self.transients[name].items(), key=lambda kv: -kv[1]):
            lines.append(f"    {'':>11}    {gib(part)} {role}")
        block("mxserved", self.daemon, self.daemon_bytes)
        lines.append(f"  time: {self.total_flops:.3g} FLOP at an assumed "
                     f"{self.rate / 1e9:.0f} GFLOP/s ({self.compute} on {self.device}): "
                     f"about {duration(self.seconds)} ({self.flops_per_step:.3g} FLOP per PPO step)")
        return "\n".join(lines)

    def check(self, available: "Available", daemon_local: bool = True) -> List[str]:
        """What does not fit, each naming the setting to change; [] when all fits."""
        problems = []
        name, _ = self.peak_transient
        lower = ("ppo.response_length (--response-length), ppo.batch_size "
                 "(--batch-size)" + (", eval.batch_size" if name == "evaluation" else ""))
        frozen = "" if self.shape.frozen_bytes == 2 else ", task.frozen_dtype = \"bf16\""
        host = self.host_bytes + (self.daemon_bytes if daemon_local else 0)
        if available.host is not None and host > available.host:
            also = " with mxserved's weights on the same machine" if daemon_local and \
                self.daemon_bytes else ""
            problems.append(f"host memory: the estimate is {gib(host)}{also}, "
                            f"{gib(available.host)} is available (MemAvailable): lower "
                            f"{lower}{frozen}" +
                            (", or --compute local" if self.compute == "daemon" else ""))
        if available.daemon is not None and self.daemon_bytes > available.daemon:
            problems.append(f"mxserved weight memory: the models need {gib(self.daemon_bytes)}, "
                            f"the daemon's budget is {gib(available.daemon)} (mxserved "
                            "--weight-memory-bytes; tell the preflight with "
                            "--daemon-weight-memory), or --compute local (no weights uploaded)")
        if self.on_gpu and available.gpu is not None and self.gpu_bytes > available.gpu:
            problems.append(f"GPU memory: the estimate is {gib(self.gpu_bytes)}, "
                            f"{gib(available.gpu)} is free (torch.cuda.mem_get_info): lower "
                            f"{lower}{frozen}")
        return problems


@dataclasses.dataclass
class Available:
    host: Optional[int] = None        # MemAvailable
    daemon: Optional[int] = None      # mxserved --weight-memory-bytes
    gpu: Optional[int] = None         # free device memory


def available_memory(device: str = "cpu", daemon_budget: Optional[int] = None,
                     meminfo: str = "/proc/meminfo") -> Available:
    """MemAvailable from /proc/meminfo (None where unreadable), the daemon's weight
    budget as given, and the device's free memory on CUDA."""
    host = None
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
    except OSError:
        pass
    gpu = None
    if device.startswith("cuda"):
        import torch
        gpu = torch.cuda.mem_get_info(torch.device(device))[0]
    return Available(host=host, daemon=daemon_budget, gpu=gpu)


def estimate(config: ModelConfig, shape: Shape, compute: str = "daemon",
             device: str = "cpu") -> Estimate:
    """The memory and time `shape` needs with `config`'s model; see the module."""
    p = parameter_count(config)
    h, i, v, layers = config.hidden_size, config.intermediate_size, config.vocab_size, \
        config.num_layers
    head = 0 if config.tie_word_embeddings else v * h
    body = p - head                   # the reward model drops an untied LM head
    fb = shape.frozen_bytes
    s, r = shape.sequence, shape.response_tokens
    b = math.ceil(shape.batch_size / shape.mini_batches)
    e = shape.eval_batch_size or shape.batch_size
    kv = config.num_kv_heads * config.head_dim
    models = {
        "policy + value head (FP32)": p * 4 + (h + 1) * 4,
        "gradients (FP32)": p * 4,
        "Adam states (2 × FP32)": p * 8,
        "reference (frozen)": p * fb,
        "reward model (frozen)": body * fb,
        "judge: reward model (frozen)": body * fb,
        "judge: the seed's trained FP16 baseline policy (FP32)": p * 4,
    }
    task_copies = {"task: initial policy and reward model": (p + body) * fb}
    transients = {
        "update": {"activations": layers * b * s * (10 * h + 4 * i + 2 * config.num_heads * s) * 4,
                   "logits and their gradient (FP32)": 2 * b * s * v * 4,
                   "log-softmax of the response (FP32)": 4 * b * r * v * 4,
                   "KV cache (sampling)": 2 * layers * shape.batch_size * s * kv * 4},
        "evaluation": {"baseline logits (FP32)": e * s * v * 4,
                       "response distributions (FP32)": 6 * e * r * v * 4,
                       "KV cache (sampling)": 2 * layers * e * s * kv * 4},
        "handing the baseline to the judges": {"the trained policy's FP32 copy": p * 4},
    }
    on_gpu = device.startswith("cuda")
    client = dict(task_copies) if on_gpu else {**models, **task_copies}
    gpu = models if on_gpu else {}
    daemon: Dict[str, int] = {}
    if compute == "daemon":
        full, no_head = linear_parameters(config), linear_parameters(config, lm_head=False)
        daemon = {"policy, reference, judge baseline: linear weights": 3 * full,
                  "reward model, judge: linear weights": 2 * (no_head + h)}
        daemon = {k: n * DAEMON_WEIGHT_BYTES for k, n in daemon.items()}

    n = linear_parameters(config)
    bs = shape.batch_size
    step = 2 * n * bs * s * 4 + 6 * n * bs * s * shape.epochs
    evaluation = 8 * n * s * shape.eval_prompts
    total = shape.runs * (shape.steps * step + evaluation) + shape.untrained_runs * evaluation
    rate = RATES[f"local:{device.split(':')[0]}" if compute == "local" else "daemon"]
    return Estimate(parameters=p, client=client, gpu=dict(gpu), daemon=daemon,
                    transients=transients, flops_per_step=step, total_flops=total,
                    seconds=total / rate, rate=rate, compute=compute, device=device,
                    shape=shape)


def daemon_is_local(address: str) -> bool:
    """Whether mxserved at `address` shares this machine's memory."""
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", "") or host.startswith("unix")


def parse_bytes(text: str) -> int:
    """'8G', '512M', '4096' (K/M/G/T, powers of 1024) → bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"expected a size like 8G or 512M, got {text!r}") from None
    return int(value)

