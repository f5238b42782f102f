"""``hvd.elastic`` for Keras 3, as ``horovod.tensorflow.keras.elastic``: ``KerasState`` (a
model's and optimizer's variables plus picklable attributes, on the TensorFlow and PyTorch
backends), the callbacks that keep it current during ``fit`` (``CommitStateCallback``,
``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``) and ``run``::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, initial_epoch=state.epoch, epochs=epochs, callbacks=callbacks)

    train(state)
"""
import keras

from horovod_cpp.common.elastic import ModelState, ObjectState, State, run  # noqa: F401
from horovod_cpp.common.basics import HorovodInternalError  # noqa: F401
from horovod_cpp.elastic import HostsUpdatedInterrupt  # noqa: F401
from horovod_cpp.keras.backend_ops import backend_ops


class KerasState(ModelState):
    """A Keras model's and optimizer's variables plus any picklable attributes, on the
    running backend (the optimizer's read at each commit, restore and sync: Keras builds them
    at the first step)."""

    def _read(self, var):
        return keras.ops.convert_to_numpy(var.value)

    def _broadcast(self, variables):
        backend_ops().broadcast_variables(variables, 0)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits the state every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()
        self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the number of batches done in this epoch."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the next epoch to run (``fit(initial_epoch=state.epoch)``)."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1


__all__ = ["run", "State", "ObjectState", "KerasState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "HostsUpdatedInterrupt",
           "HorovodInternalError"]
