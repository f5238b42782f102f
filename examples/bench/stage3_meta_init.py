"""A model larger than any rank's memory: built on the meta device, initialised by
hvd.shard_model straight into each rank's slices, trained with AdamW and checkpointed in DCP's
format, every rank in a memory cgroup smaller than the model's fp32 parameters.

    mpirun -np 4 scripts/with_memory_limit.sh 4096 python examples/bench/stage3_meta_init.py \\
        --mode MODE [--checkpoint DIR]

MODE:
  sharded3_meta  the model built under hvd.sharded_init() in --dtype (bf16: parameters and
                 AdamW's moments), hvd.shard_model (every layer a unit; the attention built as
                 torch builds it), ShardedOptimizer(stage=3), --steps steps, hvd.dcp.save.
  whole          the same model built whole the usual way (fp32, torch's default): the limit
                 kills it while it is being built.
  fsdp2_meta     FSDP2's meta-device initialisation of the same model (torch.device("meta"),
                 fully_shard on every layer and the root, to_empty, reset_parameters on each
                 module; gloo, CPU), for the initialisation's time.
Units: every TransformerEncoderLayer and every Embedding (the token embedding, 103 M
parameters, is a unit of its own: inside the root it would stay whole through backward).
Rank 0 prints one line:
  META_INIT mode=... np=... params=... fp32_bytes=... init_s=... [base_rss=... runtime_rss=...
  footprint=... rest_rss=... peak_rss=... peak_over_footprint=... growth_over_footprint=...
  growth_over_runtime=... peak_over_rest=... steps=... step_s=... checkpoint_s=...]
(footprint: the parameters, gradients and AdamW state rank 0 holds, from the tensors; base_rss:
its resident set after import torch and hvd.init(), before the model; runtime_rss: that and a
first torch.optim optimizer of one element (which imports torch._dynamo); rest_rss: its resident
set after the last step, what malloc holds free released (the runtime and the shards: the
sharded process at rest); peak_rss: its peak resident set over the whole run, checkpoint
included; growth_over_footprint: (peak_rss - base_rss) / footprint; growth_over_runtime:
(peak_rss - runtime_rss) / footprint; peak_over_rest:
peak_rss / rest_rss). Run with MALLOC_MMAP_THRESHOLD_=131072 (glibc) as bench.sh does: with
glibc's sliding threshold, tensors of 1-32 MiB come from the heap after the first large free,
and the heap keeps what the gathered units leave in it. The default model: 24 layers, hidden
2048, FFN 8192, 16 heads, vocabulary 50,257: 1.31 B parameters, 5.2 GB in fp32."""
import argparse
import os
import resource
import sys
import time


def peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("sharded3_meta", "whole", "fsdp2_meta"), required=True)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--checkpoint", help="directory for hvd.dcp.save (sharded3_meta)")
    p.add_argument("--reductions-in-flight", type=int, default=1,
                   help="shard_model's reductions_in_flight (0: no bound)")
    p.add_argument("--port", type=int, default=29533, help="fsdp2_meta: the rendezvous port")
    args = p.parse_args()

    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from transformer_finetune import make_encoder

    torch.set_num_threads(1)

    def build():
        return make_encoder(vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                            heads=args.heads, ffn=args.ffn, seq=args.seq)

    torch.manual_seed(1234)
    if args.mode == "whole":
        model = build()  # (killed here under the limit)
        params = sum(q.numel() for q in model.parameters())
        print("META_INIT mode=whole params=%d built (not killed)" % params, flush=True)
        return
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.mode == "fsdp2_meta":
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        # (under mpirun: torch.distributed's env:// from Open MPI's variables)
        os.environ.setdefault("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        os.environ.setdefault("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        start = time.perf_counter()
        with torch.device("meta"):
            model = build().to(dtype)
        params = sum(q.numel() for q in model.parameters())
        for unit in [model.tokens, model.positions] + list(model.layers):
            fully_shard(unit)
        fully_shard(model)
        model.to_empty(device="cpu")
        with torch.no_grad():
            for m in model.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
                elif isinstance(m, torch.nn.MultiheadAttention):
                    m._reset_parameters()
        dist.barrier()
        init_s = time.perf_counter() - start
        if rank == 0:
            print("META_INIT mode=fsdp2_meta np=%d params=%d fp32_bytes=%d init_s=%.2f "
                  "peak_rss=%d" % (size, params, 4 * params, init_s, peak_bytes()), flush=True)
        dist.destroy_process_group()
        return

    import horovod_cpp.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    base = rss_bytes()
    # torch's runtime that no model's size changes: the first torch.optim optimizer imports
    # torch._dynamo (its add_param_group is compiler-disabled; ~900 modules, ~80 MB of memory
    # and ~100 MB of library pages here), whichever optimizer and however the model is sharded.
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    runtime = rss_bytes()
    start = time.perf_counter()
    with hvd.sharded_init():
        model = build().to(dtype)
    params = sum(q.numel() for q in model.parameters())
    hvd.shard_model(model, auto_wrap={torch.nn.TransformerEncoderLayer, torch.nn.Embedding},
                    reductions_in_flight=args.reductions_in_flight)
    hvd.allreduce(torch.zeros(1), name="bench.init.done")
    init_s = time.perf_counter() - start
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=3, lr=1e-5,
                               foreach=False)  # (no temporaries the size of the state)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (1, args.seq), generator=gen)
        y = torch.randint(0, 2, (1,), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(ids).float(), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print("step %d: %.2f s, peak RSS %.0f MiB" % (step, times[-1],
                                                       peak_bytes() / 2.0 ** 20), flush=True)
    footprint = sum(opt.held_bytes().values())
    from horovod_cpp.adaptive.memory import release_free_memory
    release_free_memory()
    rest = rss_bytes()  # the runtime and this rank's shards, between steps
    ckpt_s = 0.0
    if args.checkpoint:
        t0 = time.perf_counter()
        hvd.dcp.save({"model": model, "optim": opt, "step": args.steps}, args.checkpoint)
        ckpt_s = time.perf_counter() - t0
    if rank == 0:
        peak = peak_bytes()
        print("META_INIT mode=sharded3_meta np=%d params=%d fp32_bytes=%d init_s=%.2f "
              "base_rss=%d runtime_rss=%d footprint=%d rest_rss=%d peak_rss=%d "
              "peak_over_footprint=%.3f growth_over_footprint=%.3f "
              "growth_over_runtime=%.3f peak_over_rest=%.3f steps=%d step_s=%.2f "
              "checkpoint_s=%.1f"
              % (size, params, 4 * params, init_s, base, runtime, footprint, rest, peak,
                 peak / footprint, (peak - base) / footprint, (peak - runtime) / footprint,
                 peak / rest, args.steps,
                 sorted(times)[len(times) // 2] if times else 0.0, ckpt_s), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
