"""The elastic reshard of a sharded optimizer after a lost rank, 4 -> 3 ranks, on the 108.5
M-parameter transformer (12 layers, hidden 768, FFN 3072, vocabulary 30,522) with AdamW:
each round the three survivors roll back to the last commit and reshard it over themselves
(the lost rank's slices from their replica), and the bytes each survivor received and the
reshard's seconds are reported, with the bytes of the flat state whole (what a reshard that
gathers every old slice on every rank receives).

    mpirun -np 4 python examples/bench/reshard_bench.py --stage 3 [--rounds 3]

Prints one line per round and a summary: "RESHARD stage=S ranks=4->3 bytes_received=B
(whole=W, W/B=x) seconds min/median/max"."""
import argparse
import os
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", type=int, default=3, choices=(1, 2, 3))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()

    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from transformer_finetune import make_encoder
    import horovod_cpp.torch as hvd

    torch.set_num_threads(1)
    os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # (the survivors' set)
    hvd.init()
    if hvd.size() < 2:
        raise SystemExit("reshard_bench: run it at 2 or more ranks (one is lost)")
    torch.manual_seed(0)
    model = make_encoder(30522, 768, args.layers, 12, 3072, 16)
    params = sum(p.numel() for p in model.parameters())
    if args.stage == 3:
        hvd.shard_model(model, auto_wrap={torch.nn.TransformerEncoderLayer})
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=args.stage,
                               lr=1e-4)
    ids = torch.randint(0, 30522, (2, 16))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(ids), torch.zeros(2, dtype=torch.long)).backward()
    opt.step()
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    state.commit()
    # The flat state whole: AdamW's two moments (and, at stage 3, the parameters) in fp32.
    whole = params * 4 * (3 if args.stage == 3 else 2)
    survivors = hvd.add_process_set(list(range(hvd.size() - 1)))
    times, received = [], []
    for r in range(args.rounds):
        if survivors.included():
            state.restore()
            start = time.perf_counter()
            opt._elastic_reshard(process_set=survivors)
            took = time.perf_counter() - start
            got = hvd.allgather_object((took, getattr(opt, "reshard_bytes", None)),
                                       process_set=survivors,
                                       name="bench.reshard.%d" % r)
            times.append(max(t for t, _ in got))
            # (a reshard that gathers every old slice does not count: each survivor received
            # the state whole)
            received.append(sum(b if b is not None else whole for _, b in got))
            if hvd.rank() == 0:
                print("round %d: %.3f s, %.1f MB received by the %d survivors"
                      % (r, times[-1], received[-1] / 1e6, len(got)), flush=True)
    if hvd.rank() == 0:
        print("RESHARD stage=%d ranks=%d->%d params=%.1fM bytes_received=%d (whole=%d, "
              "whole/received=%.2f) seconds min/median/max %.3f/%.3f/%.3f"
              % (args.stage, hvd.size(), hvd.size() - 1, params / 1e6, received[-1],
                 whole * (hvd.size() - 1), whole * (hvd.size() - 1) / float(received[-1]),
                 min(times), statistics.median(times), max(times)), flush=True)
    hvd.remove_process_set(survivors)
    hvd.shutdown()


if __name__ == "__main__":
    main()
