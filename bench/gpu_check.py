#!/usr/bin/env python3
"""The GPU check: mxserve.torch.emulator's CUDA bits against its CPU bits, then the
figures of issue 31's targets, in one command of at most 8 minutes on one GPU.

    bench/gpu_check.sh [--bundle build/gpu-bundle] [--budget 450] [--ppo-tokens 64]

1. Bits. The golden vectors (../shared/golden/mx) and random Qwen2.5-0.5B-shaped
   layers in every format — forward, grad_input, grad_weight, grad_bias — on the
   CPU (the plain torch path) and on CUDA twice: the plain path, and the fused
   Triton kernels when Triton imports. Every output must have the CPU's bits.
2. Speed. The exact linear (X quantized per call, W once) on the Qwen2.5-0.5B
   shapes at M = 512 and 4096, against BF16 F.linear on the same GPU in the same
   run: TFLOP/s and the ratio (targets: MXFP4/MXFP6/MXINT8 >= 0.5x, MXFP8 >= 0.2x).
3. A PPO step under policy D with compute="local" (a random-init Qwen2.5-0.5B,
   batch 8, `--ppo-tokens` prompt + response tokens) against a plain step of the
   same shape on the GPU (FP16 autocast, no daemon), both after a warm-up step;
   the daemon (from `--bundle`, run with its own loader and libraries so that it
   needs none of the host's packages) resolves the policy and books the energy.
4. The experiment on the GPU: `python3 -m mxserve.experiment --device cuda --quick`
   on two configurations, end to end.

Prints one line per result and a summary; exits 1 if any bits differ.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import mxserve  # noqa: E402,F401
    CLIENT_ERROR = ""
except Exception as error:  # noqa: BLE001  (e.g. stubs a protobuf runtime refuses)
    # The emulator needs none of the client: load the package without its __init__.
    import types
    CLIENT_ERROR = f"{type(error).__name__}: {error}"
    _package = types.ModuleType("mxserve")
    _package.__path__ = [str(REPO / "clients" / "python" / "mxserve")]
    sys.modules["mxserve"] = _package
from mxserve.torch import emulator as em  # noqa: E402

FORMATS = ["MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3", "MXFP4_E2M1", "MXINT8",
           "INT8", "BF16", "FP16", "FP32", "NVFP4", "NF4", "BNB_FP4", "LO_BCQ"]
# Qwen2.5-0.5B's linear layers (out, in): q, k (= v), o, gate (= up), down, lm_head.
QWEN_LAYERS = {"q_proj": (896, 896), "k_proj": (128, 896), "o_proj": (896, 896),
               "up_proj": (4864, 896), "down_proj": (896, 4864), "lm_head": (151936, 896)}
# The bits section's layers: Qwen's reductions (K = 896 and 4864) with fewer output
# rows where the CPU side (the plain path, an fma chain per k for the float
# formats) would take minutes.
BITS_LAYERS = {"q_proj": (896, 896), "k_proj": (128, 896), "down_proj": (256, 4864)}
STARTED = time.time()


def log(message: str) -> None:
    print(f"[{time.time() - STARTED:6.1f} s] {message}", flush=True)


@contextlib.contextmanager
def environ(**settings: str):
    """The emulator's switches (MXSERVE_EMULATOR_*) set inside, restored after."""
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


def triton_available():
    """(whether the emulator's Triton kernels import, Triton's version or why not)."""
    try:
        from mxserve.torch import emulator_triton  # noqa: F401
        import triton
        return True, triton.__version__
    except Exception as error:  # noqa: BLE001
        return False, f"unavailable ({type(error).__name__}: {error})"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many values differ (NaNs equal, zeros by sign too)."""
    a, b = a.detach().float().cpu().contiguous(), b.detach().float().cpu().contiguous()
    if a.shape != b.shape:
        return max(a.numel(), b.numel())
    both_nan = torch.isnan(a) & torch.isnan(b)
    return int(((a.view(torch.int32) != b.view(torch.int32)) & ~both_nan).sum())


# --- 1. bits ---------------------------------------------------------------------------------


def operand_bits(op) -> torch.Tensor:
    """Everything a quantized operand holds, as one flat tensor of values."""
    if isinstance(op, em.NvOperand):
        return torch.cat([op.fixed.reshape(-1).cpu(), op.scale.reshape(-1).cpu(),
                          op.tensor_scale.cpu()])
    if isinstance(op, em.MxOperand):
        return torch.cat([op.fixed.reshape(-1).cpu(), op.exponent.reshape(-1).float().cpu(),
                          op.nan.reshape(-1).float().cpu()])
    if isinstance(op, em.Int8Operand):
        return torch.cat([op.codes.reshape(-1).cpu(), op.scale.cpu()])
    if isinstance(op, em.CodebookOperand):
        return torch.cat([op.codes.reshape(-1).float().cpu(), op.absmax.reshape(-1).cpu()])
    if isinstance(op, em.LoBcqOperand):
        return torch.cat([op.codes.reshape(-1).float().cpu(), op.selectors.reshape(-1).float().cpu(),
                          op.scale.reshape(-1).cpu()])
    return op.values.reshape(-1).cpu()


def check_bits(device: str, use_triton: bool, golden: pathlib.Path):
    """[(case, differing values, total)] for every case, CUDA vs CPU."""
    results = []

    def compare(name, fn):
        want = fn("cpu")
        # The float formats' exact fma chain: bits, not the fast GEMM.
        with environ(MXSERVE_EMULATOR_TRITON="1" if use_triton else "0",
                     MXSERVE_EMULATOR_FLOAT="exact"):
            got = fn(device)
        results.append((name, same_bits(got, want), want.numel()))

    if (golden / "manifest.json").exists():
        import numpy as np
        for case in json.loads((golden / "manifest.json").read_text())["cases"]:
            def load(f):
                dtype = np.float32 if f["dtype"].startswith("float32") else np.uint8
                return torch.from_numpy(np.fromfile(golden / f["path"], dtype=dtype).reshape(
                    f["shape"]))
            fmt = case["format"]
            if case["op"] == "quantize":
                x = load(case["files"]["input"]).reshape(1, -1)
                compare(case["id"], lambda d, x=x, fmt=fmt: operand_bits(
                    em.quantize(x.to(d), fmt)))
            else:
                a, b = load(case["files"]["A"]), load(case["files"]["B"])
                compare(case["id"], lambda d, a=a, b=b, fmt=fmt: em.linear(
                    em.quantize(a.to(d), fmt), em.quantize(b.t().to(d), fmt)))
    else:
        log(f"golden vectors not found at {golden}: skipped")
    g = torch.Generator().manual_seed(31)
    for fmt in FORMATS:
        for layer, (n, k) in BITS_LAYERS.items():
            m = 16
            x = torch.randn(m, k, generator=g) * torch.pow(2.0, torch.randint(
                -8, 8, (m, 1), generator=g).float())
            w = torch.randn(n, k, generator=g) * 0.02
            bias = torch.randn(n, generator=g) if layer in ("q_proj", "k_proj") else None
            compare(f"{fmt} {layer} forward", lambda d: em.linear(
                em.quantize(x.to(d), fmt), em.quantize(w.to(d), fmt),
                None if bias is None else bias.to(d)))
            if layer in ("k_proj", "down_proj"):
                dy = torch.randn(m, n, generator=g) * 1e-3
                compare(f"{fmt} {layer} grad_input", lambda d: em.grad_input(
                    dy.to(d), w.to(d), fmt))
                compare(f"{fmt} {layer} grad_weight", lambda d: em.grad_weight(
                    dy.to(d), x.to(d), fmt))
                compare(f"{fmt} {layer} grad_bias", lambda d: em.column_sums(dy.to(d)))
    x = torch.randn(32, 896, generator=g) * 3.0
    for fmt in ("MXFP4_E2M1", "MXINT8", "MXFP8_E4M3", "INT8"):
        compare(f"{fmt} ties away", lambda d: operand_bits(
            em.quantize(x.to(d), fmt, rounding="away")))
    compare("MXFP8_E4M3 no_saturation", lambda d: operand_bits(
        em.quantize(x.to(d), "MXFP8_E4M3", scale_rule="no_saturation")))
    # NVFP4's golden cases (tests/golden/nvfp4.json, which the CPU reproduces in
    # clients/python/tests/test_nvfp4.py): quantization and the GEMM.
    nv = json.loads((REPO / "tests" / "golden" / "nvfp4.json").read_text())

    def hex_floats(hexes):
        bits = torch.tensor([int(h, 16) for h in hexes], dtype=torch.int64)
        return torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(
            torch.float32)
    for case in nv["quantize"]:
        v = hex_floats(case["values"]).reshape(case["rows"], case["cols"])
        compare(f"NVFP4 golden {case['id']}", lambda d, v=v: operand_bits(em.quantize(
            v.to(d), "NVFP4")))
    for case in nv["gemm"]:
        a = hex_floats(case["a"]).reshape(case["m"], case["k"])
        b = hex_floats(case["b"]).reshape(case["k"], case["n"])
        compare(f"NVFP4 golden gemm {case['id']}", lambda d, a=a, b=b: em.linear(
            em.quantize(a.to(d), "NVFP4"), em.quantize(b.t().to(d), "NVFP4")))
    # The codebooks' golden cases (tests/golden/codebook.json).
    cb = json.loads((REPO / "tests" / "golden" / "codebook.json").read_text())
    for case in cb["quantize"]:
        v = hex_floats(case["values"]).reshape(case["rows"], case["cols"])
        compare(f"codebook golden {case['id']}", lambda d, v=v, f=case["format"]: operand_bits(
            em.quantize(v.to(d), f)))
    for case in cb["gemm"]:
        a = hex_floats(case["a"]).reshape(case["m"], case["k"])
        b = hex_floats(case["b"]).reshape(case["k"], case["n"])
        compare(f"codebook golden gemm {case['id']}", lambda d, a=a, b=b, c=case: em.linear(
            em.quantize(a.to(d), c["format_a"]), em.quantize(b.t().to(d), c["format_b"])))
    # LO-BCQ's golden cases (tests/golden/lobcq.json): the format and other
    # geometries with their own codebooks, and the GEMM.
    lb = json.loads((REPO / "tests" / "golden" / "lobcq.json").read_text())
    for case in lb["quantize"]:
        v = hex_floats(case["values"]).reshape(case["rows"], case["cols"])
        compare(f"LO-BCQ golden {case['id']}", lambda d, v=v, c=case: operand_bits(
            em.quantize_lobcq(v.to(d), c["codebooks"], em.LoBcqGeometry(**c["geometry"]))))
    for case in lb["gemm"]:
        a = hex_floats(case["a"]).reshape(case["m"], case["k"])
        b = hex_floats(case["b"]).reshape(case["k"], case["n"])
        compare(f"LO-BCQ golden gemm {case['id']}", lambda d, a=a, b=b, c=case: em.linear(
            em.quantize(a.to(d), c["format_a"]), em.quantize(b.t().to(d), c["format_b"])))
    # Seeded stochastic rounding: the random bits and every use of them, on
    # Qwen's down_proj reduction (K = 4864) with the daemon's streams.
    index = torch.arange(1 << 20, dtype=torch.int64) * 4099 + (1 << 33)
    compare("stochastic bits", lambda d: em.stochastic_bits(2024, 4, index.to(d)).double())
    (n, k), m = BITS_LAYERS["down_proj"], 16
    w = torch.randn(n, k, generator=g) * 0.02
    x = torch.randn(m, k, generator=g)
    dy = torch.randn(m, n, generator=g) * 1e-3
    for fmt in ("MXFP4_E2M1", "MXFP6_E3M2", "MXFP8_E4M3", "MXINT8", "INT8", "NVFP4"):
        compare(f"{fmt} stochastic X", lambda d: operand_bits(em.quantize(
            x.to(d), fmt, "stochastic", seed=7, stream=em.STREAMS["forward_input"])))
        compare(f"{fmt} stochastic grad_input", lambda d: em.grad_input(
            dy.to(d), w.to(d), fmt, "stochastic", seed=8))
        compare(f"{fmt} stochastic grad_weight", lambda d: em.grad_weight(
            dy.to(d), x.to(d), fmt, "stochastic", seed=8))
    return results


# --- 2. speed --------------------------------------------------------------------------------


def timed(fn, reps: int) -> float:
    """Seconds per call: CUDA events around `reps` calls after two warm-ups."""
    fn()
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 1000.0 / reps


def speed(device: str, m: int, fmt: str, layers):
    """(exact TFLOP/s, BF16 TFLOP/s) summed over `layers` at M = m."""
    g = torch.Generator(device=device).manual_seed(5)
    exact_s = bf16_s = flops = 0.0
    for n, k in layers:
        x = torch.randn(m, k, device=device, generator=g)
        w = torch.randn(n, k, device=device, generator=g) * 0.02
        wq = em.quantize(w, fmt)
        xb, wb = x.bfloat16(), w.bfloat16()
        reps = 5 if fmt in ("FP16", "BF16", "FP32", "MXFP8_E5M2") else 20
        exact_s += timed(lambda: em.linear(em.quantize(x, fmt), wq), reps)
        bf16_s += timed(lambda: F.linear(xb, wb), 50)
        flops += 2.0 * m * n * k
    return flops / exact_s / 1e12, flops / bf16_s / 1e12


# --- 3. a PPO step ----------------------------------------------------------------------------


def qwen_config():
    from mxserve.rlhf.models import ModelConfig
    return ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=896, num_layers=24,
                       num_heads=14, num_kv_heads=2, intermediate_size=4864,
                       max_positions=32768, norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=True, eos_token_id=151643)


def ppo_step_seconds(client, device: str, tokens: int, policy: str):
    """Seconds of the second of two PPO steps (the first compiles and warms up)."""
    from mxserve.rlhf import trainer as rlhf
    from mxserve.rlhf.models import build_model

    torch.manual_seed(0)
    config_lm = qwen_config()
    policy_lm, reward_lm = build_model(config_lm), build_model(config_lm)
    config = rlhf.PPOConfig(batch_size=8, response_length=tokens, learning_rate=1e-6)
    trainer = rlhf.PPOTrainer(client, policy_lm, rlhf.RewardModel(reward_lm), config,
                              eos_id=-1, pad_id=config_lm.vocab_size - 1, seed=0, device=device,
                              policy=policy, run="gpu-check/ppo", name_prefix="gpu-check",
                              **({"compute": "local"} if client is not None else {}))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, config_lm.vocab_size - 1, (tokens,), generator=g).tolist()
               for _ in range(8)]
    try:
        seconds = []
        for _ in range(2):
            torch.cuda.synchronize()
            started = time.perf_counter()
            trainer.step(prompts)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - started)
        return seconds, dict(trainer.wall)
    finally:
        trainer.close()


def start_daemon(bundle: pathlib.Path):
    """mxserved from the bundle, through the bundle's own dynamic loader and libraries."""
    from daemon_process import DaemonProcess

    loader = bundle / "lib" / "ld-linux-x86-64.so.2"
    args = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--backend", "cpu"]
    if loader.exists():
        return DaemonProcess(str(loader), "--library-path", str(bundle / "lib"),
                             str(bundle / "mxserved"), *args)
    return DaemonProcess(str(bundle / "mxserved"), *args)


def run_experiment(bundle: pathlib.Path, out: str) -> int:
    """`python3 -m mxserve.experiment --device cuda --quick` on two configurations
    (compute="local" on the GPU, the FP16 baseline natively with NVML power); 1 on
    failure."""
    import subprocess

    daemon = start_daemon(bundle)
    try:
        started = time.time()
        env = {**os.environ, "PYTHONPATH": str(REPO / "clients" / "python")}
        done = subprocess.run(
            [sys.executable, "-m", "mxserve.experiment", "--server", daemon.address, "--quick",
             "--device", "cuda", "--steps", "2", "--prompts", "32", "--only",
             "MX-D,rollout-MXFP4", "--quiet", "--overwrite", "--out", out],
            env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            log(f"experiment --device cuda: FAILED ({done.returncode}): {done.stderr[-2000:]}")
            return 1
        rows = (pathlib.Path(out) / "results.csv").read_text().splitlines()
        log(f"experiment --device cuda --quick (2 steps, MX-D and rollout-MXFP4, 32 prompts): "
            f"{time.time() - started:.0f} s, {len(rows) - 1} result rows in {out}")
        for row in rows[:8]:
            log("  " + row[:160])
        return 0
    finally:
        daemon.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default=str(REPO / "build" / "gpu-bundle"),
                        help="mxserved and its libraries (make gpu-bundle); default %(default)s")
    parser.add_argument("--golden", default=str(REPO.parent / "shared" / "golden" / "mx"),
                        help="the MX golden vectors (default %(default)s)")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds after which the remaining sections are skipped")
    parser.add_argument("--ppo-tokens", type=int, default=64,
                        help="prompt and response tokens each of the PPO step (default 64)")
    parser.add_argument("--skip", default="",
                        help="sections to skip: bits,speed,ppo,experiment")
    parser.add_argument("--out", default=str(REPO / "build" / "gpu-check-experiment"),
                        help="the experiment section's output directory (default %(default)s)")
    parser.add_argument("--plain-seconds", type=float,
                        help="the plain step's seconds from an earlier run on the same GPU "
                             "(skips measuring it again)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False)")
        return 2
    device = "cuda"
    name = torch.cuda.get_device_name(0)
    log(f"GPU: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
        f"Triton {triton_available()[1]}; CPU threads {torch.get_num_threads()}")
    torch.backends.cuda.matmul.allow_tf32 = False
    failures = 0
    plain_bad = set()

    if "bits" not in skip:
        for use_triton in (False, True):
            label = "Triton kernels" if use_triton else "plain torch path"
            if use_triton and not triton_available()[0]:
                log("bits: Triton unavailable, its kernels not checked")
                continue
            try:
                results = check_bits(device, use_triton, pathlib.Path(args.golden))
            except Exception as error:  # noqa: BLE001
                log(f"bits ({label}): FAILED to run: {type(error).__name__}: {error}")
                failures += 1
                results = [("run", 1, 1)]
            bad = [r for r in results if r[1]]
            if not use_triton:
                plain_bad = {r[0] for r in bad}
            if use_triton and {r[0] for r in bad} - plain_bad:
                # Never time or train on kernels that are not exact.
                os.environ["MXSERVE_EMULATOR_TRITON"] = "0"
                log("bits: the Triton kernels are off for the rest of the check")
            log(f"bits ({label}, CUDA vs CPU): {len(results) - len(bad)} of {len(results)} "
                f"cases identical, {sum(r[2] for r in results)} values")
            for case, differ, total in bad:
                log(f"  DIFFER {case}: {differ} of {total}")
            failures += len(bad)

    if "speed" not in skip and time.time() - STARTED < args.budget:
        layers = [QWEN_LAYERS[n] for n in ("q_proj", "k_proj", "k_proj", "o_proj", "up_proj",
                                           "up_proj", "down_proj")]
        log("speed: the 7 linears of one Qwen2.5-0.5B block, exact emulator (X quantized per "
            "call) vs BF16 F.linear")
        for m in (512, 4096):
            for fmt in ("MXFP4_E2M1", "MXFP6_E2M3", "MXFP6_E3M2", "MXINT8", "MXFP8_E4M3",
                        "MXFP8_E5M2", "INT8", "FP16"):
                if time.time() - STARTED > args.budget:
                    log("speed: budget reached, rest skipped")
                    break
                try:
                    exact, bf16 = speed(device, m, fmt, layers)
                    note = " (float path: fast GEMM, the contract's tolerance)" \
                        if fmt == "FP16" else ""
                    log(f"  M={m:5d} {fmt:11s} {exact:8.2f} TFLOP/s vs BF16 {bf16:7.1f}: "
                        f"{exact / bf16:.3f}x{note}")
                except Exception as error:  # noqa: BLE001
                    log(f"  M={m} {fmt}: FAILED: {type(error).__name__}: {error}")

    if "ppo" not in skip and CLIENT_ERROR:
        log(f"ppo: skipped, the client does not import here: {CLIENT_ERROR}")
    elif "ppo" not in skip and time.time() - STARTED < args.budget:
        import mxserve
        bundle = pathlib.Path(args.bundle)
        daemon = None
        try:
            if args.plain_seconds:
                plain = [args.plain_seconds] * 2
                log(f"ppo: plain GPU step as given (--plain-seconds): {plain[1]:.2f} s")
            else:
                plain, plain_wall = ppo_step_seconds(None, device, args.ppo_tokens, "")
                log(f"ppo: plain GPU step (FP16 autocast), batch 8, {args.ppo_tokens}+"
                    f"{args.ppo_tokens} tokens: {plain[1]:.2f} s (warm-up {plain[0]:.1f} s); "
                    f"phases {', '.join(f'{k} {v:.1f} s' for k, v in plain_wall.items())}")
            daemon = start_daemon(bundle)
            with mxserve.Client(daemon.address, timeout=120) as client:
                client.wait_ready(timeout=30)
                local, local_wall = ppo_step_seconds(client, device, args.ppo_tokens,
                                                     "D-phase-adaptive")
                report = client.energy_report(run="gpu-check/ppo")
                joules = sum(e.joules for e in report.entries if e.source == "fpga_model")
            log(f"ppo: policy D, compute=local: {local[1]:.2f} s (warm-up {local[0]:.1f} s); "
                f"phases {', '.join(f'{k} {v:.1f} s' for k, v in local_wall.items())}; "
                f"{local[1] / plain[1]:.2f}x the plain step (target <= 3x); the daemon booked "
                f"{joules:.4g} J (FPGA model) for the two steps")
        except Exception as error:  # noqa: BLE001
            log(f"ppo: FAILED: {type(error).__name__}: {error}")
            if daemon is not None:
                log("daemon log tail: " + " | ".join(daemon.log_lines[-5:]))
        finally:
            if daemon is not None:
                daemon.stop()

    if "experiment" not in skip and CLIENT_ERROR:
        log(f"experiment: skipped, the client does not import here: {CLIENT_ERROR}")
    elif "experiment" not in skip and time.time() - STARTED < args.budget:
        failures += run_experiment(pathlib.Path(args.bundle), args.out)

    log(f"done on {name}: {'bits identical' if not failures else f'{failures} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
