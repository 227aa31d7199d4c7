#!/usr/bin/env bash
# Interleaved A/B runs of mx_bench on a noisy machine (a shared VM moves 20 % or
# more between minutes): each variant — an mx_bench binary at an MX_ISA level —
# runs once per round, the rounds alternate, and each benchmark's time is set
# against onednn_bf16 measured in the same process. Prints, per benchmark and
# variant, the median over rounds of that ratio (> 1: faster than oneDNN BF16)
# and of the time. Binaries run with the loader and libraries of a cpu-bundle
# (make cpu-bundle), so the machine needs none of Debian's packages.
#
#   bench/cpu_ab.sh BUNDLE.tar.xz OUT ROUNDS FILTER LABEL=BINARY@ISA[+VAR=VALUE...]...
#
# BINARY: a path, or a name inside the bundle (mx_bench). FILTER: mx_bench's
# --benchmark_filter; it must take onednn_bf16 at the same shapes. Each
# +VAR=VALUE is set in that variant's environment only (a binary's own knob).
# MX_BENCH_ARGS: more arguments for every binary (e.g. --threads=16).
set -uo pipefail
[ $# -ge 5 ] || { sed -n 2,14p "$0" >&2; exit 2; }
bundle=$1 out=$2 rounds=$3 filter=$4
shift 4
mkdir -p "$out"
. "$(dirname "$0")/cpu_bundle.sh"
unpack_cpu_bundle "$bundle" cpu_ab
for round in $(seq 1 "$rounds"); do
  for variant in "$@"; do
    label=${variant%%=*} rest=${variant#*=}
    binary=${rest%@*} isa_env=${rest##*@}
    isa=${isa_env%%+*} env=()
    [ "$isa" = "$isa_env" ] || IFS=+ read -ra env <<<"${isa_env#*+}"
    [ -e "$binary" ] || binary=$b/$binary
    echo "round $round: $label ($binary at $isa${env[*]:+, ${env[*]}})" >&2
    (export MX_ISA="$isa" "${env[@]}"
     run_bundled "$binary" \
       --benchmark_filter="$filter" --benchmark_format=json ${MX_BENCH_ARGS:-} \
       >"$out/ab_${label}_$round.json" 2>/dev/null) || echo "cpu_ab: $label failed" >&2
  done
done
python3 - "$out" "$rounds" "$@" <<'PY'
import json, statistics, sys
out, rounds, variants = sys.argv[1], int(sys.argv[2]), [v.split("=")[0] for v in sys.argv[3:]]
times = {}  # (benchmark, label) -> [(seconds, ratio to onednn_bf16)]
kernels = {}  # (benchmark, label) -> the kernel mx_bench named
for label in variants:
    for r in range(1, rounds + 1):
        try:
            runs = json.load(open(f"{out}/ab_{label}_{r}.json"))["benchmarks"]
        except (OSError, ValueError):
            continue
        t = {}
        for run in runs:
            if run.get("error_occurred"):
                continue
            name = run["name"].split("/min_time")[0]
            secs = run["real_time"] * {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1}[run["time_unit"]]
            t[name] = min(t.get(name, secs), secs)
            kernels.setdefault((name, label), run.get("label", ""))
        for name, secs in t.items():
            parts = name.split("/")
            peer = "/".join([parts[0], "onednn_bf16"] + parts[2:])
            if "onednn" in name or peer not in t:
                continue
            times.setdefault((name, label), []).append((secs, t[peer] / secs))
print(f"{'benchmark':<40} {'variant':<10} {'kernel':<24} {'ms (median)':>11} {'vs onednn_bf16':>15}  rounds")
for (name, label), value in sorted(times.items()):
    ms = statistics.median(s for s, _ in value) * 1e3
    ratio = statistics.median(q for _, q in value)
    print(f"{name:<40} {label:<10} {kernels[(name, label)]:<24} {ms:>11.3f} {ratio:>15.2f}  "
          + " ".join(f"{q:.2f}" for _, q in value))
PY
