#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries the given binaries
# load (ldd, then dpkg -S on each resolved file), sorted and unique, one a line.
# docker/Dockerfile's runtime stage installs exactly these.
#
#   scripts/runtime_packages.sh build/bin/mxserved build/bin/mxctl
#
# Fails, naming the library, when one is not found or belongs to no package (a
# library built here or copied by hand would not reach the runtime image).
set -euo pipefail

if (($# == 0)); then
  echo "usage: runtime_packages.sh BINARY..." >&2
  exit 2
fi

libraries=()
for binary in "$@"; do
  [[ -f $binary ]] || { echo "runtime_packages: $binary: no such file" >&2; exit 1; }
  output=$(ldd "$binary") || { echo "runtime_packages: ldd $binary failed" >&2; exit 1; }
  while read -r line; do
    case $line in
      *"not found"*)
        echo "runtime_packages: $binary: ${line%% *} not found" >&2
        exit 1
        ;;
      *" => "/*) path=${line#* => }; libraries+=("${path%% (*}") ;;  # libfoo.so.1 => /lib/.. (0x..)
      /*) libraries+=("${line%% (*}") ;;                               # /lib64/ld-linux-x86-64.so.2 (0x..)
      *) ;;                                                           # linux-vdso.so.1: the kernel's
    esac
  done <<<"$output"
done

# Every spelling of each library dpkg may know it by: on a merged-/usr system ldd
# prints /lib/... for files dpkg may record as /usr/lib/... (or the reverse),
# and a soname link may be recorded only as its target. One dpkg-query call for
# all of them (each call reads the whole database).
spellings() {
  local candidate
  for candidate in "$1" "$(readlink -f "$1")"; do
    echo "$candidate"
    case $candidate in
      /usr/*) echo "${candidate#/usr}" ;;
      *) echo "/usr$candidate" ;;
    esac
  done
}
mapfile -t libraries < <(printf '%s\n' "${libraries[@]}" | sort -u)
candidates=()
for library in "${libraries[@]}"; do
  mapfile -t -O "${#candidates[@]}" candidates < <(spellings "$library")
done
# Lines are "pkg:arch: /path"; paths no package holds only go to stderr.
declare -A owner=()
while IFS= read -r line; do
  [[ $line == "diversion by"* ]] && continue
  path=${line#*: }
  package=${line%%: *}
  package=${package%%,*}            # "pkg1, pkg2: /dir" (shared directories)
  owner[$path]=${package%%:*}       # no :arch
done < <(dpkg-query -S "${candidates[@]}" 2>/dev/null || true)

packages=()
for library in "${libraries[@]}"; do
  package=""
  while read -r candidate; do
    if [[ -n ${owner[$candidate]:-} ]]; then
      package=${owner[$candidate]}
      break
    fi
  done < <(spellings "$library")
  if [[ -z $package ]]; then
    echo "runtime_packages: $library belongs to no Debian package" >&2
    exit 1
  fi
  packages+=("$package")
done
printf '%s\n' "${packages[@]}" | LC_ALL=C sort -u
