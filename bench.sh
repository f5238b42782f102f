#!/usr/bin/env bash
# Every performance figure in one command: install what is missing, build, then run the
# benchmarks in examples/bench/ on 2 ranks. Each figure is one line
#   FIGURE <id> name=... p50_ms=... p90_ms=... baseline=... ratio=... target=... met=yes|no|n/a
# where ratio is against a baseline measured in the same run. Takes about 3 minutes on 2 cores.
#   ./bench.sh                 all figures (allreduce over shared memory and TCP, timeline
#                              overhead, training throughput vs DDP)
#   ./bench.sh --quick         fewer repetitions (noisier)
#   ./bench.sh --no-horovod    skip the comparison with Horovod 0.28.1 (which the first run
#                              builds from PyPI into .venv-horovod: about 2.5 minutes, once)
# Nothing here is a test: a missed target is reported, not failed. A wrong result (every
# benchmark checks its sums and parameters) exits non-zero.
set -euo pipefail
cd "$(dirname "$0")"
quick=0
horovod=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --no-horovod) horovod=0; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
scripts/install_deps.sh
source scripts/mpi_env.sh
scripts/setup_venv.sh
scripts/build.sh build -DPython3_EXECUTABLE=/usr/bin/python3
if ((horovod)); then scripts/setup_horovod.sh; fi
start=$SECONDS

# As hvdrun launches: no binding (two busy threads per rank), MPI yields the core while it waits.
MPIRUN=(mpirun -np 2 --bind-to none --map-by slot --mca mpi_yield_when_idle 1)
# As most users run it: plain mpirun, Open MPI's default binding (a core per rank, shared by
# the training thread and horovod_cpp's background thread).
PLAIN=(mpirun -np 2)
if ((quick)); then
  AR=(--reps 8 --resnet-reps 4 --latency-reps 300 --idle-seconds 5); TL=(--blocks 10)
  ST=(--blocks 3 --steps 8); PP=(--reps 15); VH=(--reps 6 --blocks 3); ROUNDS=2
else
  AR=(--reps 60 --resnet-reps 20); TL=(); ST=(--blocks 16); PP=(); VH=(); ROUNDS=3
fi
{
  echo "# $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(mpirun --version | head -1), $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# shared memory (Open MPI's default transports)"
  "${MPIRUN[@]}" build/examples/bench/allreduce_bench --transport shm "${AR[@]}"
  echo "# TCP loopback (--mca btl tcp,self)"
  "${MPIRUN[@]}" --mca btl tcp,self build/examples/bench/allreduce_bench --transport tcp \
    --figures G1,G3,G4,G5 "${AR[@]}"
  echo "# timeline on vs off"
  "${MPIRUN[@]}" build/examples/bench/timeline_overhead "${TL[@]}"
  echo "# training throughput vs torch DDP (gloo)"
  "${MPIRUN[@]}" .venv/bin/python examples/bench/synthetic_train.py "${ST[@]}"
  echo "# the same under plain mpirun -np 2 (default binding)"
  "${PLAIN[@]}" .venv/bin/python examples/bench/synthetic_train.py "${ST[@]}" --ids T5,T6 \
    --label _plain_mpirun
  echo "# many small tensors from Python vs one mpi4py Allreduce per tensor"
  "${MPIRUN[@]}" .venv/bin/python examples/bench/python_path.py --id P1 --label hvdrun "${PP[@]}"
  "${PLAIN[@]}" .venv/bin/python examples/bench/python_path.py --id P2 --label plain_mpirun \
    "${PP[@]}"
  if ((horovod)); then
    echo "# horovod_cpp vs Horovod 0.28.1: the same script, $ROUNDS alternating rounds each"
    results=$(mktemp -d build/vs_horovod.XXXXXX)
    for ((round = 1; round <= ROUNDS; round++)); do
      for impl in $( ((round % 2)) && echo "horovod_cpp horovod" || echo "horovod horovod_cpp"); do
        python=.venv/bin/python
        [[ $impl == horovod ]] && python=.venv-horovod/bin/python
        "${MPIRUN[@]}" "$python" examples/bench/vs_horovod.py --impl "$impl" "${VH[@]}" \
          --out "$results/$impl.$round.jsonl" > "$results/$impl.$round.log"
      done
    done
    python3 examples/bench/compare_horovod.py "$results"
  fi
  if [[ -x build/examples/bench/nccl_bench ]]; then  # NCCL builds; skips, saying so, without a GPU
    echo "# CUDA tensors: horovod_cpp's NCCL path vs raw NCCL calls (one rank per GPU)"
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
    mpirun -np "$(( gpus > 0 ? gpus : 1 ))" --bind-to none build/examples/bench/nccl_bench
  fi
} 2>&1 | tee bench.log
echo "bench.sh: done in $((SECONDS - start)) s; figures in bench.log" >&2
