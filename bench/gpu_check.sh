#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): the emulator's CUDA bits against its CPU bits,
# the exact linear's speed against BF16 F.linear, and a PPO step under policy D with
# compute="local" against a plain GPU step. Needs python3 with torch (CUDA), numpy,
# grpcio and protobuf (Triton optional); the daemon comes from `make gpu-bundle`
# (mxserved with its own loader and libraries), so the GPU host needs no Debian
# packages. Copy the checkout with build/gpu-bundle and clients/python/mxserve/v1.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/gpu_check.py "$@"
