#!/usr/bin/env bash
# Configures and builds horovod_cpp.   scripts/build.sh [BUILD_DIR] [extra cmake args...]
# Re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh   # the Debian packages it builds on (one dpkg query when they are there)
build_dir=${1:-build}
shift || true
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log" >&2; exit 1; }
grep "horovod_cpp:" "$build_dir.configure.log" >&2 || true
cmake --build "$build_dir" -j "$(nproc)"
