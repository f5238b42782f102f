"""Training throughput: hvd.DistributedOptimizer vs torch DistributedDataParallel (gloo), same
model, same data, same processes, measured in interleaved blocks of one run.

    mpirun -np 2 .venv/bin/python examples/bench/synthetic_train.py [--blocks 6] [--steps 10]

Two models: a small CNN (compute-heavy; target ratio >= 1.0) and an MLP of ~10.5 M parameters
in 20 tensors with a small batch (communication-heavy; target >= 1.3). The ratio is DDP's p50
block time / ours (> 1: horovod_cpp is faster). Both copies start from the same weights and take
the same steps, so their final parameters must agree (checked; a mismatch exits 1). One
FIGURE line per model, as the C++ benchmarks print them.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import horovod_cpp.torch as hvd
from bench_models import interleaved_blocks, mlp_factory, percentile, small_cnn


MODELS = {
    # name: (constructor, input shape without batch, per-rank batch, target)
    "synthetic_cnn": (small_cnn, (1, 28, 28), 64, 1.0),
    "synthetic_mlp_10M": (mlp_factory(9, 1024), (1024,), 2, 1.3),
}


def run(name, args, rank, size):
    make, shape, batch, target = MODELS[name]
    torch.manual_seed(1234)
    ours_model = make()
    ddp_model = make()
    ddp_model.load_state_dict(ours_model.state_dict())
    params = sum(p.numel() for p in ours_model.parameters())
    tensors = len(list(ours_model.parameters()))

    ours_opt = hvd.DistributedOptimizer(torch.optim.SGD(ours_model.parameters(), lr=0.01),
                                        named_parameters=ours_model.named_parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    data = [(torch.randn((batch,) + shape, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen)) for _ in range(args.steps)]

    def step(model, opt, x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def block(model, opt):
        hvd.barrier()
        start = time.perf_counter()
        for x, y in data:
            step(model, opt, x, y)
        return (time.perf_counter() - start) * 1000.0

    ours, base = interleaved_blocks(args.blocks, block, (ours_model, ours_opt), (ddp, ddp_opt))

    # Same start, same averaged gradients, same steps: the parameters must agree.
    worst = max((a - d).abs().max().item()
                for a, d in zip(ours_model.parameters(), ddp_model.parameters()))
    agree = all(torch.allclose(a, d, rtol=1e-3, atol=1e-5)
                for a, d in zip(ours_model.parameters(), ddp_model.parameters()))
    if rank == 0:
        p50, base_p50 = percentile(ours, 0.5), percentile(base, 0.5)
        ratio = base_p50 / p50
        samples = args.steps * batch * size
        print("FIGURE %s name=%s p50_ms=%.4f p90_ms=%.4f baseline=torch_DDP_gloo "
              "base_p50_ms=%.4f base_p90_ms=%.4f ratio=%.3f samples_per_s=%.0f "
              "base_samples_per_s=%.0f params=%d tensors=%d max_param_diff=%.2e "
              "target=>=%.1f met=%s"
              % (args.ids[list(MODELS).index(name)], name + args.label, p50, percentile(ours, 0.9),
                 base_p50, percentile(base, 0.9), ratio, samples / p50 * 1000.0,
                 samples / base_p50 * 1000.0, params, tensors, worst, target,
                 "yes" if ratio >= target else "no"), flush=True)
    if not agree:
        print("synthetic_train: rank %d: %s parameters differ from DDP's by %.3e"
              % (rank, name, worst), file=sys.stderr)
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=6, help="measured blocks per method")
    parser.add_argument("--steps", type=int, default=10, help="training steps per block")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--port", type=int, default=29517, help="gloo rendezvous port")
    parser.add_argument("--ids", default="T1,T2", help="figure ids of the CNN and the MLP")
    parser.add_argument("--label", default="", help="appended to the figure names")
    args = parser.parse_args()
    args.ids = args.ids.split(",")

    torch.set_num_threads(1)  # one core per rank on these machines, for both methods
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=rank,
                            world_size=size)
    ok = all([run(name, args, rank, size) for name in args.models.split(",")])
    dist.destroy_process_group()
    hvd.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
