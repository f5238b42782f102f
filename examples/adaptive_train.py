"""Adaptive training (horovod_cpp.torch.adaptive) on the 8x8 digits: the job chooses its own
global batch, per-rank micro-batch, accumulation and learning-rate factor by goodput.

    mpirun -np 2 .venv/bin/python examples/adaptive_train.py [--epochs 30] [--batch-size 32]
        [--max-batch-size 512] [--accumulation] [--elastic] [--plot out.png] [--json out.json]

Rank 0 prints, per epoch: the global batch, micro-batch and accumulation steps in use, the
learning-rate factor, the gradient noise scale, the loss and the test accuracy; then the final
accuracy and the batch sizes the job went through. --plot draws batch size, accumulation,
learning-rate factor, noise scale and predicted goodput over the steps (needs matplotlib);
--json writes the same series. With --elastic the loop runs under hvd.elastic.run (launch it
with hvdrun's elastic options): a resize keeps the adaptive state and chooses the batch again
on its first step. Rank 0 then prints a "resize:" line as soon as the first step at the new
size is done (the pause: from the last step at the old size to it), every rank a "moments
check" (the optimizer's state after the reset against the last commit's), and, with --ledger,
every epoch's committed samples (gathered from every rank each step: duplicates and missing
ones counted).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import DEFAULT_DATA, load_digits  # noqa: E402

import horovod_cpp.torch as hvd  # noqa: E402
import horovod_cpp.torch.adaptive as adl  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="initial global batch B0")
    p.add_argument("--max-batch-size", type=int, default=512)
    p.add_argument("--accumulation", action="store_true", help="allow gradient accumulation")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--decide-every", type=int, default=10)
    p.add_argument("--elastic", action="store_true", help="run under hvd.elastic.run")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds of extra work per step (to watch a resize happen)")
    p.add_argument("--commit-every", type=int, default=10, help="elastic: steps per commit")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--ledger", action="store_true",
                   help="keep every epoch's committed samples and check them at its end")
    p.add_argument("--plot", help="draw the adaptive counters over the steps into this file")
    p.add_argument("--json", help="write the adaptive counters over the steps here")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--min-accuracy", type=float, default=0.0,
                   help="exit non-zero below this final test accuracy (for the tests)")
    p.add_argument("--expect-adapted", action="store_true",
                   help="exit non-zero unless the job changed its batch size (for the tests)")
    p.add_argument("--simulate-oom-above", type=int, metavar="N",
                   help="the model raises torch's OutOfMemoryError on a micro-batch of more "
                        "than N samples (for the tests: with --elastic the job backs off)")
    p.add_argument("--oom-rank", type=int, default=-1,
                   help="with --simulate-oom-above: only this rank runs out (-1: every rank)")
    return p.parse_args(argv)


def plot(series, path):
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib (pip install matplotlib); --json writes the "
                         "same series without it")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = [("batch_size", "global batch"), ("accumulation_steps", "accumulation steps"),
            ("lr_factor", "learning-rate factor"), ("noise_scale", "noise scale (samples)"),
            ("goodput", "predicted goodput (samples/s)")]
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2 * len(keys)), sharex=True)
    steps = [s["steps"] for s in series]
    for ax, (key, label) in zip(axes, keys):
        ax.plot(steps, [s[key] if s[key] is not None else float("nan") for s in series])
        ax.set_ylabel(label, fontsize=8)
    axes[-1].set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(path)


class OutOfMemoryAbove(torch.nn.Module):
    """``module``, except that a micro-batch of more than ``limit`` samples raises torch's
    out-of-memory error (on rank ``only_rank``, or on every rank if it is -1), as a GPU would
    at its limit."""

    def __init__(self, module, limit, only_rank=-1):
        super().__init__()
        self.module, self.limit, self.only_rank = module, limit, only_rank

    def forward(self, x):
        if torch.is_grad_enabled() and len(x) > self.limit and \
                self.only_rank in (-1, hvd.rank()):
            error = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
            raise error("simulated: a micro-batch of %d samples does not fit (at most %d)"
                        % (len(x), self.limit))
        return self.module(x)


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = load_digits(args.data)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    if args.simulate_oom_above:
        model = OutOfMemoryAbove(model, args.simulate_oom_above, args.oom_rank)
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr / 10)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model = adl.AdaptiveDataParallel(model, optimizer, decide_every=args.decide_every)
    if not args.elastic:  # (elastic: TorchState's sync broadcasts, on every rank alike)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    index = torch.arange(len(y_train))
    loader = adl.AdaptiveDataLoader(torch.utils.data.TensorDataset(x_train, y_train, index),
                                    batch_size=args.batch_size, shuffle=True)
    loader.autoscale_batch_size(args.max_batch_size, gradient_accumulation=args.accumulation)
    series = []
    start = time.time()

    def accuracy():
        with torch.no_grad():
            return (model(x_test).argmax(1) == y_test).float().mean().item()

    printed = [0]  # resizes reported so far

    def report_resizes():
        for r in model.resizes[printed[0]:]:
            if "first_step" not in r:
                return
            printed[0] += 1
            if hvd.rank() == 0:
                pause = r["first_step"] - r["last_step"] if r.get("last_step") else float("nan")
                print("resize: %d -> %d ranks at %.3f, pause %.3f s from the last step at the "
                      "old size, first step at the new size ended at %.3f with batch %s (micro "
                      "%s x %s%s), chosen again at its first step"
                      % (r["from"], r["to"], r["at"], pause, r["first_step"], r["batch_size"],
                         r["local_bsz"], r["accumulation_steps"] + 1,
                         "" if r.get("full", True) else "; the epoch's short last step"),
                      flush=True)

    def train(state):
        for epoch in adl.remaining_epochs_until(args.epochs):
            total = adl.Accumulator()
            for x, y, idx in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                if args.step_delay:
                    time.sleep(args.step_delay)
                total["loss"] += loss.item() * len(y)
                total["n"] += len(y)
                if state is not None and args.ledger:
                    for part in hvd.allgather_object(idx.tolist(), name="ledger"):
                        state.ledger.setdefault(epoch, []).extend(part)
                if loader.is_optim_step():
                    report_resizes()
                    series.append(dict(adl.stats(), time=time.time() - start))
                    if state is not None and model.steps % args.commit_every == 0:
                        state.commit()
            with total.synchronized():
                loss = total["loss"] / max(1, total["n"])
            if not total["n"]:
                # An epoch whose end was committed, entered again after a reset rolled back
                # to that commit: nothing left to draw, and it was reported.
                continue
            if state is not None and args.ledger and hvd.rank() == 0:
                seen = state.ledger.get(epoch, [])
                print("ledger: epoch %d: %d samples, %d seen twice, %d missing (%d ranks)"
                      % (epoch, len(seen), len(seen) - len(set(seen)),
                         len(y_train) - len(set(seen)), hvd.size()), flush=True)
            s = adl.stats()
            if hvd.rank() == 0:
                phi = s["noise_scale"]
                print("epoch %3d  %d ranks  batch %4d (micro %3d x %d)  lr x%.2f  noise %s  "
                      "loss %.4f  test accuracy %.4f"
                      % (epoch, hvd.size(), s["batch_size"], s["local_bsz"],
                         s["accumulation_steps"] + 1, s["lr_factor"],
                         "%.1f" % phi if phi is not None else "-", loss, accuracy()),
                      flush=True)
            if state is not None:
                state.commit()

    if args.elastic:
        state = hvd.elastic.TorchState(model, optimizer, ledger={})
        committed = {}  # the optimizer state's checksum at the last commit
        printed_oom = [0]  # out-of-memory back-offs reported so far

        def checksum():
            return sum(float(v.double().sum()) for s in optimizer.state.values()
                       for v in s.values() if torch.is_tensor(v) and v.dim() > 0)

        base_save = state.save

        def save():  # (commit saves, then may raise HostsUpdatedInterrupt)
            base_save()
            committed["sum"] = checksum()
        state.save = save

        def on_reset():
            for oom in model.out_of_memory[printed_oom[0]:]:
                printed_oom[0] += 1
                print("back-off: rank %d ran out of memory at micro-batch %d at step %d; "
                      "micro-batches of at most %d from now on"
                      % (hvd.rank(), oom["micro_batch"], oom["step"], oom["limit"]),
                      flush=True)
            if "sum" in committed:
                print("moments check: rank %d of %d: optimizer state equal to the last commit "
                      "%s" % (hvd.rank(), hvd.size(), checksum() == committed["sum"]),
                      flush=True)
        state.register_reset_callbacks([on_reset])

        @hvd.elastic.run
        def elastic_train(state):
            train(state)

        elastic_train(state)
    else:
        train(None)
    final = accuracy()
    if hvd.rank() == 0:
        used = sorted({s["batch_size"] for s in series})
        print("final test accuracy: %.4f (%d ranks at the end; %d steps, %.1f s; batch sizes "
              "used: %s%s)" % (final, hvd.size(), len(series), time.time() - start,
                               " ".join(map(str, used)),
                               "; micro-batches of at most %d after running out of memory at "
                               "%d" % (model.oom_limit(), model.oom_ceiling)
                               if model.oom_ceiling else ""), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(series, f)
        if args.plot:
            plot(series, args.plot)
    sizes = {s["batch_size"] for s in series}
    hvd.shutdown()
    if final < args.min_accuracy:
        raise SystemExit("final accuracy %.4f is below %.4f" % (final, args.min_accuracy))
    if args.expect_adapted and len(sizes) < 2:
        raise SystemExit("the batch size never changed: %s" % sorted(sizes))


if __name__ == "__main__":
    main()
