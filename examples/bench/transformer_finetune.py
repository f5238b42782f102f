"""A DistilBERT-shaped fine-tune on CPU, one thread per rank (the seed workload of Intel's
CPU-cluster study): hvd.DistributedOptimizer against torch DistributedDataParallel (gloo), same
model, same data, same processes, in interleaved blocks.

    mpirun -np 1 .venv-pypi/bin/python examples/bench/transformer_finetune.py --out one.json
    mpirun -np 2 .venv-pypi/bin/python examples/bench/transformer_finetune.py --out two.json
    python3 examples/bench/transformer_finetune.py --compare one.json two.json [--id T7]

The model: DistilBERT's shape (6 encoder layers, hidden 768, 12 heads, FFN 3072, vocabulary
30,522, ~66 M parameters) built from torch.nn layers with random weights (nothing is
downloaded), a 2-class head; sequences of 64 tokens, 4 per rank. Rank 0 writes the samples/s of
both methods; --compare prints one FIGURE line: the 1 -> N scaling efficiency of each (samples/s
at N / (N x samples/s at 1)), ratio = ours / DDP's (target >= 1.0). Both copies take the same
steps from the same weights, so their parameters must agree (checked; a mismatch exits 1).
"""
import argparse
import json
import os
import sys
import time


def make_encoder(vocab, hidden, layers, heads, ffn, seq, classes=2):
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = torch.nn.Embedding(vocab, hidden)
            self.positions = torch.nn.Embedding(seq, hidden)
            self.norm = torch.nn.LayerNorm(hidden)
            self.layers = torch.nn.ModuleList(
                [torch.nn.TransformerEncoderLayer(hidden, heads, ffn, dropout=0.0,
                                                  activation="gelu", batch_first=True)
                 for _ in range(layers)])
            self.head = torch.nn.Linear(hidden, classes)

        def forward(self, ids):
            positions = torch.arange(ids.shape[1]).unsqueeze(0)
            h = self.norm(self.tokens(ids) + self.positions(positions))
            for layer in self.layers:
                h = layer(h)
            return self.head(h[:, 0])

    return Encoder()


def measure(args):
    import torch
    import torch.distributed as dist

    from bench_models import interleaved_blocks, percentile
    import horovod_cpp.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.master in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (args.master, args.port),
                            rank=rank, world_size=size)
    shape = dict(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                 ffn=args.ffn, seq=args.seq)
    torch.manual_seed(1234)
    ours_model = make_encoder(**shape)
    ddp_model = make_encoder(**shape)
    ddp_model.load_state_dict(ours_model.state_dict())
    params = sum(p.numel() for p in ours_model.parameters())
    ours_opt = hvd.DistributedOptimizer(torch.optim.AdamW(ours_model.parameters(), lr=1e-5),
                                        named_parameters=ours_model.named_parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    data = [(torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen),
             torch.randint(0, 2, (args.batch,), generator=gen)) for _ in range(args.steps)]

    def block(model, opt):
        hvd.barrier()
        start = time.perf_counter()
        for ids, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
                loss = torch.nn.functional.cross_entropy(model(ids), y)
            loss.backward()
            opt.step()
        return (time.perf_counter() - start) * 1000.0

    ours, base = interleaved_blocks(args.blocks, block, (ours_model, ours_opt), (ddp, ddp_opt))
    worst = max((a - d).abs().max().item()
                for a, d in zip(ours_model.parameters(), ddp_model.parameters()))
    samples = args.steps * args.batch * size
    result = dict(np=size, params=params, ours_p50_ms=percentile(ours, 0.5),
                  ddp_p50_ms=percentile(base, 0.5), max_param_diff=worst,
                  torch=torch.__version__, data_plane=hvd.basics._core.host_backend(),
                  autocast=args.autocast, seq=args.seq, batch=args.batch)
    result["ours_samples_per_s"] = samples / result["ours_p50_ms"] * 1000.0
    result["ddp_samples_per_s"] = samples / result["ddp_p50_ms"] * 1000.0
    if rank == 0:
        print("FINETUNE " + " ".join("%s=%s" % kv for kv in sorted(result.items())), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()
    hvd.shutdown()
    if worst > 1e-4:
        print("transformer_finetune: rank %d: parameters differ from DDP's by %.3e"
              % (rank, worst), file=sys.stderr)
        return 1
    return 0


def compare(args):
    one, many = (json.load(open(path)) for path in args.compare)
    eff = {k: many[k + "_samples_per_s"] / (many["np"] * one[k + "_samples_per_s"])
           for k in ("ours", "ddp")}
    ratio = eff["ours"] / eff["ddp"]
    print("FIGURE %s name=transformer_finetune_scaling_1_to_%d%s p50_ms=%.1f baseline=torch_DDP_gloo "
          "base_p50_ms=%.1f ratio=%.3f ours_efficiency=%.3f ddp_efficiency=%.3f "
          "ours_samples_per_s=%.2f ddp_samples_per_s=%.2f params=%d data_plane=%s torch=%s "
          "target=>=1.0 met=%s"
          % (args.id, many["np"], args.label, many["ours_p50_ms"], many["ddp_p50_ms"], ratio,
             eff["ours"], eff["ddp"], many["ours_samples_per_s"], many["ddp_samples_per_s"],
             many["params"], many.get("data_plane", "?"), many["torch"],
             "yes" if ratio >= 1.0 else "no"))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=3, help="measured blocks per method")
    p.add_argument("--steps", type=int, default=4, help="training steps per block")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--port", type=int, default=29519, help="gloo rendezvous port")
    p.add_argument("--master", default="127.0.0.1",
                   help="address of rank 0's host, for DDP's gloo rendezvous")
    p.add_argument("--autocast", choices=("none", "bf16"), default="none",
                   help="bf16: forward under torch.autocast (bfloat16), as Intel's guide")
    p.add_argument("--out", help="write rank 0's figures here (JSON)")
    p.add_argument("--compare", nargs=2, metavar=("ONE_RANK", "N_RANKS"),
                   help="print the scaling FIGURE from two --out files")
    p.add_argument("--id", default="T7")
    p.add_argument("--label", default="")
    args = p.parse_args()
    return compare(args) if args.compare else measure(args)


if __name__ == "__main__":
    sys.exit(main())
