"""Many small tensors from Python: horovod_cpp.torch against one MPI_Allreduce per tensor.

    mpirun -np 2 .venv/bin/python examples/bench/python_path.py [--tensors 100] [--kib 40]

The baseline is what a user could write without horovod_cpp: mpi4py's in-place Allreduce on
each tensor in turn (the same MPI, the same shared memory). Ours: allreduce_async_ on every
tensor, then synchronize every handle, as DistributedOptimizer does. The two alternate in one
run; the figure is the baseline's p50 / ours (> 1: horovod_cpp is faster), target >= 1.3.
Both results are checked against the exact sum.
"""
import argparse
import sys
import time

import torch
from mpi4py import MPI

import horovod_cpp.torch as hvd
from bench_models import percentile


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--kib", type=int, default=40)
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--label", default="mpirun", help="how the ranks were launched")
    parser.add_argument("--id", default="P1")
    args = parser.parse_args()

    torch.set_num_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = hvd.rank(), hvd.size()
    n = args.kib * 1024 // 4
    base = [torch.full((n,), float(rank + 1 + i)) for i in range(args.tensors)]
    ours_t = [b.clone() for b in base]
    raw_t = [b.clone() for b in base]
    raw_np = [t.numpy() for t in raw_t]
    expected = [sum(float(r + 1 + i) for r in range(size)) for i in range(args.tensors)]

    def ours():
        handles = [hvd.allreduce_async_(t, name="pp.%d" % i, op=hvd.Sum)
                   for i, t in enumerate(ours_t)]
        for h in handles:
            hvd.synchronize(h)

    def raw():
        for a in raw_np:
            comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

    times = {"ours": [], "raw": []}
    ok = True
    for rep in range(-3, args.reps):
        order = (("ours", ours, ours_t), ("raw", raw, raw_t))
        for label, fn, tensors in (order if rep % 2 else order[::-1]):
            for t, b in zip(tensors, base):
                t.copy_(b)
            comm.Barrier()
            start = time.perf_counter()
            fn()
            elapsed = (time.perf_counter() - start) * 1000.0
            if rep >= 0:
                times[label].append(elapsed)
            ok = ok and all(float(t[0]) == e and float(t[-1]) == e
                            for t, e in zip(tensors, expected))
    if rank == 0:
        p50, base_p50 = percentile(times["ours"], 0.5), percentile(times["raw"], 0.5)
        ratio = base_p50 / p50
        print("FIGURE %s name=python_%dx%dKiB_%s p50_ms=%.4f p90_ms=%.4f "
              "baseline=mpi4py_Allreduce_per_tensor base_p50_ms=%.4f base_p90_ms=%.4f "
              "ratio=%.3f target=>=1.3 met=%s"
              % (args.id, args.tensors, args.kib, args.label, p50,
                 percentile(times["ours"], 0.9), base_p50, percentile(times["raw"], 0.9), ratio,
                 "yes" if ratio >= 1.3 else "no"), flush=True)
    hvd.shutdown()
    if not ok:
        print("python_path: rank %d: a sum is wrong" % rank, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
