"""Gloo vs MPI: the same measurements under either backend, for bench.sh to compare.

    mpirun -np 2 ... python examples/bench/backend_compare.py --out mpi.json
    hvdrun --gloo -np 2 python examples/bench/backend_compare.py --out gloo.json
    python examples/bench/backend_compare.py --compare mpi.json gloo.json --label _tcp

Measures hvd.allreduce (float32, synchronous, after warm-up) of 4 B, 64 KiB, 4 MiB and 64 MiB,
and a training step of a 4.2 M-parameter MLP under DistributedOptimizer; rank 0 writes the p50s
(ms) as JSON. --compare prints one FIGURE line per measurement with ratio = MPI's p50 / Gloo's
(above 1: Gloo is faster).
"""
import argparse
import json
import sys
import time

SIZES = [("4B", 1), ("64KiB", 16 << 10), ("4MiB", 1 << 20), ("64MiB", 16 << 20)]


def measure(args):
    import torch

    import horovod_cpp.torch as hvd
    from bench_models import mlp, percentile

    hvd.init()
    out = {"backend": "Gloo" if hvd.gloo_enabled() else "MPI", "size": hvd.size()}
    for label, n in SIZES:
        t = torch.ones(n)
        reps = args.reps if n < (1 << 20) else max(3, args.reps // 10)
        times = []
        for i in range(reps + 3):
            start = time.perf_counter()
            r = hvd.allreduce(t, op=hvd.Sum, name="bench.%s" % label)
            if i >= 3:
                times.append((time.perf_counter() - start) * 1e3)
        if float(r[0]) != hvd.size():
            sys.exit("wrong allreduce result %s" % float(r[0]))
        out["allreduce_%s" % label] = percentile(times, 0.5)
    torch.manual_seed(0)
    model = mlp(4, 1024)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(32, 1024), torch.randint(0, 10, (32,))
    times = []
    for step in range(args.steps + 3):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    out["train_step_mlp"] = percentile(times, 0.5)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
        print("BACKEND %s" % json.dumps(out), flush=True)
    hvd.shutdown()


def compare(mpi_path, gloo_path, label):
    mpi, gloo = (json.load(open(p)) for p in (mpi_path, gloo_path))
    for key in [k for k in mpi if k not in ("backend", "size")]:
        ratio = mpi[key] / gloo[key]
        print("FIGURE GL name=gloo_vs_mpi_%s%s p50_ms=%.3f baseline=mpi base_p50_ms=%.3f "
              "ratio=%.3f target=none met=n/a" % (key, label, gloo[key], mpi[key], ratio))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--compare", nargs=2, metavar=("MPI_JSON", "GLOO_JSON"))
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare[0], args.compare[1], args.label)
    else:
        measure(args)


if __name__ == "__main__":
    main()
