"""What a collective costs from TensorFlow, eagerly and inside tf.function, against the same
allreduce from horovod_cpp.torch in the same run (same bytes, same job).

    mpirun -np 2 .venv-tf/bin/python examples/bench/tf_op_latency.py [--blocks 5] [--reps 200]

Prints, per size, ``FIGURE TF1 size=<bytes> path=<eager|function|torch> p50_us=...`` and the
ratio of each TensorFlow path to torch's; the paths alternate block by block so the machine's
drift falls on all of them.
"""
import argparse
import statistics
import time

import numpy as np
import tensorflow as tf
import torch

import horovod_cpp.tensorflow as hvd
import horovod_cpp.torch as hvd_torch


def block(fn, x, reps):
    fn(x)  # warm-up (the response cache; tf.function's trace)
    start = time.perf_counter()
    for _ in range(reps):
        fn(x)
    return (time.perf_counter() - start) * 1e6 / reps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--sizes", default="4096,4194304", help="bytes, comma-separated")
    args = p.parse_args()
    hvd.init()
    for size in [int(s) for s in args.sizes.split(",")]:
        n = size // 4
        eager_x = tf.constant(np.ones(n, np.float32))
        torch_x = torch.ones(n)
        in_function = tf.function(lambda t: hvd.allreduce(t, name="bench.fn"))
        paths = {
            "eager": (lambda t: hvd.allreduce(t, name="bench.eager"), eager_x),
            "function": (in_function, eager_x),
            "torch": (lambda t: hvd_torch.allreduce(t, name="bench.torch"), torch_x),
        }
        times = {name: [] for name in paths}
        for b in range(args.blocks):
            order = list(paths) if b % 2 == 0 else list(reversed(list(paths)))
            for name in order:
                fn, x = paths[name]
                times[name].append(block(fn, x, args.reps))
        if hvd.rank() == 0:
            p50 = {name: statistics.median(t) for name, t in times.items()}
            for name in paths:
                print("FIGURE TF1 size=%d path=%s p50_us=%.1f ratio_to_torch=%.2f"
                      % (size, name, p50[name], p50[name] / p50["torch"]), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
