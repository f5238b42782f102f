"""Scaling of a training step across hosts: samples/s of hvd.DistributedOptimizer on N ranks
(same per-rank batch), for bench.sh to compare 1 host with 2 (one rank per host, so that
every rank has a core of its own on a 2-core machine and the difference is the network).

    hvdrun -np N [-H ...] .venv/bin/python examples/bench/scaling.py [--steps 30] [--model cnn]
        [--compression none|fp16|bf16|powersgd] [--powersgd-rank 4]

Rank 0 prints one line: SCALING np=N model=... compression=... samples_per_s=...
step_p50_ms=... wire_bytes_per_step=... (what the hosts' eth0 interfaces sent during the timed
steps, summed over the hosts, per step: measured from /proc/net/dev in each host's network
namespace by its first rank; "n/a" where there is no eth0, i.e. not on the test bed).
PowerSGD starts after the warm-up steps, so every timed step is compressed.
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


def eth0_tx_bytes():
    """Bytes this network namespace's eth0 has sent (None without one)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "eth0":
                return int(fields.split()[8])
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--compression", choices=("none", "fp16", "bf16", "powersgd"),
                        default="none")
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--batch", type=int, default=0,
                        help="samples per rank per step (default: the model's, mlp 32, cnn 64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per rank (1: a rank per core, so that 1 host and 2 "
                             "hosts x 1 rank compute alike and what they differ in is network)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hvd.init()
    make, shape, batch = MODELS[args.model]
    batch = args.batch or batch
    torch.manual_seed(0)
    model = make()
    comp = (hvd.Compression.powersgd(matrix_approximation_rank=args.powersgd_rank,
                                     start_powerSGD_iter=args.warmup)
            if args.compression == "powersgd" else getattr(hvd.Compression, args.compression))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(batch, *shape)
    y = torch.randint(0, 10, (batch,))
    times = []
    tx_before = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            hvd.barrier()
            tx_before = eth0_tx_bytes()
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    # The job's pace is its slowest rank's.
    total = hvd.allreduce(torch.tensor([sum(times)]), op=hvd.Max).item()
    tx_after = eth0_tx_bytes()
    sent = (tx_after - tx_before if hvd.local_rank() == 0 and tx_after is not None else 0)
    sent = hvd.allreduce(torch.tensor([float(sent)]), op=hvd.Sum, name="wire").item()
    wire = "%.0f" % (sent / args.steps) if tx_after is not None else "n/a"
    if hvd.rank() == 0:
        print("SCALING np=%d model=%s batch=%d compression=%s samples_per_s=%.1f "
              "step_p50_ms=%.2f wire_bytes_per_step=%s"
              % (hvd.size(), args.model, batch, args.compression,
                 hvd.size() * batch * args.steps / total, 1000 * percentile(times, 0.5), wire),
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
