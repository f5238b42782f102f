#!/usr/bin/env bash
# Quick start 1/2: install what is missing, build, and run the main job on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install_deps.sh
scripts/build.sh build
source scripts/mpi_env.sh
echo "+ mpirun -np 2 build/examples/demo" >&2
mpirun -np 2 build/examples/demo
