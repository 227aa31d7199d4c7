#!/usr/bin/env bash
# Shows that mxserved and mxctl build with only gRPC, protobuf, Abseil,
# prometheus-cpp and nlohmann-json installed (make check-minimal-build).
#
# Configures a scratch tree with the tests, benchmarks and Python client off and
# everything else hidden: find_package of the test and bench packages disabled,
# pkg-config limited to the .pc files of the allowed packages and what they
# require (no mpfr, openblas, dnnl), and `import torch`/`import pytest` failing
# in any Python the build might start. Builds only mxserved and mxctl, then
# checks that CMakeCache.txt names none of the hidden packages and that neither
# binary loads their libraries (ldd), and that mxctl links nothing from fpga/.
#
# The scratch build tree lies in the checkout (build-minimal.XXXXXX, removed at
# the end) at the same depth as build/, so with ccache (CMAKE_CXX_COMPILER_LAUNCHER,
# base_dir the checkout unless CCACHE_BASEDIR is set) the objects build/ compiled
# come from the cache: same flags, same relative paths.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-2}
start=$SECONDS

build=$(mktemp -d "$repo/build-minimal.XXXXXX")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/mxserve-minimal.XXXXXX")  # pkg-config, python, logs
trap 'rm -rf "$build" "$scratch"' EXIT

fail() {
  echo "check_minimal_build: FAIL: $*" >&2
  exit 1
}

# --- pkg-config: the allowed packages and their requirements, nothing else ----
pcdir="$scratch/pkgconfig"
mkdir -p "$pcdir"
pc_path=$(pkg-config --variable pc_path pkg-config)
# gRPC's CMake config finds re2 and c-ares through pkg-config; absl_* are Abseil.
roots=(grpc++ grpc gpr protobuf prometheus-cpp-core prometheus-cpp-pull nlohmann_json re2
       libcares zlib openssl)
IFS=: read -r -a pc_dirs <<<"${PKG_CONFIG_PATH:+$PKG_CONFIG_PATH:}$pc_path"
for dir in "${pc_dirs[@]}"; do
  for pc in "$dir"/absl_*.pc; do
    [[ -e $pc ]] && roots+=("$(basename "$pc" .pc)")
  done
done
declare -A seen=()
queue=("${roots[@]}")
while ((${#queue[@]})); do
  name=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n ${seen[$name]:-} ]] && continue
  seen[$name]=1
  found=""
  for dir in "${pc_dirs[@]}"; do
    if [[ -e $dir/$name.pc ]]; then
      found=$dir/$name.pc
      break
    fi
  done
  [[ -n $found ]] || continue  # not installed here: then nothing can ask for it either
  ln -sf "$found" "$pcdir/$name.pc"
  while read -r required _; do
    [[ -n $required ]] && queue+=("$required")
  done < <(pkg-config --print-requires --print-requires-private "$name")
done
for hidden in mpfr openblas dnnl gtest gmock benchmark; do
  [[ ! -e $pcdir/$hidden.pc ]] || fail "$hidden.pc is required by an allowed package"
done
export PKG_CONFIG_LIBDIR="$pcdir"
unset PKG_CONFIG_PATH

# --- Python: torch and pytest fail to import in any interpreter ---------------
stubs="$scratch/bin"
pyblock="$scratch/pyblock"
mkdir -p "$stubs" "$pyblock"
for module in torch pytest; do
  printf 'raise ImportError("check_minimal_build: the minimal build must not import %s")\n' \
    "$module" >"$pyblock/$module.py"
done
real_python=$(command -v python3 || true)
cat >"$stubs/python3" <<EOF
#!/usr/bin/env bash
# check_minimal_build's python3: logs the call, then the real one with torch
# and pytest unimportable.
echo "python3 \$*" >>"$scratch/python-calls.log"
case "\$*" in *torch*|*pytest*) echo "python3 stub: no torch or pytest here" >&2; exit 1 ;; esac
${real_python:+exec "$real_python" "\$@"}
exit 1
EOF
chmod +x "$stubs/python3"
ln -s python3 "$stubs/python"
export PATH="$stubs:$PATH"
export PYTHONPATH="$pyblock${PYTHONPATH:+:$PYTHONPATH}"

# --- configure and build --------------------------------------------------------
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$repo}
fi
cmake -S "$repo" -B "$build" --no-warn-unused-cli "${launcher[@]}" \
  -DMXSERVE_BUILD_TESTS=OFF -DMXSERVE_BUILD_BENCH=OFF -DMXSERVE_BUILD_PYTHON=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_GMock=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON -DCMAKE_DISABLE_FIND_PACKAGE_dnnl=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON -DCMAKE_DISABLE_FIND_PACKAGE_XRT=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON -DCMAKE_DISABLE_FIND_PACKAGE_Python3=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_PythonInterp=ON >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log" >&2; fail "configure"; }

# --- the cache ------------------------------------------------------------------
# The cache may name the hidden packages only in option docs and our own
# CMAKE_DISABLE_FIND_PACKAGE_* switches; anything else (a *_DIR, *_FOUND, a
# library or include path) means something looked for one and found it.
hidden_names='gtest|gmock|benchmark|mpfr|openblas|dnnl|torch'
if leaks=$(grep -v -e '^//' -e '^CMAKE_DISABLE_FIND_PACKAGE_' -e '^MXSERVE_BUILD_' \
             "$build/CMakeCache.txt" | grep -iE "$hidden_names"); then
  fail "CMakeCache.txt names a hidden package:"$'\n'"$leaks"
fi

cmake --build "$build" -j"$jobs" --target mxserved mxctl >"$scratch/build.log" 2>&1 ||
  { tail -n 40 "$scratch/build.log" >&2; fail "build"; }

# --- the binaries ---------------------------------------------------------------
for binary in mxserved mxctl; do
  [[ -x $build/bin/$binary ]] || fail "bin/$binary was not built"
  if libs=$(ldd "$build/bin/$binary" | grep -E 'lib(openblas|mpfr|dnnl|torch|gtest|benchmark)'); then
    fail "$binary loads a hidden library:"$'\n'"$libs"
  fi
done
# Clients depend on proto and mx only (CONTRIBUTING.md): no fpga/ library in mxctl.
mxctl_link=$(find "$build/clients/cpp/CMakeFiles/mxctl.dir" -name link.txt)
! grep -qE 'libfpga_|libmxserve_(server|rpc|compute|model)' "$mxctl_link" ||
  fail "mxctl links an fpga/ or server/ library: $(cat "$mxctl_link")"
python_calls=0
[[ -e $scratch/python-calls.log ]] && python_calls=$(wc -l <"$scratch/python-calls.log")

echo "check_minimal_build: mxserved and mxctl built with only gRPC, protobuf, Abseil," \
     "prometheus-cpp and nlohmann-json"
echo "  pkg-config saw ${#seen[@]} names, $(find "$pcdir" -name '*.pc' | wc -l) .pc files" \
     "(no mpfr, openblas, dnnl, gtest, benchmark); python3 calls: $python_calls"
for binary in mxserved mxctl; do
  echo "  $binary: $(ldd "$build/bin/$binary" | wc -l) shared libraries, none of" \
       "libopenblas, libmpfr, libdnnl, libtorch, libgtest, libbenchmark"
done
echo "check_minimal_build: OK in $((SECONDS - start)) s"
