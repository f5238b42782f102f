"""Trains the digits classifier with hvd.ShardedOptimizer: optimizer state (and, at stage 2,
gradients) split over the ranks.

    mpirun -np 2 .venv/bin/python examples/sharded_train.py [--stage 2] [--epochs 20]
        [--batch-size 32] [--lr 0.003] [--hidden 256] [--checkpoint digits.pt]

The model is a 64-256-256-10 MLP trained with AdamW; each epoch every rank draws the same
permutation of the training set and takes its slice of every global batch, so the result does
not depend on the number of ranks. Every epoch rank 0 prints the loss, the test accuracy and the
bytes of optimizer state each rank holds, next to what the unsharded optimizer would hold on
every rank; then the final accuracy. With --checkpoint the whole optimizer state is gathered
(consolidate_state_dict) and saved with the model on rank 0, in the unsharded optimizer's
format, loadable at any number of ranks.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import DEFAULT_DATA, load_digits  # noqa: E402

import horovod_cpp.torch as hvd  # noqa: E402


def kib(n):
    return "%.1f KiB" % (n / 1024.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", type=int, choices=(1, 2), default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint", help="save the model and the whole optimizer state here")
    parser.add_argument("--data", default=DEFAULT_DATA)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.data)
    h = args.hidden
    model = torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                                torch.nn.ReLU(), torch.nn.Linear(h, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW,
                                     stage=args.stage, lr=args.lr, weight_decay=0.01)
    params = sum(p.numel() for p in model.parameters())

    steps = len(y_train) // args.batch_size
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        loss_sum = torch.zeros(1)
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size][rank::size]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.clip_grad_norm_(5.0)
            optimizer.step()
            loss_sum += loss.detach()
        elapsed = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            mine = slice(rank, None, size)
            correct = (model(x_test[mine]).argmax(1) == y_test[mine]).sum().float().reshape(1)
        correct = hvd.allreduce(correct, op=hvd.Sum, name="correct").item()
        mean_loss = hvd.allreduce(loss_sum / steps, name="loss").item()
        accuracy = correct / len(y_test)
        # What each rank holds of the optimizer state (its slices), and what AdamW would hold
        # unsharded on every rank: its two moments for every parameter, a step per tensor.
        held = optimizer.held_bytes()
        per_rank = hvd.allgather_object(held["optimizer_state"], name="held")
        unsharded = 2 * 4 * params + 4 * len(list(model.parameters()))
        if rank == 0:
            print("epoch %2d/%d  loss %.4f  test accuracy %.4f  %.0f samples/s  optimizer state "
                  "per rank %s (%s .. %s over %d ranks) vs %s unsharded; gradients held %s"
                  % (epoch, args.epochs, mean_loss, accuracy, steps * args.batch_size / elapsed,
                     kib(per_rank[0]), kib(min(per_rank)), kib(max(per_rank)), size,
                     kib(unsharded), kib(held["gradients"])), flush=True)
    if args.checkpoint:
        optimizer.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       args.checkpoint)
            print("saved %s (the whole optimizer state, loadable at any number of ranks)"
                  % args.checkpoint, flush=True)
    if rank == 0:
        print("final test accuracy: %.4f (%d rank%s, %d test images, stage %d)"
              % (accuracy, size, "" if size == 1 else "s", len(y_test), args.stage), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
