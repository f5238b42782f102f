"""Trains a small classifier on the 1,797 8x8 handwritten digits with Keras 3 and
horovod_cpp.keras (Keras's TensorFlow backend by default; KERAS_BACKEND=torch runs the same
script on PyTorch).

    mpirun -np 2 .venv-tf/bin/python examples/keras_train.py [--epochs 20] [--batch-size 32]

The dataset is examples/data/digits.csv (every fifth image held out for testing). Every rank
draws the same permutation each epoch and takes its slice of every global batch, so the global
batch (and the result) does not depend on the number of ranks. The learning rate is the
global batch's (no scaling with the ranks needed); the model starts from rank 0's weights
(BroadcastGlobalVariablesCallback) and the epoch's metrics are averaged over the ranks
(MetricAverageCallback). Rank 0 prints loss and test accuracy per epoch, then the final
accuracy.
"""
import argparse
import os
import time

import numpy as np

import keras

import horovod_cpp.keras as hvd

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv")


def load_digits(path):
    data = np.loadtxt(path, delimiter=",", comments="#", dtype=np.float32)
    images, labels = data[:, :64] / 16.0, data[:, 64].astype(np.int32)
    test = np.arange(len(labels)) % 5 == 0
    return images[~test], labels[~test], images[test], labels[test]


def rank_slices(x, y, epoch, batch_size, seed, rank, size):
    """This rank's rows of every global batch of one epoch (the same permutation everywhere)."""
    order = np.random.default_rng(seed + epoch).permutation(len(y))
    per_rank = batch_size // size
    steps = len(y) // batch_size
    rows = np.concatenate([order[s * batch_size + rank * per_rank:
                                 s * batch_size + (rank + 1) * per_rank] for s in range(steps)])
    return x[rows], y[rows], per_rank


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="the global batch")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data", default=DEFAULT_DATA)
    args = p.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.batch_size % size:
        raise SystemExit("--batch-size %d is not a multiple of the %d ranks"
                         % (args.batch_size, size))
    x_train, y_train, x_test, y_test = load_digits(args.data)
    keras.utils.set_random_seed(args.seed + rank)  # rank 0's start wins (the callback)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    start = time.time()
    for epoch in range(args.epochs):
        x, y, per_rank = rank_slices(x_train, y_train, epoch, args.batch_size, args.seed, rank,
                                     size)
        history = model.fit(x, y, batch_size=per_rank, epochs=epoch + 1, initial_epoch=epoch,
                            shuffle=False, verbose=0, callbacks=callbacks)
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        if rank == 0:
            print("epoch %d loss %.4f test accuracy %.4f (%.1f s, %s backend)"
                  % (epoch + 1, history.history["loss"][-1], accuracy, time.time() - start,
                     keras.backend.backend()), flush=True)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if rank == 0:
        print("final test accuracy: %.4f (%d ranks)" % (accuracy, size), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
