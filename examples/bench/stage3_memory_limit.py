"""A model that does not fit a rank whole, trained with stage 3 under a per-process memory limit.

    mpirun -np 4 scripts/with_memory_limit.sh 3072 python examples/bench/stage3_memory_limit.py \
        --mode sharded3

Each rank runs in a memory cgroup of its own (scripts/with_memory_limit.sh: the kernel counts
every page the process touches and kills it past the limit). The model is the benchmark's
transformer, larger (--layers, --hidden); it is trained with AdamW in fp32, so holding it whole
for training takes 16 bytes per parameter on every rank (parameters, gradients, two moments):
more than the limit. --mode distributed (DistributedOptimizer) is killed by the limit;
--mode sharded3 (hvd.shard_model + ShardedOptimizer(stage=3), every layer a unit) keeps 16/N
bytes per parameter plus the layers in flight, and trains. Rank 0 prints each step's time and
its peak RSS, then one line:
  STAGE3_LIMIT mode=... np=... params=... whole_bytes=... peak_rss=... steps=...
"""
import argparse
import os
import resource
import sys
import time


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("sharded3", "distributed"), required=True)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-5)
    args = p.parse_args()

    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from transformer_finetune import make_encoder
    import horovod_cpp.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(1234)
    model = make_encoder(vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                         heads=args.heads, ffn=args.ffn, seq=args.seq)
    params = sum(p.numel() for p in model.parameters())
    whole = 16 * params  # fp32 parameters + gradients + AdamW's two moments
    if rank == 0:
        print("model: %.1f M parameters; held whole for training with AdamW: %.0f MiB per rank"
              % (params / 1e6, whole / 2.0 ** 20), flush=True)
    if args.mode == "sharded3":
        hvd.shard_model(model, auto_wrap={torch.nn.TransformerEncoderLayer})
        opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=3,
                                   lr=args.lr)
    else:
        opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=args.lr),
                                       named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
        y = torch.randint(0, 2, (args.batch,), generator=gen)
        start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(ids), y)
        loss.backward()
        opt.step()
        if rank == 0:
            print("step %d: loss %.4f, %.1f s, RSS %.0f MiB, peak RSS %.0f MiB"
                  % (step, loss.item(), time.perf_counter() - start, rss_mib(), peak_mib()),
                  flush=True)
    peaks = hvd.allgather_object(peak_mib())
    if rank == 0:
        print("STAGE3_LIMIT mode=%s np=%d params=%d whole_mib=%.0f peak_rss_mib=%.0f steps=%d"
              % (args.mode, size, params, whole / 2.0 ** 20, max(peaks), args.steps), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
