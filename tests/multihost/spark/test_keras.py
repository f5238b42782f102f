"""HorovodRunner running a Keras 3 train() on the test bed's Spark cluster (2 workers x 2 cores,
the driver on hvd-h1), started from the TensorFlow lane (tests/multihost/run.sh): 4 ranks, two
on each worker host, training equal to one process on the full batch (computed here, at the
driver, with no communication)."""
import socket
import sys

import cloudpickle
import numpy as np
import pytest

from conftest import WORKERS, start_session
from horovod_cpp.spark import HorovodRunner

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.deadline(300)
PER_RANK, STEPS, RANKS = 4, 5, 4


@pytest.fixture(scope="module")
def cluster():
    session = start_session("horovod_cpp Keras tests")
    yield session
    session.stop()


def problem():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(PER_RANK * RANKS * STEPS, 5)).astype("float32")
    y = (x[:, 0] - x[:, 1] > 0).astype("int32")
    return x, y


def make_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"),
                             keras.layers.Dense(2)])


def keras_train():
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import horovod_cpp.keras as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x, y = problem()
    rows = np.concatenate([np.arange(k * PER_RANK * n + r * PER_RANK,
                                     k * PER_RANK * n + (r + 1) * PER_RANK) for k in range(STEPS)])
    model = make_model(keras, r)  # rank 0's start wins (the callback)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[rows], y[rows], batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    hosts = hvd.allgather_object(socket.gethostname())
    result = ([w.tolist() for w in model.get_weights()], sorted(hosts), keras.backend.backend())
    hvd.shutdown()
    return result


def test_horovod_runner_trains_keras_across_the_worker_hosts(cluster):
    import keras
    weights, hosts, backend = HorovodRunner(np=RANKS).run(keras_train)
    assert hosts == sorted([WORKERS[0]] * 2 + [WORKERS[1]] * 2)
    assert backend == keras.backend.backend()
    x, y = problem()
    reference = make_model(keras, 0)
    reference.compile(optimizer=keras.optimizers.SGD(0.2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    reference.fit(x, y, batch_size=PER_RANK * RANKS, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(weights, reference.get_weights()):
        np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-5)
