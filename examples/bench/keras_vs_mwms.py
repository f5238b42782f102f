"""Keras 3 training at 2 ranks: horovod_cpp.keras's DistributedOptimizer in ``model.fit`` against
TensorFlow's own ``tf.distribute.MultiWorkerMirroredStrategy`` (two worker processes on this
host), the same model, global batch and steps, samples/s over the timed steps. Keras 3's
``fit`` does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585: "Attempt to
convert a value (PerReplica...)"), so MWMS runs the custom training loop TensorFlow documents for
it (``strategy.run`` of a ``tf.function`` step, the Keras model and optimizer made in the
strategy's scope).

    .venv-tf/bin/python examples/bench/keras_vs_mwms.py [--runs 3] [--models mlp,cnn]

The driver alternates the two (hvd first in odd runs, MWMS first in even ones) and prints, per
model and run, ``FIGURE KT1 model=<m> run=<i> hvd_sps=... mwms_sps=... ratio=...`` (ratio:
horovod_cpp's samples/s over MWMS's), then the range over the runs. ``--worker hvd|mwms`` is
one rank (the driver starts them: mpirun for hvd, two processes with TF_CONFIG for MWMS).
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def build_model(keras, name):
    if name == "mlp":
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(10)])
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)])


def data(np, name, rows, seed):
    rng = np.random.default_rng(seed)
    shape = (rows, 784) if name == "mlp" else (rows, 32, 32, 3)
    return rng.normal(size=shape).astype("float32"), rng.integers(0, 10, rows).astype("int32")


def timer_callback(keras, skip):
    """A callback that times the steps after the first ``skip`` (tracing, warm-up)."""
    class Timer(keras.callbacks.Callback):
        start = elapsed = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == skip:
                self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            self.elapsed = time.perf_counter() - self.start
    return Timer()


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import keras
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    global_batch, steps, skip = args.batch, args.steps, 5
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    timer = timer_callback(keras, skip)
    if args.worker == "hvd":
        import horovod_cpp.keras as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        x, y = data(np, args.model, global_batch // size * steps, rank)
        keras.utils.set_random_seed(0)
        model = build_model(keras, args.model)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=loss)
        model.fit(x, y, batch_size=global_batch // size, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer])
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        x, y = data(np, args.model, global_batch * steps, 0)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = build_model(keras, args.model)
            opt = keras.optimizers.SGD(0.01)
        per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction=None)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
        batches = iter(strategy.experimental_distribute_dataset(dataset))

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                                  global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def train_step(batch):
            return strategy.run(replica_step, args=batch)

        timer.on_train_begin()
        for step in range(steps):
            timer.on_train_batch_begin(step)
            train_step(next(batches))
        timer.on_train_end()
    if rank == 0:
        sps = global_batch * (steps - skip) / timer.elapsed
        print("SAMPLES_PER_S %.1f" % sps, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_hvd(args, model):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "TF_CPP_MIN_LOG_LEVEL=3",
           sys.executable, HERE, "--worker", "hvd", "--model", model, "--batch", str(args.batch),
           "--steps", str(args.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    return parse(out, "hvd")


def run_mwms(args, model):
    ports = [free_port(), free_port()]
    workers = ["127.0.0.1:%d" % p for p in ports]
    procs = []
    for i in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen(
            [sys.executable, HERE, "--worker", "mwms", "--model", model, "--batch",
             str(args.batch), "--steps", str(args.steps)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    return parse(subprocess.CompletedProcess([], max(p.returncode for p in procs), outs[0], outs[1]),
                 "mwms")


def parse(out, what):
    found = re.search(r"SAMPLES_PER_S ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not found:
        sys.exit("keras_vs_mwms: the %s run failed (exit %s):\n%s\n%s"
                 % (what, out.returncode, out.stdout[-3000:], (out.stderr or "")[-3000:]))
    return float(found.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--batch", type=int, default=128, help="the global batch")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--worker", choices=["hvd", "mwms"])
    p.add_argument("--model", default="mlp")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    ratios = {}
    for run in range(1, args.runs + 1):
        for model in args.models.split(","):
            order = [run_hvd, run_mwms] if run % 2 else [run_mwms, run_hvd]
            got = {f.__name__: f(args, model) for f in order}
            ratio = got["run_hvd"] / got["run_mwms"]
            ratios.setdefault(model, []).append(ratio)
            print("FIGURE KT1 model=%s run=%d hvd_sps=%.1f mwms_sps=%.1f ratio=%.3f"
                  % (model, run, got["run_hvd"], got["run_mwms"], ratio), flush=True)
    for model, r in ratios.items():
        print("FIGURE KT1 model=%s runs=%d ratio_min=%.3f ratio_max=%.3f"
              % (model, len(r), min(r), max(r)), flush=True)


if __name__ == "__main__":
    main()
