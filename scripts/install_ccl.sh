#!/usr/bin/env bash
# Installs oneCCL for CPUs (the HOROVOD_CPU_OPERATIONS=ccl data plane) from PyPI into the
# cache every checkout shares, once: $HVD_VENV_CACHE (default ~/.cache/horovod_cpp)/oneccl,
# a link to oneccl-<version> (headers and libccl). CMake finds it there (HVD_CCL_ROOT
# overrides). Idempotent; quick when it is there. scripts/install_deps.sh calls it.
#
# Why this version (docs/ccl.md): the 2022.x wheels require PyPI's libfabric >= 2.6, which
# this registry lacks, and their libccl needs a libccl.so.2 and Intel's compiler runtime
# that no wheel here provides; 2021.17 has the same two defects. 2021.16.2 is the newest whose
# libccl needs only the C/C++ runtimes. Its pip dependency is Intel MPI's runtime (impi-rt),
# which it only uses for its MPI transport or the libfabric it bundles: horovod_cpp takes
# neither (a second MPI must not load beside Open MPI), so the wheels install without their
# dependencies, and oneCCL loads Debian's libfabric (libfabric1) through a link next to
# libccl, where it looks first.
set -euo pipefail
VERSION=2021.16.2
CACHE=${HVD_VENV_CACHE:-${XDG_CACHE_HOME:-~/.cache}/horovod_cpp}
prefix=$CACHE/oneccl-$VERSION
if [[ -f $prefix/.complete && $(readlink "$CACHE/oneccl" 2>/dev/null) == "oneccl-$VERSION" ]]; then
  exit 0
fi
fabric=$(/sbin/ldconfig -p | awk '/libfabric\.so\.1 .*x86-64/ {print $NF; exit}')
[[ -n $fabric ]] || { echo "install_ccl: libfabric.so.1 not found (apt install libfabric1)" >&2; exit 1; }
mkdir -p "$CACHE"
exec {lock}> "$CACHE/.lock-oneccl"
flock "$lock"
if [[ ! -f $prefix/.complete ]]; then
  echo "install_ccl: installing oneCCL $VERSION from PyPI into $prefix (once per machine)" >&2
  tool=$CACHE/pip-tool
  [[ -x $tool/bin/pip ]] || /usr/bin/python3 -m venv "$tool"
  rm -rf "$prefix"
  "$tool/bin/pip" install --quiet --disable-pip-version-check --no-deps --prefix "$prefix" \
    "oneccl-cpu==$VERSION" "oneccl-cpu-devel==$VERSION" >&2 ||
    { echo "install_ccl: could not install oneCCL from PyPI" >&2; exit 1; }
  ln -sf "$fabric" "$prefix/lib/libfabric.so"
  touch "$prefix/.complete"
fi
ln -sfn "oneccl-$VERSION" "$CACHE/oneccl"
