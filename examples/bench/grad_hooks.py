"""How DistributedOptimizer learns that a gradient is ready: post-accumulate-grad hooks on the
parameters (PyTorch 2.1+) against hooks on their gradient accumulators (the only way on 1.13),
measured in the same run, alternating, on a model of many small parameters (where a per-hook
cost would show).

    mpirun -np 2 --bind-to none .venv-pypi/bin/python examples/bench/grad_hooks.py

Prints one FIGURE line: ratio = accumulator-hook step p50 / post-accumulate-hook step p50
(>= 1.0: the post-accumulate hook is no slower). Parameters are checked equal between the two.
"""
import argparse
import statistics
import sys
import time

import torch

import horovod_cpp.torch as hvd
from horovod_cpp.torch import grad_hooks


def make_model(layers, width):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width),
                                                     torch.nn.Tanh()) for _ in range(layers)])


def run(post_accumulate, args, data):
    grad_hooks.POST_ACCUMULATE_GRAD_HOOK = post_accumulate
    model = make_model(args.layers, args.width)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        model(data).square().mean().backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    return times, [p.detach().clone() for p in model.parameters()]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=100, help="Linear layers (2 parameters each)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        print("grad_hooks: PyTorch %s has no post-accumulate-grad hooks (2.1+)" % torch.__version__)
        return 0
    torch.set_num_threads(1)
    hvd.init()
    data = torch.randn(16, args.width)
    results = {True: [], False: []}
    params = {}
    for r in range(args.rounds):
        for kind in ((True, False) if r % 2 == 0 else (False, True)):
            times, params[kind] = run(kind, args, data)
            results[kind] += times
    for a, b in zip(params[True], params[False]):
        if not torch.equal(a, b):
            print("grad_hooks: the two hook kinds trained different parameters", file=sys.stderr)
            return 1
    post = statistics.median(results[True]) * 1e3
    acc = statistics.median(results[False]) * 1e3
    if hvd.rank() == 0:
        print("FIGURE H15 name=post_accumulate_grad_hook_vs_accumulator_hook_%d_params "
              "p50_ms=%.3f baseline=accumulator_hook base_p50_ms=%.3f ratio=%.3f target=>=1.0 "
              "met=%s torch=%s" % (2 * args.layers, post, acc, acc / post,
                                   "yes" if acc / post >= 1.0 else "no", torch.__version__))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
