#!/usr/bin/env bash
# The files compiled for AVX2, AVX-512 or AMX (*_avx2.cc, *_avx512.cc, *_amx.cc)
# must define no weak or unique symbols.
# Such a symbol (an inline function, a template instantiation) can have a
# baseline copy elsewhere, and the linker keeps one of them for every caller: if
# it keeps the AVX2 one, the scalar level runs AVX2 code on a CPU without it
# (and likewise for AVX-512).
# Arguments: the object files of the mx library.
set -euo pipefail
checked=0
for object in "$@"; do
  [[ $object == *_avx2.cc.o || $object == *_avx512.cc.o || $object == *_amx.cc.o ]] || continue
  checked=$((checked + 1))
  # typeinfo objects (UBSan's function-type checks emit them) are data, the same
  # bytes in every copy: only code can run with the wrong ISA.
  shared=$(nm -C "$object" | awk '$2 ~ /^[WVu]$/' | grep -v ' typeinfo \(name \)\?for ' || true)
  if [[ -n $shared ]]; then
    echo "$object defines symbols the linker may share with baseline code:" >&2
    echo "$shared" >&2
    exit 1
  fi
done
if ((checked == 0)); then
  echo "no *_avx2.cc.o, *_avx512.cc.o or *_amx.cc.o among the arguments" >&2
  exit 1
fi
echo "checked $checked AVX2/AVX-512/AMX objects: no weak or unique symbols"
