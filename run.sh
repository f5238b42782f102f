#!/usr/bin/env bash
# Quick start 1/2: install what is missing, build, and train the example model (LibTorch,
# 8x8 digits) on 2 ranks with mpirun; rank 0 prints per-epoch progress and the final accuracy.
#   ./run.sh                       run the main job
#   ./run.sh --timeline FILE       also record a Chrome-tracing timeline (open it in
#                                  chrome://tracing or https://ui.perfetto.dev)
set -euo pipefail
cd "$(dirname "$0")"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --timeline) export HOROVOD_TIMELINE="$(realpath -m "$2")"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
scripts/install_deps.sh
scripts/build.sh build
source scripts/mpi_env.sh
echo "+ mpirun -np 2 build/examples/train" >&2
mpirun -np 2 build/examples/train
if [[ -n "${HOROVOD_TIMELINE:-}" ]]; then echo "timeline written to $HOROVOD_TIMELINE" >&2; fi
