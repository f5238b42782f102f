"""DDP on the horovod_cpp backend against DDP on torch's Gloo: same model, data and processes,
in interleaved blocks; and the cost of one collective through the backend's Python Work path
against horovod_cpp's own Python API.

    torchrun --standalone --nproc-per-node 2 examples/bench/c10d_ddp.py --model mlp
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29555 python examples/bench/c10d_ddp.py

The default group is "horovod_cpp" (under torchrun on horovod_cpp's Gloo transport, under
mpirun on MPI); the baseline a Gloo group of the same ranks. Models: ``mlp`` (8 layers of 1024:
8.4 M parameters, communication-heavy) and ``bert`` (a BERT-shaped encoder from Hugging Face's
config: 4 layers, hidden 256, vocabulary 30,522, 11 M parameters; sequences of 64). Rank 0
prints one line per model,

    FIGURE TD1_mlp name=... ratio=... ratios=[...] ours_samples_per_s=... gloo_samples_per_s=...

(ratio: the median over blocks of ours/Gloo's samples/s; ratios: each block pair's), as
``FIGURE <id>_<model>`` (target >= 1.0); then, with --collective-kib, ``FIGURE <id>_op_<kib>KiB``
lines: the p50 latency of dist.all_reduce on the backend, of hvd.allreduce (horovod_cpp's API)
and of dist.all_reduce on Gloo, and overhead_us = backend - hvd API (no target). Both DDP copies take the same steps from the same weights: their parameters must agree
(a mismatch exits 1).
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import horovod_cpp.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import mlp, percentile  # noqa: E402


def bert():
    from transformers import BertConfig, BertForSequenceClassification
    config = BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4,
                        num_attention_heads=4, intermediate_size=1024,
                        max_position_embeddings=128, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


class Job(object):
    """One DDP copy of the model on a group, with its optimizer and batches."""

    def __init__(self, name, group, make, batch, rank):
        torch.manual_seed(1234)
        self.model = make()
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, process_group=group)
        self.opt = torch.optim.AdamW(self.ddp.parameters(), lr=1e-4)
        self.group = group
        self.name = name
        gen = torch.Generator().manual_seed(100 + rank)
        self.bert = make is bert
        if self.bert:
            self.data = [(torch.randint(0, 30522, (batch, 64), generator=gen),
                          torch.randint(0, 2, (batch,), generator=gen)) for _ in range(4)]
        else:
            self.data = [(torch.randn(batch, 1024, generator=gen),
                          torch.randint(0, 10, (batch,), generator=gen)) for _ in range(4)]

    def step(self, i):
        x, y = self.data[i % len(self.data)]
        self.opt.zero_grad()
        if self.bert:
            loss = self.ddp(input_ids=x, labels=y).loss
        else:
            loss = torch.nn.functional.cross_entropy(self.ddp(x), y)
        loss.backward()
        self.opt.step()

    def block(self, steps, start):
        dist.barrier(group=self.group)
        t = time.perf_counter()
        for i in range(steps):
            self.step(start + i)
        return time.perf_counter() - t


def train(args, model, batch, gloo, rank, size):
    make = bert if model == "bert" else (lambda: mlp(8, 1024))
    ours = Job("horovod_cpp", dist.group.WORLD, make, batch, rank)
    base = Job("gloo", gloo, make, batch, rank)
    ours.block(1, 0)  # warm-up
    base.block(1, 0)
    ratios, t_ours, t_base = [], [], []
    for b in range(args.blocks):
        pair = (ours, base) if b % 2 == 0 else (base, ours)
        got = {job.name: job.block(args.steps, 1 + b * args.steps) for job in pair}
        t_ours.append(got["horovod_cpp"])
        t_base.append(got["gloo"])
        ratios.append(got["gloo"] / got["horovod_cpp"])
    samples = args.steps * batch * size
    worst = max((a - b).abs().max().item()
                for a, b in zip(ours.model.parameters(), base.model.parameters()))
    if rank == 0:
        ratio = statistics.median(ratios)
        print("FIGURE %s_%s name=ddp_on_horovod_cpp_vs_gloo_%s%s p50_ms=%.1f baseline=torch_DDP_gloo "
              "base_p50_ms=%.1f ratio=%.3f ratios=[%s] ours_samples_per_s=%.1f "
              "gloo_samples_per_s=%.1f np=%d params=%d batch=%d max_param_diff=%.2e torch=%s "
              "target=>=1.0 met=%s"
              % (args.id, model, model, args.label, statistics.median(t_ours) * 1e3 / args.steps,
                 statistics.median(t_base) * 1e3 / args.steps, ratio,
                 ",".join("%.3f" % r for r in ratios), samples / statistics.median(t_ours),
                 samples / statistics.median(t_base), size,
                 sum(p.numel() for p in ours.model.parameters()), batch, worst,
                 torch.__version__, "yes" if ratio >= 1.0 else "no"), flush=True)
    return worst


def collective_latency(args, gloo, rank):
    for kib in args.collective_kib:
        t = torch.ones(kib * 256)
        ways = {
            "backend": lambda: dist.all_reduce(t),
            "hvd_api": lambda: hvd.allreduce_(t, op=hvd.Sum, name="bench.op"),
            "gloo": lambda: dist.all_reduce(t, group=gloo),
        }
        times = {k: [] for k in ways}
        for rep in range(args.reps + 10):
            for name, fn in ways.items():
                dist.barrier()
                s = time.perf_counter()
                for _ in range(args.ops):
                    fn()
                if rep >= 10:
                    times[name].append((time.perf_counter() - s) / args.ops * 1e6)
        p50 = {k: percentile(v, 0.5) for k, v in times.items()}
        if rank == 0:
            print("FIGURE %s_op_%dKiB name=c10d_work_path_allreduce_%dKiB%s p50_us=%.1f "
                  "baseline=hvd.allreduce base_p50_us=%.1f overhead_us=%.1f gloo_p50_us=%.1f "
                  "target=n/a met=n/a"
                  % (args.id, kib, kib, args.label, p50["backend"], p50["hvd_api"],
                     p50["backend"] - p50["hvd_api"], p50["gloo"]), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="mlp,bert")
    p.add_argument("--batch", default="mlp:32,bert:8", help="per rank")
    p.add_argument("--steps", type=int, default=5, help="per block")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--collective-kib", type=lambda s: [int(v) for v in s.split(",") if v],
                   default=[4, 1024])
    p.add_argument("--ops", type=int, default=20, help="collectives per timed repetition")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--id", default="TD1")
    p.add_argument("--label", default="", help="appended to the figures' names")
    args = p.parse_args()
    torch.set_num_threads(1)
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    if os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # (the host name may not resolve)
    dist.init_process_group("horovod_cpp")
    gloo = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    batches = dict(kv.split(":") for kv in args.batch.split(","))
    worst = 0.0
    for model in [m for m in args.models.split(",") if m]:
        worst = max(worst, train(args, model, int(batches[model]), gloo, rank, size))
    if args.collective_kib:
        collective_latency(args, gloo, rank)
    dist.destroy_process_group()
    if worst > 1e-4:
        print("c10d_ddp: rank %d: the two DDP copies' parameters differ by %.3e" % (rank, worst),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
