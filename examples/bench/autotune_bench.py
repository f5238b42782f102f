"""A training loop timed step by step, for the autotuner's figures (bench.sh, FIGURE A1-A3).

    mpirun -np 2 [-x HOROVOD_AUTOTUNE=1 ...] python examples/bench/autotune_bench.py \\
        --workload resnet50|mlp --steps N --label LABEL [--out FILE]

Workloads:
  resnet50  the 161 gradients of ResNet-50 (25.6 M floats), allreduced (async, averaged) in
            backward order every step: what the fusion threshold and the chunk size act on;
  mlp       a training step of a 4.2 M-parameter MLP (4 x 1024 x 1024, batch 32 per rank, one
            torch thread) through hvd.DistributedOptimizer.

The knobs come from the environment as in any job (HOROVOD_FUSION_THRESHOLD, ...,
HOROVOD_AUTOTUNE=1). Rank 0 appends one JSON line to --out (or prints it): the label, the
workload, the HOROVOD_* settings, and every step's time in ms (the slowest rank's), with a
check value computed from the results (every run of a workload must agree).
"""
import argparse
import json
import os
import time

import torch

import horovod_cpp.torch as hvd
from bench_models import mlp
from vs_horovod import resnet50_shapes


def resnet50_step_fn():
    sizes = [int(torch.Size(s).numel()) for s in resnet50_shapes()][::-1]
    base = [torch.full((n,), float(hvd.rank() + 1 + i % 7)) for i, n in enumerate(sizes)]
    tensors = [b.clone() for b in base]

    def step():
        for t, b in zip(tensors, base):
            t.copy_(b)
        handles = [hvd.allreduce_async_(t, name="resnet.%d" % i, op=hvd.Average)
                   for i, t in enumerate(tensors)]
        for h in handles:
            hvd.synchronize(h)
        return sum(float(t[0]) + float(t[-1]) for t in tensors)
    return step


def mlp_step_fn():
    torch.manual_seed(0)
    model = mlp(4, 1024)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(32, 1024, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("resnet50", "mlp"), default="resnet50")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", help="append the JSON line here (default: print it)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    step = resnet50_step_fn() if args.workload == "resnet50" else mlp_step_fn()
    times, check = [], 0.0
    for _ in range(args.steps):
        start = time.perf_counter()
        check = step()
        times.append(1000.0 * (time.perf_counter() - start))
    slowest = hvd.allreduce(torch.tensor(times, dtype=torch.float64), op=hvd.Max,
                            name="autotune_bench.times").tolist()
    if hvd.rank() == 0:
        line = json.dumps({
            "label": args.label, "workload": args.workload, "np": hvd.size(),
            "settings": {k: v for k, v in sorted(os.environ.items())
                         if k.startswith("HOROVOD_")},
            "step_ms": [round(t, 3) for t in slowest], "check": check})
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
        else:
            print(line, flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
