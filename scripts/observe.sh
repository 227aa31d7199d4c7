#!/usr/bin/env bash
# `make observe`: the observability stack without Docker. mxserved (CPU emulation,
# policy D) and Debian's Prometheus, natively, with deploy/prometheus/prometheus.yml
# and its recording rules; prints where to look and stays in the foreground until
# Ctrl-C (or SIGTERM), which stops both.
#
#   scripts/observe.sh
#   OBSERVE_GRPC_PORT=50052 OBSERVE_METRICS_PORT=9465 OBSERVE_PROMETHEUS_PORT=9091 scripts/observe.sh
#
# Everything listens on 127.0.0.1. Prometheus keeps its data in $OBSERVE_DIR
# (default build/observe) between runs. With a metrics port other than 9464 the
# config is copied there with only the scrape target changed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD_DIR:-$root/build}/bin
dir=${OBSERVE_DIR:-${BUILD_DIR:-$root/build}/observe}
grpc_port=${OBSERVE_GRPC_PORT:-50051}
metrics_port=${OBSERVE_METRICS_PORT:-9464}
prometheus_port=${OBSERVE_PROMETHEUS_PORT:-9090}
prometheus=${PROMETHEUS:-/usr/bin/prometheus}

for tool in "$bin/mxserved" "$prometheus"; do
  if [[ ! -x $tool ]]; then
    echo "observe: $tool is missing (make deps build)" >&2
    exit 2
  fi
done
mkdir -p "$dir"

config=$root/deploy/prometheus/prometheus.yml
if [[ $metrics_port != 9464 ]]; then
  sed "s/127\.0\.0\.1:9464/127.0.0.1:$metrics_port/" "$config" > "$dir/prometheus.yml"
  cp -r "$root/deploy/prometheus/rules" "$dir/"
  config=$dir/prometheus.yml
fi

pids=()
stop() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "observe: stopped" >&2
}
trap stop EXIT
trap 'exit 0' INT TERM

"$bin/mxserved" --backend cpu --default-policy D-phase-adaptive \
  --listen "127.0.0.1:$grpc_port" --metrics-listen "127.0.0.1:$metrics_port" \
  ${MXSERVED_FLAGS:-} 2>"$dir/mxserved.log" &
pids+=($!)
"$prometheus" --config.file="$config" --storage.tsdb.path="$dir/prometheus-data" \
  --web.listen-address="127.0.0.1:$prometheus_port" 2>"$dir/prometheus.log" &
pids+=($!)

# Ready when the daemon listens and Prometheus answers /-/ready.
for _ in $(seq 300); do
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "observe: a process exited at start; logs:" >&2
      tail -n 20 "$dir/mxserved.log" "$dir/prometheus.log" >&2
      exit 2
    fi
  done
  if grep -q "event=listening" "$dir/mxserved.log" &&
     /usr/bin/python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$prometheus_port/-/ready', timeout=1)" 2>/dev/null; then
    ready=1
    break
  fi
  sleep 0.1
done
if [[ -z ${ready:-} ]]; then
  echo "observe: not ready within 30 s; logs in $dir" >&2
  exit 2
fi

prom="http://127.0.0.1:$prometheus_port"
cat <<MSG
observe: ready
  mxserved     gRPC 127.0.0.1:$grpc_port   metrics http://127.0.0.1:$metrics_port/metrics
  Prometheus   $prom   (targets: $prom/targets, rules: $prom/rules)
  logs         $dir/mxserved.log, $dir/prometheus.log

Energy per phase and source, the last 15 minutes:
  $prom/graph?g0.expr=sum%20by%20(phase%2C%20source)%20(increase(mxserve_energy_joules_total%5B15m%5D))&g0.tab=1
Recording rules (deploy/prometheus/rules/mxserve.rules.yml), e.g.
  source_phase:mxserve_energy_watts:rate1m   source_phase_format:mxserve_joules_per_gflop:ratio_rate5m
The Grafana dashboard's queries, panel by panel: README.md, "Observe and deploy".

Some traffic, in another terminal:
  build/bin/mxctl --server 127.0.0.1:$grpc_port bench --phase rollout --format mxfp4 --m 8 --k 896 --n 4864 --duration 30s
Ctrl-C stops both.
MSG
wait -n "${pids[@]}" || true
echo "observe: a process exited; logs in $dir" >&2
exit 1
