# Sourced by bench/cpu_check.sh and bench/cpu_ab.sh. unpack_cpu_bundle FILE NAME
# unpacks a `make cpu-bundle` archive into a temporary directory removed on
# exit and sets $b to the bundle in it; run_bundled runs a program with the
# bundle's loader and libraries (the host needs none of Debian's packages).
unpack_cpu_bundle() {
  bundle_tmp=$(mktemp -d)
  trap 'rm -rf "$bundle_tmp"' EXIT
  tar -C "$bundle_tmp" -xJf "$1" || { echo "$2: cannot unpack $1 (make cpu-bundle)" >&2; exit 1; }
  b=$bundle_tmp/cpu-bundle
}
run_bundled() { "$b/lib/ld-linux-x86-64.so.2" --library-path "$b/lib" "$@"; }
