#!/usr/bin/env bash
# docs/cpp.md's "your own C++ program" path, end to end: install the build tree into a
# temporary prefix, configure and build examples/consumer against it with
# find_package(horovod_cpp), run it on 2 ranks and check that it learned y = 3x.
#   check_install.sh BUILD_DIR SOURCE_DIR MPIEXEC [MPIEXEC_FLAG...]
set -euo pipefail
build=$1 source=$2 mpiexec=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/hvd-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/examples/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" -j2 >/dev/null
out=$(timeout 120 "$mpiexec" -np 2 "$@" "$work/build/my_trainer")
echo "$out"
# "weight W on 2 ranks": W within 0.05 of 3.
awk '/^weight/ { w = $2; found = 1 }
     END { if (!found) { print "no weight line"; exit 1 }
           if (w < 2.95 || w > 3.05) { print "weight " w " is not 3 +- 0.05"; exit 1 }
           print "consumer learned weight " w }' <<<"$out"
