#!/usr/bin/python3
"""How long a sensitivity profile of a Qwen2.5-0.5B-shaped model takes (issue 16).

Starts a real mxserved on 127.0.0.1, registers the 168 linear layers of
Qwen2.5-0.5B (24 blocks of q/k/v/o_proj and gate/up/down_proj, hidden 896,
intermediate 4864, 2 KV heads of 64) with random weights, and profiles them
with calibration data of --tokens rows per layer (default 8 × 128) and their
output gradients in --formats, timing the ProfileModel stream end to end.

Peers, measured in the same run on the same CPU:
  * torch FP32: the same GEMMs (one per layer and format, plus the reference)
    as torch.nn.functional.linear on this machine's torch threads; the floor
    for any profiler that runs each layer in each format once;
  * the original method (ORIGIN.md): quantize one layer at a time and rerun
    the model, 168 layers × F formats full forward passes; estimated from one
    timed FP32 forward pass through all 168 layers in torch.

Run after `make build`:  /usr/bin/python3 bench/profile_bench.py [--help]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))

try:
    import numpy as np
    import torch

    import mxserve
    from mxserve.rlhf.machine import cpu_model
except ImportError as error:
    sys.exit(f"profile_bench.py: cannot import what it needs ({error}).\n"
             "Run it with /usr/bin/python3 after `make build` (python3-grpcio, -protobuf, "
             "-numpy, -torch).")

HIDDEN, INTERMEDIATE, KV = 896, 4864, 128
SHAPES = {  # name: (out_features, in_features)
    "self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (KV, HIDDEN),
    "self_attn.v_proj": (KV, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (INTERMEDIATE, HIDDEN), "mlp.up_proj": (INTERMEDIATE, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTERMEDIATE),
}
DEFAULT_FORMATS = "MXFP4_E2M1,MXFP6_E2M3,MXFP8_E4M3,MXINT8,INT8,BF16"


def start_daemon(binary: str, threads: int) -> tuple[subprocess.Popen, str]:
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--kernel-threads",
         str(threads), "--max-message-bytes", str(64 << 20), "--weight-memory-bytes", "8GiB"],
        stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 30
    while time.time() < deadline:
        log.seek(0)
        found = re.search(r"event=listening grpc=(\S+)", log.read())
        if found:
            return process, found.group(1)
        if process.poll() is not None:
            log.seek(0)
            sys.exit(f"mxserved exited at start:\n{log.read()}")
        time.sleep(0.05)
    process.kill()
    sys.exit("mxserved did not start listening within 30 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mxserved", default=str(REPO / "build" / "bin" / "mxserved"))
    parser.add_argument("--blocks", type=int, default=24, help="transformer blocks (24: 168 layers)")
    parser.add_argument("--tokens", type=int, default=8 * 128,
                        help="calibration rows per layer (default 8 × 128)")
    parser.add_argument("--formats", default=DEFAULT_FORMATS, help="comma-separated formats")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="--kernel-threads of the daemon and torch's threads")
    parser.add_argument("--no-gradients", action="store_true", help="inputs only (no Fisher)")
    args = parser.parse_args()
    formats = args.formats.split(",")
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    layers = [(f"model.layers.{b}.{name}", out, inp)
              for b in range(args.blocks) for name, (out, inp) in SHAPES.items()]
    macs = sum(out * inp for _, out, inp in layers) * args.tokens
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; threads {args.threads}")
    print(f"model: {len(layers)} linear layers ({args.blocks} blocks), "
          f"{sum(o * i for _, o, i in layers) / 1e6:.0f} M weights; calibration {args.tokens} "
          f"rows per layer{'' if args.no_gradients else ' with output gradients'}; "
          f"formats {', '.join(formats)}")

    weights = {name: rng.standard_normal((out, inp), dtype=np.float32) * (inp ** -0.5)
               for name, out, inp in layers}
    process, address = start_daemon(args.mxserved, args.threads)
    try:
        with mxserve.Client(address, timeout=600) as client:
            client.register_model("qwen-shaped", [(n, o, i) for n, o, i in layers])
            start = time.perf_counter()
            client.upload_weights("qwen-shaped", weights, publish=True)
            upload = time.perf_counter() - start

            def batches():
                data = np.random.default_rng(1)
                for name, out, inp in layers:
                    x = data.standard_normal((args.tokens, inp), dtype=np.float32)
                    dy = None if args.no_gradients else (
                        data.standard_normal((args.tokens, out), dtype=np.float32) * 1e-3)
                    yield name, x, dy

            start = time.perf_counter()
            profile = client.profile("qwen-shaped", batches(), formats=formats)
            seconds = time.perf_counter() - start
            client.delete_model("qwen-shaped")
    finally:
        process.terminate()
        process.wait(timeout=60)

    # Peers: the same GEMMs in torch FP32, and one full FP32 pass of the model.
    xs = {inp: torch.randn(args.tokens, inp) for inp in {HIDDEN, INTERMEDIATE}}
    tw = {name: torch.from_numpy(w) for name, w in weights.items()}
    start = time.perf_counter()
    for name, _, inp in layers:
        torch.nn.functional.linear(xs[inp], tw[name])
    one_pass = time.perf_counter() - start
    torch_same_work = one_pass * (len(formats) + 1)
    original = one_pass * len(layers) * len(formats)

    print(f"upload of the weights: {upload:.1f} s")
    print(f"profile ({len(layers)} layers × {len(formats)} formats, {args.tokens} rows): "
          f"{seconds:.1f} s wall, {profile.compute_seconds:.1f} s of daemon compute; "
          f"{macs * (len(formats) + 1) / seconds / 1e9:.1f} GMAC/s counting the reference")
    print(f"torch FP32, the same {len(formats) + 1} GEMMs per layer: {torch_same_work:.1f} s "
          f"(profile / torch = {seconds / torch_same_work:.2f}×)")
    print(f"original method, {len(layers)} × {len(formats)} full forward passes "
          f"(one measured: {one_pass:.2f} s): ≈ {original / 60:.1f} min "
          f"(profile is {original / seconds:.0f}× faster)")
    worst = max(profile.rows, key=lambda r: r.rel_error)
    print(f"most sensitive (layer, format): {worst.layer} {worst.format} "
          f"rel_error {worst.rel_error:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
