#!/usr/bin/env bash
# Installs mxserve's system dependencies from Debian 12 packages.
# Idempotent: prints nothing and touches nothing when every package is present;
# runs `apt-get update` only when something is missing.
#
# --daemon: only what building mxserved and mxctl needs (cmake with
# MXSERVE_BUILD_TESTS/BENCH/PYTHON=OFF; docker/Dockerfile's build stage).
set -euo pipefail

daemon_packages=(
  build-essential cmake pkg-config make
  libabsl-dev                                  # Status/StatusOr, strings
  libgrpc++-dev libprotobuf-dev                # the API and the daemon
  protobuf-compiler protobuf-compiler-grpc     # protoc and grpc_cpp_plugin
  nlohmann-json3-dev                           # golden manifest, policies
  prometheus-cpp-dev                           # the daemon's /metrics exposer
  libssl-dev                                   # TLS files checked before they are served
)

packages=(
  "${daemon_packages[@]}"
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and benchmarks
  libmpfr-dev                                  # exact oracle in the GEMM tests
  libsimde-dev                                 # the avx512 kernels' tests without AVX-512
  libopenblas-dev                              # benchmark peer (cblas_sgemm)
  libdnnl-dev                                  # benchmark peer (oneDNN BF16 matmul)
  prometheus                                   # the real server, for the end-to-end test
  clang libclang-rt-14-dev                     # sanitizer builds and libFuzzer (make test-asan, fuzz)
  python3 python3-grpcio python3-protobuf      # the Python client (clients/python) ...
  python3-numpy python3-torch python3-pytest   # ... its arrays, torch offload, tests
  python3-matplotlib                           # ... sensitivity heatmaps (mxserve.torch.profile)
  python3-regex                                # ... \p{L} in BPE pre-tokenization (mxserve.rlhf.tokenizer)
  python3-yaml                                 # tests/deploy: Prometheus, compose, k8s files
  docker-compose                               # tests/deploy: `docker-compose config` (no engine needed)
  openssl                                      # TLS tests: certificates made at test time
)
# tests/deploy renders deploy/k8s with `kubectl kustomize`. Debian's kubectl
# (1.20) only where none is installed: another package's kubectl (e.g. Google
# Cloud SDK's) owns /usr/bin/kubectl and would conflict with it.
command -v kubectl >/dev/null || packages+=(kubernetes-client)

case ${1:-} in
  "") ;;
  --daemon) packages=("${daemon_packages[@]}") ;;
  *) echo "usage: deps.sh [--daemon]" >&2; exit 2 ;;
esac

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
((${#missing[@]} == 0)) && exit 0

echo "deps: installing ${missing[*]}"
sudo=()
((EUID == 0)) || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { "${sudo[@]}" apt-get update -qq && 
       "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "deps: apt-get failed (log above)" >&2
  exit 1
fi
echo "deps: done"
