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
Rank 0 prints one line:
  META_INIT mode=... np=... params=... fp32_bytes=... init_s=... [sharded_bytes=... peak_rss=...
  steps=... step_s=... checkpoint_s=...]
(sharded_bytes: the parameters, gradients and optimizer state rank 0 holds, from the tensors;
peak_rss: its peak resident set). The default model: 24 layers, hidden 2048, FFN 8192, 16
heads, vocabulary 50,257: 1.31 B parameters, 5.2 GB in fp32."""
import argparse
import os
import resource
import sys
import time


def peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        start = time.perf_counter()
        with torch.device("meta"):
            model = build().to(dtype)
        params = sum(q.numel() for q in model.parameters())
        for layer in model.layers:
            fully_shard(layer)
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
    start = time.perf_counter()
    with hvd.sharded_init():
        model = build().to(dtype)
    params = sum(q.numel() for q in model.parameters())
    hvd.shard_model(model, auto_wrap={torch.nn.TransformerEncoderLayer})
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
    held = opt.held_bytes()
    ckpt_s = 0.0
    if args.checkpoint:
        t0 = time.perf_counter()
        hvd.dcp.save({"model": model, "optim": opt, "step": args.steps}, args.checkpoint)
        ckpt_s = time.perf_counter() - t0
    if rank == 0:
        print("META_INIT mode=sharded3_meta np=%d params=%d fp32_bytes=%d init_s=%.2f "
              "sharded_bytes=%d peak_rss=%d steps=%d step_s=%.2f checkpoint_s=%.1f"
              % (size, params, 4 * params, init_s, sum(held.values()), peak_bytes(),
                 args.steps, sorted(times)[len(times) // 2], ckpt_s), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
