#!/usr/bin/env bash
# The CPU fine-tune of Intel's guide on three data planes (bench.sh --ccl-only runs this; needs
# a build with oneCCL and root for the test hosts):
#   CCL1  the DistilBERT-shaped fine-tune (transformer_finetune.py: sequence length 128, 32
#         samples per rank, bf16 autocast and fp32), 1 -> 2 ranks on this host and 1 -> 2 test
#         hosts x 1 rank at each RATE: scaling efficiency and samples/s of horovod_cpp on
#         oneCCL, MPI and Gloo, and of torch DDP on Gloo (in the same processes, interleaved);
#   CCL2  horovod_cpp's oneCCL data plane against oneCCL's own allreduce (and MPI_Allreduce),
#         on the fine-tune's buffer sizes, here and across the hosts.
#   examples/bench/ccl_planes.sh [--runs N] [--quick] [--rates "10gbit 25gbit"] [--precisions "bf16 none"]
#                                [--pin]   (each test host on a core of its own: testbed.sh --pin)
#                                [--hosts-only]   (not the one-host figures)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=3 quick=0 rates="10gbit 25gbit" precisions="bf16 none" pin=() local=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --rates) rates=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --pin) pin=(--pin); shift ;;
    --hosts-only) local=0; shift ;;
    *) echo "ccl_planes.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x build/examples/bench/ccl_bench ]] || { echo "ccl_planes.sh: no oneCCL in build/ (scripts/install_ccl.sh, rebuild)" >&2; exit 1; }
PY=$PWD/.venv-pypi/bin/python
FT=(examples/bench/transformer_finetune.py --seq 128 --batch 32 --blocks 2 --steps 1)
((quick)) && FT=(examples/bench/transformer_finetune.py --seq 128 --batch 32 --blocks 1 --steps 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; scripts/testbed.sh down > /dev/null 2>&1 || true' EXIT
MPI=(mpirun --allow-run-as-root --bind-to none --map-by slot --mca mpi_yield_when_idle 1
     -x OMP_NUM_THREADS=1)

# finetune WHERE PLANE NP OUT PRECISION: one launch of the fine-tune.
finetune() {
  local where=$1 plane=$2 np=$3 out=$4 prec=$5 hosts=() master=127.0.0.1 exec=()
  if [[ $where != local ]]; then
    exec=(scripts/testbed.sh exec hvd-h1)
    master=10.200.0.11
    if ((np == 1)); then hosts=(-H hvd-h1:1); else hosts=(-H hvd-h1:1,hvd-h2:1); fi
  fi
  local args=("${FT[@]}" --autocast "$prec" --master "$master" --out "$out")
  case $plane in
    mpi) "${exec[@]}" "${MPI[@]}" -np "$np" "${hosts[@]}" "$PY" "${args[@]}" ;;
    ccl) "${exec[@]}" "${MPI[@]}" -x HOROVOD_CPU_OPERATIONS=ccl -np "$np" "${hosts[@]}" "$PY" \
           "${args[@]}" ;;
    gloo) "${exec[@]}" env OMP_NUM_THREADS=1 "$PY" -m horovod_cpp.runner --gloo -np "$np" \
            "${hosts[@]}" "$PY" "${args[@]}" ;;
  esac | grep "^FINETUNE" || true
}

# planes WHERE LABEL: 1 rank (MPI), then 2 on each plane, each compared with the 1-rank run.
planes() {
  local where=$1 label=$2
  for prec in $precisions; do
    for run in $(seq 1 "$runs"); do
      finetune "$where" mpi 1 "$tmp/one.json" "$prec" > /dev/null
      for plane in ccl mpi gloo; do
        finetune "$where" "$plane" 2 "$tmp/$plane.json" "$prec" > /dev/null
        python3 examples/bench/transformer_finetune.py --compare "$tmp/one.json" \
          "$tmp/$plane.json" --id CCL1 --label "_${label}_${plane}_${prec}_run$run"
      done
    done
  done
}

if ((local)); then
  echo "# oneCCL / MPI / Gloo data planes, the fine-tune at seq 128, 32 samples per rank: 1 -> 2 ranks on this host"
  planes local one_host
  "${MPI[@]}" -np 2 build/examples/bench/ccl_bench --sizes-mib 1,16,64,256 --reps 7 \
    --label _one_host 2>&1 | grep "^FIGURE"
fi
for rate in $rates; do
  scripts/testbed.sh up 2 --rate "$rate" "${pin[@]}" > /dev/null
  echo "# the same, 1 -> 2 test hosts x 1 rank, links limited to $rate ${pin[*]}"
  planes hosts "2x1_$rate${pin:+_pinned}"
  scripts/testbed.sh exec hvd-h1 "${MPI[@]}" -np 2 -H hvd-h1:1,hvd-h2:1 \
    build/examples/bench/ccl_bench --sizes-mib 1,16,64,256 --reps 7 --label "_2x1_$rate${pin:+_pinned}" \
    2>&1 | grep "^FIGURE"
  scripts/testbed.sh down > /dev/null
done
