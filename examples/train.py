"""Trains a small classifier on the 1,797 8x8 handwritten digits with horovod_cpp.

    mpirun -np 2 .venv/bin/python examples/train.py [--epochs 20] [--batch-size 32] [--lr 0.1]

The dataset is examples/data/digits.csv (scikit-learn's digits, see examples/data/README.md);
every fifth image is held out for testing. Each epoch every rank draws the same permutation of
the training set and takes its slice of every global batch, so the global batch (and the
result) does not depend on the number of ranks. Rank 0 prints loss, test accuracy and
samples/s per epoch, then the final accuracy.

--compression fp16|bf16 sends the gradients in half precision; --compression powersgd sends
rank --powersgd-rank approximations of the weight matrices (PowerSGD with error feedback) from
step --powersgd-start on, and prints the compression rate.
"""
import argparse
import os
import time

import numpy as np
import torch

import horovod_cpp.torch as hvd

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv")


def load_digits(path):
    data = np.loadtxt(path, delimiter=",", comments="#", dtype=np.float32)
    images = torch.from_numpy(data[:, :64] / 16.0)
    labels = torch.from_numpy(data[:, 64].astype(np.int64))
    test = torch.arange(len(labels)) % 5 == 0
    return images[~test], labels[~test], images[test], labels[test]


def make_compression(name, powersgd_rank=2, powersgd_start=50):
    if name == "powersgd":
        # Every step compressed (adaptive=False): the example shows what the approximation
        # does to accuracy, not whether it pays on this link.
        return hvd.Compression.powersgd(matrix_approximation_rank=powersgd_rank,
                                        start_powerSGD_iter=powersgd_start, adaptive=False)
    return getattr(hvd.Compression, name)


def train(dataset, epochs=20, batch_size=32, lr=0.1, seed=42, log=print, compression="none",
          powersgd_rank=2, powersgd_start=50, op="average"):
    """Trains on ``dataset`` = (x_train, y_train, x_test, y_test) on every rank; rank 0 reports
    progress through ``log``. Returns the final test accuracy (the same on every rank)."""
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(seed)
    x_train, y_train, x_test, y_test = dataset

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    comp = make_compression(compression, powersgd_rank, powersgd_start)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=comp,
                                         op=hvd.Adasum if op == "adasum" else hvd.Average)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    steps = len(y_train) // batch_size
    accuracy = 0.0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        loss_sum = torch.zeros(1)
        for step in range(steps):
            batch = order[step * batch_size:(step + 1) * batch_size][rank::size]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        elapsed = time.perf_counter() - start

        model.eval()
        with torch.no_grad():
            mine = slice(rank, None, size)  # each rank scores its share of the test set
            correct = (model(x_test[mine]).argmax(1) == y_test[mine]).sum().float().reshape(1)
        correct = hvd.allreduce(correct, op=hvd.Sum, name="correct").item()
        mean_loss = hvd.allreduce(loss_sum / steps, name="loss").item()
        accuracy = correct / len(y_test)
        if rank == 0:
            log("epoch %2d/%d  loss %.4f  test accuracy %.4f  %.0f samples/s"
                % (epoch, epochs, mean_loss, accuracy, steps * batch_size / elapsed))
    if rank == 0 and compression == "powersgd":
        log("powersgd: rank %d from step %d, %.1fx fewer numbers sent per step"
            % (powersgd_rank, powersgd_start, comp.compression_rate()))
    if rank == 0:
        log("final test accuracy: %.4f (%d rank%s, %d test images)"
            % (accuracy, size, "" if size == 1 else "s", len(y_test)))
    hvd.shutdown()
    return accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--compression", choices=("none", "fp16", "bf16", "powersgd"),
                        default="none", help="how gradients travel (default: none)")
    parser.add_argument("--powersgd-rank", type=int, default=2,
                        help="PowerSGD's matrix_approximation_rank (default 2)")
    parser.add_argument("--powersgd-start", type=int, default=50,
                        help="steps averaged exactly before PowerSGD starts (default 50)")
    parser.add_argument("--op", choices=("average", "adasum"), default="average",
                        help="how the ranks' updates combine (adasum: each rank steps, the "
                             "deltas are combined adaptively; use one rank's learning rate)")
    parser.add_argument("--data", default=DEFAULT_DATA)
    args = parser.parse_args()
    train(load_digits(args.data), epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
          seed=args.seed, log=lambda line: print(line, flush=True), compression=args.compression,
          powersgd_rank=args.powersgd_rank, powersgd_start=args.powersgd_start, op=args.op)


if __name__ == "__main__":
    main()
