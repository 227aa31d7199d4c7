#!/usr/bin/env bash
# The daemon's overhead, measured: mxserved with the null backend (no compute)
# against bare_server (no daemon at all) on the same gRPC library, the same
# message sizes and the same load-generator code, and the ratios against the
# targets: p50 latency <= 1.3x the bare server's, throughput >= 0.8x.
#
#   bench/overhead.sh              # or: make bench-overhead
#   DURATION=30s CONCURRENCY=16 bench/overhead.sh
#
# Exit status 0 when both targets are met, 1 when one is missed, 2 on a setup
# failure. Both servers listen on 127.0.0.1 with ports they pick, and are stopped
# when the script exits, however it exits.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD_DIR:-$root/build}/bin
duration=${DURATION:-10s}
concurrency=${CONCURRENCY:-8}
shape=(--m 8 --k 896 --n 4864)
p50_target=1.3
throughput_target=0.8

# The same allocator settings for all four processes. With glibc's defaults a
# 155 KB message buffer sits right at the dynamic mmap/trim thresholds, and a
# small process (bare_server, bare_client) pays page faults and page clearing on
# every message while a big one (mxserved, mxctl after its weight upload) does not:
# up to 2x in throughput that has nothing to do with the daemon.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456}

for tool in mxserved mxctl bare_server bare_client; do
  if [[ ! -x $bin/$tool ]]; then
    echo "overhead: $bin/$tool is missing; build first (make build)" >&2
    exit 2
  fi
done

workdir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for_address PID LOG SED-SCRIPT: the address the server logs, within 20 s.
wait_for_address() {
  local pid=$1 log=$2 script=$3 address
  for _ in $(seq 200); do
    address=$(sed -n "$script" "$log" | head -n 1)
    if [[ -n $address ]]; then
      echo "$address"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "overhead: server exited before listening; its log:" >&2
      cat "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "overhead: server did not listen within 20 s; its log:" >&2
  cat "$log" >&2
  return 1
}

"$bin/mxserved" --backend null --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  2>"$workdir/mxserved.log" &
pids+=($!)
daemon=$(wait_for_address "${pids[-1]}" "$workdir/mxserved.log" \
  's/.* event=listening .*grpc=\([0-9.]*:[0-9]*\).*/\1/p') || exit 2

"$bin/bare_server" --listen 127.0.0.1:0 >"$workdir/bare.log" 2>&1 &
pids+=($!)
bare=$(wait_for_address "${pids[-1]}" "$workdir/bare.log" \
  's/^listening grpc=\([0-9.]*:[0-9]*\).*/\1/p') || exit 2

echo "mxserved (null backend) at $daemon, bare_server at $bare;" \
  "m=8 k=896 n=4864, concurrency $concurrency, $duration each"
daemon_json=$("$bin/mxctl" --server "$daemon" bench --phase rollout --format mxfp4 "${shape[@]}" \
  --concurrency "$concurrency" --duration "$duration" --json) || {
  echo "overhead: mxctl bench failed" >&2
  exit 2
}
bare_json=$("$bin/bare_client" --server "$bare" "${shape[@]}" \
  --concurrency "$concurrency" --duration "$duration" --json) || {
  echo "overhead: bare_client failed" >&2
  exit 2
}
echo "daemon: $daemon_json"
echo "bare:   $bare_json"

# field JSON KEY: a number from the one-line JSON objects both tools print.
field() { sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" <<<"$1"; }

awk -v dp50="$(field "$daemon_json" p50_ms)" -v bp50="$(field "$bare_json" p50_ms)" \
    -v drps="$(field "$daemon_json" requests_per_second)" \
    -v brps="$(field "$bare_json" requests_per_second)" \
    -v p50_target="$p50_target" -v throughput_target="$throughput_target" '
BEGIN {
  if (bp50 <= 0 || brps <= 0 || drps <= 0) { print "overhead: no successful requests"; exit 2 }
  p50_ratio = dp50 / bp50
  throughput_ratio = drps / brps
  p50_ok = p50_ratio <= p50_target
  throughput_ok = throughput_ratio >= throughput_target
  printf "\n%-22s %12s %12s %8s %10s\n", "", "mxserved", "bare", "ratio", "target"
  printf "%-22s %12.3f %12.3f %8.2f %10s  %s\n", "p50 latency (ms)", dp50, bp50, p50_ratio,
         "<= " p50_target, p50_ok ? "met" : "MISSED"
  printf "%-22s %12.1f %12.1f %8.2f %10s  %s\n", "throughput (req/s)", drps, brps,
         throughput_ratio, ">= " throughput_target, throughput_ok ? "met" : "MISSED"
  exit (p50_ok && throughput_ok) ? 0 : 1
}'
