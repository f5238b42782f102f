#!/usr/bin/env bash
# Quick start 1/2: install what is missing, build, and train the example model (a small LibTorch
# CNN on the 8x8 digits) with mpirun: first on 1 rank, then the main job on 2 ranks; rank 0
# prints per-epoch progress and the final accuracy, and the last line compares the two runs
# (speedup and scaling efficiency of 2 ranks over 1).
#   ./run.sh                       run the main job
#   ./run.sh --timeline FILE       also record a Chrome-tracing timeline of the 2-rank run
#                                  (open it in chrome://tracing or https://ui.perfetto.dev)
set -euo pipefail
cd "$(dirname "$0")"
timeline=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --timeline) timeline=(--timeline "$(realpath -m "$2")"); shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
scripts/install_deps.sh
scripts/build.sh build
source scripts/mpi_env.sh
# mpi_yield_when_idle: a rank waiting for its peer yields its core (hvdrun sets it too).
mpirun_flags=(--mca mpi_yield_when_idle 1)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
throughput() { sed -n 's/^training throughput: \([0-9.]*\) samples\/s.*/\1/p' "$log"; }

echo "+ mpirun -np 1 ${mpirun_flags[*]} build/examples/train   (the 1-rank baseline)" >&2
mpirun -np 1 "${mpirun_flags[@]}" build/examples/train | tee "$log"
one=$(throughput)
echo "+ mpirun -np 2 ${mpirun_flags[*]} build/examples/train ${timeline[*]}" >&2
mpirun -np 2 "${mpirun_flags[@]}" build/examples/train "${timeline[@]}" | tee "$log"
two=$(throughput)
if [[ -z "$one" || -z "$two" ]]; then
  echo "run.sh: a run printed no throughput line" >&2
  exit 1
fi
awk -v one="$one" -v two="$two" 'BEGIN {
  printf "2 ranks: %.2fx the samples/s of 1 rank (%.0f vs %.0f), %.0f%% scaling efficiency\n",
         two / one, two, one, 100 * two / one / 2 }'
if [[ ${#timeline[@]} -gt 0 ]]; then echo "timeline written to ${timeline[1]}" >&2; fi
