"""Horovod's Keras callbacks, for Keras 3 on its TensorFlow and PyTorch backends:
``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``,
``LearningRateWarmupCallback`` and ``LearningRateScheduleCallback``."""
import numpy as np

import keras

from horovod_cpp.common.basics import Average, _core
from horovod_cpp.common.objects import allreduce_array
from horovod_cpp.common.process_sets import global_process_set
from horovod_cpp.keras.backend_ops import backend_ops


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from ``root_rank``'s model and optimizer: at the start of
    training, the model's variables and the optimizer's (built first, so its slots exist and
    every rank's first step starts alike) are broadcast from ``root_rank``. A model that is
    not built yet (a subclassed model before its first call) is broadcast after its first
    batch instead, as Horovod does. ``device`` is accepted for Horovod's signature."""

    def __init__(self, root_rank=0, device="", process_set=global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self.broadcast_done = False

    def _broadcast(self):
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built and model.trainable_variables:
            optimizer.build(model.trainable_variables)
        variables = list(model.variables)
        if optimizer is not None:
            variables += list(optimizer.variables)
        backend_ops().broadcast_variables(variables, self.root_rank, self.process_set)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        if not self.broadcast_done and self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replaces each metric in the logs with its average over the
    ranks (one allreduce for all of them, keys in sorted order), so rank 0's logs, its
    checkpoints' and early stopping's decisions speak for the whole job. Place it before the
    callbacks that read the metrics."""

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = allreduce_array(values, Average, "keras.metric_average", self.process_set)
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


def _set_lr(optimizer, lr):
    try:
        optimizer.learning_rate = lr
    except TypeError as e:
        raise ValueError("horovod_cpp.keras's learning rate callbacks set the optimizer's "
                         "learning rate, which a LearningRateSchedule does not allow: give the "
                         "optimizer a float learning rate (%s)" % e) from e


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until
    ``end_epoch`` (exclusive; None: the end). ``multiplier``: a number or a function of the
    epoch; ``staircase=False`` moves it every batch, with the fractional epoch
    ``epoch + batch / steps_per_epoch`` (``steps_per_epoch``: from ``fit`` when None).
    ``initial_lr`` is the rate already scaled for the job's size. ``momentum_correction`` is
    accepted for Horovod's signature (Keras 3 compiles the momentum into its step)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        if initial_lr is None:
            raise ValueError("initial_lr is required (the learning rate scaled for the job)")
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = None
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def _steps(self):
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            raise ValueError("%s(staircase=False) needs steps_per_epoch (fit was not given "
                             "steps either)" % type(self).__name__)
        return steps

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch):
        _set_lr(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self._active(epoch) and self.staircase:
            self._adjust(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch is None or self.staircase or not self._active(self.current_epoch):
            return
        self._adjust(self.current_epoch + float(batch) / self._steps())

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(np.asarray(keras.ops.convert_to_numpy(
                self.model.optimizer.learning_rate)))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from ``initial_lr / size`` up to ``initial_lr`` over the first
    ``warmup_epochs`` epochs, every batch (Goyal et al., "Accurate, Large Minibatch SGD"):
    ``lr = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)`` at the fractional
    epoch."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            size = _core.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1:
            _set_lr(self.model.optimizer, self.initial_lr)
            if self.verbose and _core.rank() == 0:
                print("\nEpoch %d: finished gradual learning rate warmup to %g."
                      % (epoch + 1, self.initial_lr))


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
