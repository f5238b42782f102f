"""The TensorFlow lane's launcher tests (run by the TensorFlow lane's Python, not under
mpirun): ranks of TensorFlow and torch in one job agree, or disagree with a clear error on
every rank; hvdrun (mpirun and Gloo) runs the Keras example; HorovodRunner runs a Keras
train() on the local Spark session; the timeline names TensorFlow's operations; elastic Keras
training survives a killed rank."""
import json
import os
import socket
import subprocess
import sys

import cloudpickle
import pytest

from horovod_cpp.spark import HorovodRunner
from test_elastic import worker_pids

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.deadline(240)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MIXED = os.path.join(ROOT, "tests", "tensorflow", "programs", "mixed_frameworks.py")
KERAS_TRAIN = os.path.join(ROOT, "examples", "keras_train.py")
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")


def run(cmd, timeout=180, env=ENV):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout


def mixed(tf_args, torch_args):
    """mpirun: rank 0 on TensorFlow, rank 1 on torch."""
    return run(MPIRUN + ["-np", "1", sys.executable, MIXED, "--framework", "tensorflow"] + tf_args
               + [":", "-np", "1", sys.executable, MIXED, "--framework", "torch"] + torch_args)


def test_tensorflow_and_torch_ranks_reduce_together():
    code, out = mixed([], [])
    assert code == 0, out
    assert "rank 0 tensorflow result [2.0, 2.0]" in out and "rank 1 torch result [2.0, 2.0]" in out


@pytest.mark.parametrize("tf_args,torch_args,what", [
    (["--dtype", "float32"], ["--dtype", "float64"], "data types"),
    (["--rows", "2"], ["--rows", "3"], "shapes")])
def test_a_mismatch_between_tensorflow_and_torch_ranks_is_a_clear_error_on_both(
        tf_args, torch_args, what):
    code, out = mixed(tf_args, torch_args)
    assert code != 0, out
    # (the two ranks' lines may reach mpirun's output interleaved: no line-by-line parse)
    message = "error: allreduce 'allreduce.mixed': mismatched %s" % what
    for rank, framework in ((0, "tensorflow"), (1, "torch")):
        assert "rank %d %s %s" % (rank, framework, message) in out, out


@pytest.mark.parametrize("launcher", [[], ["--gloo"]], ids=["mpirun", "gloo"])
def test_hvdrun_runs_the_keras_example(launcher):
    code, out = run([sys.executable, "-m", "horovod_cpp.runner", "-np", "2"] + launcher +
                    [sys.executable, KERAS_TRAIN, "--epochs", "3"])
    assert code == 0, out
    assert "final test accuracy" in out and "(2 ranks)" in out, out


def keras_train(epochs):
    import numpy as np
    import keras
    import horovod_cpp.keras as hvd
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=epochs, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    weights = [w.tolist() for w in model.get_weights()]
    result = (hvd.rank(), hvd.size(), weights)
    hvd.shutdown()
    return result


def test_horovod_runner_runs_a_keras_train_function(spark):
    results = HorovodRunner(np=2).run(keras_train, epochs=2)
    rank, size, weights = results
    assert (rank, size) == (0, 2)
    assert len(weights) == 2 and len(weights[0]) == 4


def test_the_timeline_names_tensorflow_ops(tmp_path):
    timeline = tmp_path / "timeline.json"
    env = dict(ENV, HOROVOD_TIMELINE=str(timeline))
    code, out = run(MPIRUN + ["-np", "2", "-x", "HOROVOD_TIMELINE", sys.executable, MIXED,
                              "--framework", "tensorflow"], env=env)
    assert code == 0, out
    events = json.loads(timeline.read_text())
    names = {e.get("args", {}).get("name") for e in events if isinstance(e, dict)} | \
        {e.get("name") for e in events if isinstance(e, dict)}
    assert any(n and "allreduce.mixed" in n for n in names), sorted(n for n in names if n)[:40]


def test_elastic_keras_fit_survives_a_killed_rank(tmp_path):
    """hvdrun's elastic mode, 3 workers on this host's three names, KerasState and the elastic
    callbacks: one worker killed mid-training, the other two roll back to the last commit,
    agree on rank 0's weights and finish the epochs."""
    import re
    import signal
    import time
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n%s:1\n" % socket.gethostname())
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)
    program = os.path.join(ROOT, "tests", "tensorflow", "programs", "keras_elastic.py")
    job = subprocess.Popen([sys.executable, "-m", "horovod_cpp.runner", "-np", "3", "--min-np",
                            "2", "--max-np", "3", "--host-discovery-script", str(script),
                            sys.executable, program, "--epochs", "5", "--step-delay", "0.02"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    out, killed = [], False
    deadline = time.monotonic() + 200
    for line in job.stdout:
        out.append(line.rstrip("\n"))
        if not killed and "epoch 2/5  3 ranks" in line:
            time.sleep(0.5)
            for pid in worker_pids("127.0.0.1:0", "keras_elastic.py"):
                os.kill(pid, signal.SIGKILL)
            killed = True
        if time.monotonic() > deadline:
            job.kill()
            break
    text = "\n".join(out)
    assert job.wait(30) == 0, text
    assert killed, text
    checks = [l for l in out if "reset check: rank" in l and "of 2 holds" in l]
    assert len(checks) == 2 and all(l.endswith("True") for l in checks), text
    done = re.search(r"done: 5 epochs, 2 ranks at the end, 1 resets, final loss ([0-9.]+)", text)
    assert done and float(done.group(1)) < 0.5, text

