#!/usr/bin/env bash
# `make experiment`: a daemon in emulation mode on a free 127.0.0.1 port, the quick
# experiment matrix against it (built-in model, synthetic task, every configuration),
# the daemon stopped however the script exits.
#
#   scripts/experiment.sh                          # -> build/experiment/report.md
#   EXPERIMENT_OUT=results EXPERIMENT_ARGS="--config my.toml" scripts/experiment.sh
#
# EXPERIMENT_ARGS replaces --quick (e.g. "--config FILE", "--quick --steps 20").
# EXPERIMENT_MODE is --overwrite (the default: each run starts over in
# EXPERIMENT_OUT) or --resume (continue a killed run there).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD_DIR:-$root/build}/bin
out=${EXPERIMENT_OUT:-$root/build/experiment}
args=${EXPERIMENT_ARGS:---quick}
if [[ ! -x $bin/mxserved ]]; then
  echo "experiment: $bin/mxserved is missing; build first (make build)" >&2
  exit 2
fi

log=$(mktemp)
"$bin/mxserved" --backend cpu --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  ${MXSERVED_FLAGS:-} 2>"$log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true; rm -f "$log"' EXIT

address=""
for _ in $(seq 300); do
  address=$(sed -n 's/.*event=listening grpc=\([^ ]*\).*/\1/p' "$log" | head -n1)
  [[ -n $address ]] && break
  if ! kill -0 $daemon 2>/dev/null; then
    echo "experiment: mxserved exited:" >&2
    cat "$log" >&2
    exit 2
  fi
  sleep 0.1
done
if [[ -z $address ]]; then
  echo "experiment: mxserved did not start listening within 30 s" >&2
  exit 2
fi
echo "experiment: mxserved (CPU emulation) on $address; results in $out"

export PYTHONPATH="$root/clients/python${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086  # EXPERIMENT_ARGS is a list of arguments
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} /usr/bin/python3 -m mxserve.experiment \
  --server "$address" --out "$out" ${EXPERIMENT_MODE:---overwrite} $args
