#!/usr/bin/env bash
# The CPU check on a borrowed machine (a GPU server's Xeon with AVX-512 and AMX,
# 16 cores) that has none of Debian's packages: unpacks build/cpu-bundle.tar.xz
# (`make cpu-bundle`), records lscpu, runs the numerics and kernel tests at every
# ISA level the CPU has (amx included where the kernel grants the tile state),
# then mx_bench: every kind and its peers at M = 8 and 512 on one thread and on
# all cores, two threads against one, the model sweep, and the MX kinds again
# with MX_ISA=avx512 so that amx and avx512 compare on the same CPU.
#
#   bench/cpu_check.sh [bundle.tar.xz] [output dir]      (defaults below)
#
# Logs go to the output dir as they are written, so a run stopped at its time
# limit still leaves what it measured.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(realpath -m "${1:-$repo/build/cpu-bundle.tar.xz}")
out=$(realpath -m "${2:-${OUT:-/tmp/cpu-check}}")
mkdir -p "$out"
. "$repo/bench/cpu_bundle.sh"
unpack_cpu_bundle "$bundle" cpu_check
cores=$(nproc)
many=$((cores < 2 ? 2 : cores))  # mx_bench --threads takes 2..1024
{ lscpu; echo; echo "nproc: $cores"; } >"$out/lscpu.txt"
grep -E 'Model name' "$out/lscpu.txt"
echo "AVX-512/AMX flags: $(grep -oE 'avx512[a-z0-9_]*|amx[a-z0-9_]*' "$out/lscpu.txt" | sort -u | tr '\n' ' ')"
export MXSERVE_GOLDEN_DIR=$b/golden

status=0
for t in mx_tests mx_kernels_tests mx_emulated_levels_tests; do
  echo "== $t"
  run_bundled "$b/$t" --gtest_brief=1 >"$out/$t.log" 2>&1 || status=1
  tail -3 "$out/$t.log"
done

echo "== amx_probe"
run_bundled "$b/amx_probe" | tee "$out/amx_probe.txt"

kinds='MXFP8_E4M3|MXFP8_E5M2|MXFP6_E3M2|MXFP6_E2M3|MXFP4_E2M1|NVFP4|MXINT8|INT8|BF16'
peers='openblas_sgemm|onednn_bf16'
echo "== mx_bench, default ISA, 1 and $many threads"
run_bundled "$b/mx_bench" --threads="$many" \
  --benchmark_filter="^gemm/($kinds|$peers)/(8|512)x4864x896(/threads:$many)?/|^model/(MXFP8_E4M3|MXINT8|MXFP4_E2M1|BF16|$peers)/" \
  2>&1 | tee "$out/bench_default.log" | grep -E '^ratio|kernels at|^(gemm|model)/'
echo "== mx_bench, 2 threads, M = 512"
run_bundled "$b/mx_bench" --threads=2 \
  --benchmark_filter="^gemm/($kinds|$peers)/512x4864x896(/threads:2)?/" 2>&1 |
  tee "$out/bench_two.log" | grep -E 'vs one thread'
echo "== mx_bench, MX_ISA=avx512, one thread"
MX_ISA=avx512 run_bundled "$b/mx_bench" \
  --benchmark_filter="^gemm/($kinds|onednn_bf16)/(8|512)x4864x896/" 2>&1 |
  tee "$out/bench_avx512.log" | grep -E '^ratio.*onednn_bf16|kernels at'
exit $status
