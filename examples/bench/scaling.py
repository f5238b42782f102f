"""Scaling of a training step across hosts: samples/s of hvd.DistributedOptimizer on N ranks
(same per-rank batch), for bench.sh to compare 1 host with 2 (one rank per host, so that
every rank has a core of its own on a 2-core machine and the difference is the network).

    hvdrun -np N [-H ...] .venv/bin/python examples/bench/scaling.py [--steps 30] [--model cnn]

Rank 0 prints one line: SCALING np=N model=... samples_per_s=... step_p50_ms=...
"""
import argparse
import time

import torch

import horovod_cpp.torch as hvd
from bench_models import mlp, percentile, small_cnn

MODELS = {  # name: (constructor, input shape without batch, per-rank batch)
    "cnn": (small_cnn, (1, 28, 28), 64),
    "mlp": (lambda: mlp(4, 1024), (1024,), 32),  # ~4.2 M parameters, 16 MiB of gradients
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    args = parser.parse_args()
    hvd.init()
    make, shape, batch = MODELS[args.model]
    torch.manual_seed(0)
    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(batch, *shape)
    y = torch.randint(0, 10, (batch,))
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    # The job's pace is its slowest rank's.
    total = hvd.allreduce(torch.tensor([sum(times)]), op=hvd.Max).item()
    if hvd.rank() == 0:
        print("SCALING np=%d model=%s samples_per_s=%.1f step_p50_ms=%.2f"
              % (hvd.size(), args.model, hvd.size() * batch * args.steps / total,
                 1000 * percentile(times, 0.5)), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
