"""horovod_cpp.keras on Keras 3 (the backend KERAS_BACKEND names: tensorflow or torch) against
one process on the full batch and hand-computed values."""
import os

import keras
import numpy as np
import pytest

import horovod_cpp.keras as hvd
from conftest import same_on_every_rank

PER_RANK, STEPS, EPOCHS = 4, 3, 2


def dataset():
    rng = np.random.default_rng(7)
    n = PER_RANK * hvd.size() * STEPS
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32") + (x[:, 2] > 1).astype("int32")
    return x, y


def shard(array):
    """This rank's rows: step k's batch on every rank together is the full batch k."""
    b, n, r = PER_RANK, hvd.size(), hvd.rank()
    return np.concatenate([array[k * b * n + r * b:k * b * n + (r + 1) * b] for k in range(STEPS)])


def model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def weights(m):
    return [np.asarray(w) for w in m.get_weights()]


@pytest.mark.parametrize("make_opt", [lambda: keras.optimizers.SGD(0.1, momentum=0.9),
                                      lambda: keras.optimizers.Adam(0.01)],
                         ids=["sgd_momentum", "adam"])
def test_fit_equals_one_process_on_the_full_batch(make_opt):
    x, y = dataset()
    reference = model(0)
    reference.compile(optimizer=make_opt(), loss=loss())
    reference.fit(x, y, batch_size=PER_RANK * hvd.size(), epochs=EPOCHS, shuffle=False, verbose=0)

    m = model(hvd.rank())  # every rank starts elsewhere: the callback makes it rank 0's start
    m.compile(optimizer=hvd.DistributedOptimizer(make_opt()), loss=loss())
    m.fit(shard(x), shard(y), batch_size=PER_RANK, epochs=EPOCHS, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for got, want in zip(weights(m), weights(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_logs, self.lrs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def test_metric_average_callback_averages_every_metric_over_the_ranks():
    x, y = dataset()
    m = model(0)
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss(),
              metrics=["accuracy"])
    raw, averaged = Record(), Record()
    m.fit(shard(x), shard(y), batch_size=PER_RANK, epochs=EPOCHS, shuffle=False, verbose=0,
          callbacks=[raw, hvd.callbacks.MetricAverageCallback(), averaged])
    every = same_on_every_rank(raw.epoch_logs)
    for epoch, logs in enumerate(averaged.epoch_logs):
        for key in ("loss", "accuracy"):
            want = np.mean([rank_logs[epoch][key] for rank_logs in every])
            assert logs[key] == pytest.approx(want, rel=1e-6)
    # and they differ per rank before (the check is not vacuous)
    assert len({round(rank_logs[0]["loss"], 6) for rank_logs in every}) == hvd.size()


def test_learning_rate_warmup_and_schedule():
    x, y = dataset()
    n, base = hvd.size(), 0.08
    m = model(0)
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(base)), loss=loss())
    record = Record()
    m.fit(shard(x), shard(y), batch_size=PER_RANK, epochs=3, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.LearningRateWarmupCallback(base, warmup_epochs=2),
                     hvd.callbacks.LearningRateScheduleCallback(base, 0.5, start_epoch=2),
                     record])
    want = []
    for epoch in range(3):
        for batch in range(STEPS):
            e = epoch + batch / STEPS
            want.append(base / n * (e * (n - 1) / 2 + 1) if epoch < 2 else base * 0.5)
    np.testing.assert_allclose(record.lrs, want, rtol=1e-6)


def test_load_model_wraps_the_optimizer_and_keeps_its_state(tmp_path_factory):
    x, y = dataset()
    m = model(0)
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=loss())
    m.fit(shard(x), shard(y), batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    path = hvd.broadcast_object(str(tmp_path_factory.mktemp("saved") / "m.keras"), 0)
    if hvd.rank() == 0:
        m.save(path)
    hvd.broadcast_object(None, 0, name="saved")
    plain = keras.models.load_model(path)  # anyone can load it: the plain optimizer
    assert isinstance(plain.optimizer, keras.optimizers.Adam)
    assert not hasattr(plain.optimizer, "register_local_source")
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert hasattr(loaded.optimizer, "register_local_source")  # wrapped
    assert int(keras.ops.convert_to_numpy(loaded.optimizer.iterations)) == STEPS
    for got, want in zip(weights(loaded), weights(m)):
        np.testing.assert_array_equal(got, want)
    # it still reduces: training on each rank's own shard keeps the ranks equal
    loaded.fit(shard(x), shard(y), batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    every = same_on_every_rank([w.tolist() for w in weights(loaded)])
    assert all(w == every[0] for w in every)


def test_keras_state_commit_restore_and_sync():
    m = model(hvd.rank())
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss())
    state = hvd.elastic.KerasState(m, epoch=hvd.rank())
    committed = weights(m)
    m.set_weights([w + 1.0 for w in committed])
    state.restore()
    for got, want in zip(weights(m), committed):
        np.testing.assert_array_equal(got, want)
    state.sync()
    every = same_on_every_rank([w.tolist() for w in weights(m)])
    assert all(w == every[0] for w in every) and state.epoch == 0


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    with pytest.raises(ValueError, match="Keras 3 optimizer"):
        hvd.DistributedOptimizer(object())
    assert os.environ.get("KERAS_BACKEND", "tensorflow") == keras.backend.backend()
