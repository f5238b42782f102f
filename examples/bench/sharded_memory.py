"""Bytes per rank and throughput of hvd.ShardedOptimizer (stages 1 and 2) against
hvd.DistributedOptimizer and torch's ZeroRedundancyOptimizer (with DDP on gloo, as torch runs
it), and of stage 3 (hvd.shard_model, every encoder layer a unit) against torch's FSDP
(FULL_SHARD, gloo, CPU, the same units), on a transformer-shaped model of ~110 M parameters
with Adam (--optimizer adamw: AdamW), random data.

    mpirun -np N python examples/bench/sharded_memory.py --mode MODE --out DIR/MODE.N.R.json
    python3 examples/bench/sharded_memory.py --compare DIR

MODE: distributed, sharded1, sharded2, torch_zero, sharded3 or torch_fsdp; one process per
rank and mode, so that
each mode's peak RSS is its own. Each run takes --warmup steps (the first ones allocate and
page in what later steps reuse) and --steps timed steps, then
counts what rank 0 holds, from the tensors: the parameters, the gradients (after the step, as
they are between backward and the next zero_grad) and the optimizer state; and the peak RSS of
the process. --compare prints FIGURE lines (ratios between modes measured in the same
bench.sh run; the median over its rounds):
  S1  bytes held per rank, stage 2 / DistributedOptimizer at the largest np (target <= 0.45)
  S2  the same for stage 1 (no target), S3 for torch ZeRO (no target)
  S4  samples/s, stage 1 / DistributedOptimizer at np 2 (target >= 0.95)
  S5  samples/s, stage 2 / DistributedOptimizer at np 2 (target >= 0.95)
  S6  samples/s, stage 1 / torch ZeRO at np 2 (target >= 1.0)
  S7  samples/s, stage 2 / torch ZeRO at np 2 (target >= 1.0)
  S8  bytes held per rank, stage 3 / DistributedOptimizer at the largest np (target <= 0.30)
  S9  samples/s, stage 3 / DistributedOptimizer at np 2 (target >= 0.85)
  S10 bytes held per rank, stage 3 / torch FSDP at the largest np (no target)
  S11 samples/s, stage 3 / torch FSDP at np 2 (no target)
and a table of every (np, mode). Every mode takes the same steps from the same weights on the
same data, so the final parameters must agree (checked: a mismatch exits 1).
"""
import argparse
import collections
import glob
import json
import os
import resource
import statistics
import sys
import time

MODES = ("distributed", "sharded1", "sharded2", "torch_zero", "sharded3", "torch_fsdp")


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def state_bytes(state):
    import torch
    return sum(v.numel() * v.element_size() for s in state.values() for v in s.values()
               if torch.is_tensor(v))


def measure(args):
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
    adam = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    dist = None
    layer = torch.nn.TransformerEncoderLayer
    if args.mode == "distributed":
        opt = hvd.DistributedOptimizer(adam(model.parameters(), lr=args.lr),
                                       named_parameters=model.named_parameters())
        run = model
    elif args.mode in ("sharded1", "sharded2", "sharded3"):
        if args.mode == "sharded3":
            hvd.shard_model(model, auto_wrap={layer})
        opt = hvd.ShardedOptimizer(model.named_parameters(), adam,
                                   stage=int(args.mode[-1]), lr=args.lr)
        run = model
    elif args.mode == "torch_fsdp":
        import functools
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=rank, world_size=size)
        run = FullyShardedDataParallel(
            model, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"),
            auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                               transformer_layer_cls={layer}))
        opt = adam(run.parameters(), lr=args.lr)
    else:
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=rank, world_size=size)
        run = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True) \
            if size > 1 else model
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=adam, lr=args.lr)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the batch
    data = [(torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen),
             torch.randint(0, 2, (args.batch,), generator=gen))
            for _ in range(args.warmup + args.steps)]

    def step(ids, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(run(ids), y).backward()
        opt.step()

    for ids, y in data[:args.warmup]:  # the optimizer state is created; the allocator settles
        step(ids, y)
    hvd.barrier()
    start = time.perf_counter()
    for ids, y in data[args.warmup:]:
        step(ids, y)
    hvd.barrier()
    seconds = time.perf_counter() - start

    if args.mode.startswith("sharded"):
        held = opt.held_bytes()
    else:
        inner = opt.optim if args.mode == "torch_zero" else opt
        held = {"parameters": tensor_bytes(run.parameters()),
                "gradients": tensor_bytes(p.grad for p in run.parameters()),
                "optimizer_state": state_bytes(inner.state)}
    if args.mode == "sharded3":
        whole = hvd.sharding_of(model).gathered()
    elif args.mode == "torch_fsdp":
        whole = run.summon_full_params(run)
    else:
        import contextlib
        whole = contextlib.nullcontext()
    with whole:
        checksum = float(sum(p.detach().double().abs().sum() for p in model.parameters()))
    result = dict(mode=args.mode, np=size, params=params, steps=args.steps, seconds=seconds,
                  samples_per_s=args.steps * args.batch * size / seconds,
                  held=sum(held.values()), peak_rss=resource.getrusage(
                      resource.RUSAGE_SELF).ru_maxrss * 1024,
                  checksum=checksum, torch=torch.__version__, optimizer=args.optimizer, **held)
    if rank == 0:
        print("SHARDED " + " ".join("%s=%s" % kv for kv in sorted(result.items())), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()
    return 0


def compare(args):
    runs = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(args.compare, "*.json"))):
        r = json.load(open(path))
        runs[(r["np"], r["mode"])].append(r)
    if not runs:
        print("sharded_memory: no results in %s" % args.compare, file=sys.stderr)
        return 1

    def med(np_, mode, key):
        values = [r[key] for r in runs.get((np_, mode), [])]
        return statistics.median(values) if values else None

    nps = sorted({n for n, _ in runs})
    any_run = next(iter(runs.values()))[0]
    print("# %d parameters, %s fp32, torch %s; per rank (rank 0): parameters + gradients + "
          "optimizer state counted from the tensors, peak RSS of the process"
          % (any_run["params"], {"adamw": "AdamW"}.get(any_run.get("optimizer"), "Adam"),
             any_run["torch"]))
    print("# %3s %-12s %9s %9s %9s %9s %9s %10s" % ("np", "mode", "params", "grads", "state",
                                                   "held", "peak_rss", "samples/s"))
    mib = 1024.0 * 1024.0
    for n in nps:
        for mode in MODES:
            if (n, mode) not in runs:
                continue
            print("# %3d %-12s %8.0fM %8.0fM %8.0fM %8.0fM %8.0fM %10.2f" % (
                n, mode, med(n, mode, "parameters") / mib, med(n, mode, "gradients") / mib,
                med(n, mode, "optimizer_state") / mib, med(n, mode, "held") / mib,
                med(n, mode, "peak_rss") / mib, med(n, mode, "samples_per_s")))

    failed = 0
    for n in nps:  # every mode trained the same steps from the same weights
        sums = {mode: med(n, mode, "checksum") for mode in MODES if (n, mode) in runs}
        ref = sums.get("distributed")
        for mode, value in sums.items():
            if ref is not None and abs(value - ref) > 1e-5 * abs(ref):
                print("sharded_memory: np %d: %s's parameters differ from DistributedOptimizer's "
                      "(checksum %.9g vs %.9g)" % (n, mode, value, ref), file=sys.stderr)
                failed = 1

    top = nps[-1]

    def figure(fid, name, num, den, key, target, lower_is_better):
        a, b = med(top if key == "held" else 2, num, key), med(top if key == "held" else 2, den,
                                                                 key)
        if a is None or b is None:
            return
        ratio = a / b
        met = "n/a" if target is None else (
            "yes" if (ratio <= target if lower_is_better else ratio >= target) else "no")
        n = top if key == "held" else 2
        print("FIGURE %s name=%s_np%d%s ours=%.4g baseline=%s base=%.4g ratio=%.3f "
              "rounds=%d target=%s met=%s" % (
                  fid, name, n, args.label, a, den, b, ratio, len(runs[(n, num)]),
                  "n/a" if target is None else ("<=%g" % target if lower_is_better
                                                else ">=%g" % target), met))

    figure("S1", "sharded2_bytes_per_rank", "sharded2", "distributed", "held", 0.45, True)
    figure("S2", "sharded1_bytes_per_rank", "sharded1", "distributed", "held", None, True)
    figure("S3", "torch_zero_bytes_per_rank", "torch_zero", "distributed", "held", None, True)
    figure("S4", "sharded1_samples_per_s", "sharded1", "distributed", "samples_per_s", 0.95,
           False)
    figure("S5", "sharded2_samples_per_s", "sharded2", "distributed", "samples_per_s", 0.95,
           False)
    figure("S6", "sharded1_vs_torch_zero_samples_per_s", "sharded1", "torch_zero",
           "samples_per_s", 1.0, False)
    figure("S7", "sharded2_vs_torch_zero_samples_per_s", "sharded2", "torch_zero",
           "samples_per_s", 1.0, False)
    figure("S8", "sharded3_bytes_per_rank", "sharded3", "distributed", "held", 0.30, True)
    figure("S9", "sharded3_samples_per_s", "sharded3", "distributed", "samples_per_s", 0.85,
           False)
    figure("S10", "sharded3_vs_torch_fsdp_bytes_per_rank", "sharded3", "torch_fsdp", "held",
           None, True)
    figure("S11", "sharded3_vs_torch_fsdp_samples_per_s", "sharded3", "torch_fsdp",
           "samples_per_s", None, False)
    return failed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--warmup", type=int, default=2, help="steps before the timed ones")
    p.add_argument("--steps", type=int, default=4, help="timed steps")
    p.add_argument("--batch", type=int, default=2, help="sequences per rank")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--optimizer", choices=("adam", "adamw"), default="adam")
    p.add_argument("--port", type=int, default=29531, help="gloo rendezvous port (torch_zero)")
    p.add_argument("--out", help="write rank 0's figures here (JSON)")
    p.add_argument("--compare", metavar="DIR", help="print the FIGURE lines from DIR/*.json")
    p.add_argument("--label", default="")
    args = p.parse_args()
    if args.compare:
        return compare(args)
    if not args.mode:
        p.error("--mode is required (or --compare)")
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
