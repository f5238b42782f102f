"""What adaptive training costs per step: AdaptiveDataParallel + AdaptiveDataLoader (the
core's gradient norms, the per-step averaged statistics, the learning-rate factor, the loader)
against a plain DistributedOptimizer with a DataLoader over a DistributedSampler, same model,
same global batch (the adaptive job's batch held at B0, so that only the overhead differs),
measured in the same run in alternating blocks.

    mpirun -np 2 --bind-to none .venv-pypi/bin/python examples/bench/adaptive_overhead.py \\
        [--workload mlp|bert] [--blocks 10] [--steps 10]

Prints one FIGURE line per workload: ratio = plain step p50 / adaptive step p50 (target >= 0.95,
i.e. adaptive costs at most 5 % of a step). mlp: 4 x 512 ReLU layers (1.05 M parameters),
batch 64 per rank; bert: the BERT-shaped encoder of transformer_finetune.py (sequence 128).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import mlp, percentile  # noqa: E402
from transformer_finetune import make_encoder  # noqa: E402

import horovod_cpp.torch as hvd  # noqa: E402
import horovod_cpp.torch.adaptive as adl  # noqa: E402


def workload(name, per_rank, samples):
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        def model():
            torch.manual_seed(0)
            return mlp(4, 512)
        x = torch.randn(samples, 512, generator=g)
        y = torch.randint(0, 10, (samples,), generator=g)
    else:
        def model():
            torch.manual_seed(0)
            return make_encoder(vocab=8000, hidden=256, layers=4, heads=4, ffn=1024, seq=128)
        x = torch.randint(0, 8000, (samples, 128), generator=g)
        y = torch.randint(0, 2, (samples,), generator=g)
    return model, torch.utils.data.TensorDataset(x, y)


def plain_steps(make, dataset, per_rank):
    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True)

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from torch.utils.data.DataLoader(dataset, batch_size=per_rank, sampler=sampler,
                                                   drop_last=True)
            epoch += 1
    return model, opt, batches()


def adaptive_steps(make, dataset, per_rank):
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model = adl.AdaptiveDataParallel(model, opt)
    loader = adl.AdaptiveDataLoader(dataset, batch_size=per_rank * hvd.size(), shuffle=True)

    def batches():
        while True:
            yield from loader
    return model, opt, batches()


def block(job, steps):
    model, opt, batches = job
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) * 1e3 / steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["mlp", "bert"], default="mlp")
    p.add_argument("--per-rank", type=int, default=None, help="samples per rank and step")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    args = p.parse_args()
    hvd.init()
    per_rank = args.per_rank or (64 if args.workload == "mlp" else 8)
    make, dataset = workload(args.workload, per_rank, per_rank * hvd.size() * 50)
    # The adaptive job first (its controller is the process's current one), then the plain.
    jobs = {"adaptive": adaptive_steps(make, dataset, per_rank),
            "plain": plain_steps(make, dataset, per_rank)}
    times = {"adaptive": [], "plain": []}
    for b in range(-1, args.blocks):
        order = ["adaptive", "plain"] if b % 2 else ["plain", "adaptive"]
        for name in order:
            ms = block(jobs[name], args.steps)
            if b >= 0:
                times[name].append(ms)
    if hvd.rank() == 0:
        ours, base = percentile(times["adaptive"], 0.5), percentile(times["plain"], 0.5)
        ratio = base / ours
        print("FIGURE AD_%s name=adaptive_overhead_%s_np%d p50_ms=%.2f p90_ms=%.2f "
              "baseline=plain_DistributedOptimizer base_p50_ms=%.2f ratio=%.3f target=0.95 "
              "met=%s torch=%s" % (args.workload, args.workload, hvd.size(), ours,
                                   percentile(times["adaptive"], 0.9), base, ratio,
                                   "yes" if ratio >= 0.95 else "no", torch.__version__),
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
