#!/bin/sh
# bench_sharded_smoke.sh MPIEXEC PYTHON SOURCE_DIR [MPIEXEC_FLAG...]
# examples/bench/sharded_memory.py briefly (a tiny transformer, every mode at 2 ranks), then its
# --compare: every mode's parameters must agree with DistributedOptimizer's (it exits 1
# otherwise) and the FIGURE lines must be there.
set -e
mpiexec=$1 py=$2 src=$3
shift 3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for mode in distributed sharded1 sharded2 torch_zero; do
  "$mpiexec" -n 2 "$@" "$py" "$src/examples/bench/sharded_memory.py" --mode "$mode" \
    --vocab 100 --hidden 32 --heads 2 --ffn 64 --layers 2 --seq 8 --warmup 1 --steps 2 \
    --port 29533 --out "$out/$mode.2.1.json"
done
python3 "$src/examples/bench/sharded_memory.py" --compare "$out" | tee "$out/figures"
for id in S1 S4 S5 S6 S7; do
  grep -q "^FIGURE $id " "$out/figures" || { echo "bench_sharded_smoke: no FIGURE $id" >&2; exit 1; }
done
