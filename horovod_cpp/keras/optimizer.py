"""Keras 3's ``DistributedOptimizer`` and ``load_model``.

``DistributedOptimizer(opt)`` returns an optimizer of a class derived from ``opt``'s (the same
config, so the same hyperparameters) whose ``apply`` (and so ``apply_gradients`` and
``model.fit``'s train step) reduces the gradients over the ranks first, with the shared
reducer on the running backend's operations (horovod_cpp.keras.backend_ops). The derived class
keeps its base's name and module, so a model saved with it loads anywhere as the plain
optimizer; ``load_model`` loads it with the optimizer wrapped again, its state included.
"""
import keras

from horovod_cpp.common.basics import Average
from horovod_cpp.common.process_sets import global_process_set
from horovod_cpp.common.reducer import DistributedReducer
from horovod_cpp.keras.backend_ops import backend_ops


class _DistributedOptimizerMixin:
    """What the derived class adds: the reduction in ``apply``."""
    _hvd_settings = None  # the keyword arguments of DistributedOptimizer, set per class

    def _hvd_reducer(self):
        reducer = self.__dict__.get("_hvd_reducer_obj")
        if reducer is None:
            settings = dict(type(self)._hvd_settings)
            reducer = DistributedReducer(backend_ops().gradient_ops, **settings)
            self.__dict__["_hvd_reducer_obj"] = reducer
        return reducer

    def apply(self, grads, trainable_variables=None):
        variables = trainable_variables
        if variables is None and self.built:
            variables = self._trainable_variables
        grads = self._hvd_reducer().reduce(list(grads), variables)
        return super().apply(grads, trainable_variables)

    def register_local_source(self, var):
        """Keeps this variable's gradient local (not reduced)."""
        self._hvd_reducer().register_local_source(var)


def _wrapped_class(cls, settings):
    if issubclass(cls, _DistributedOptimizerMixin):
        cls = next(c for c in cls.__mro__[1:] if not issubclass(c, _DistributedOptimizerMixin))
    return type(cls.__name__, (_DistributedOptimizerMixin, cls),
                {"_hvd_settings": settings, "__module__": cls.__module__,
                 "__doc__": cls.__doc__})


def _settings(name, compression, sparse_as_dense, gradient_predivide_factor, op,
              backward_passes_per_step, num_groups, groups, process_set, scale_local_gradients):
    if backward_passes_per_step != 1:
        raise ValueError(
            "DistributedOptimizer(backward_passes_per_step=%d): horovod_cpp.keras reduces every "
            "step's gradients; for local accumulation give the Keras optimizer "
            "gradient_accumulation_steps=%d" % (backward_passes_per_step, backward_passes_per_step))
    return {"name": name, "compression": compression, "sparse_as_dense": sparse_as_dense,
            "op": op, "gradient_predivide_factor": gradient_predivide_factor,
            "num_groups": num_groups, "groups": groups, "process_set": process_set,
            "scale_local_gradients": scale_local_gradients}


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=None, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A Keras 3 optimizer like ``optimizer`` (made again from its config: its state, if any,
    is not carried) that reduces the gradients over the ranks of ``process_set`` before
    applying them. ``compression``: ``hvd.Compression.none``/``fp16``/``bf16`` of the running
    backend; ``op``: Average (default) or Sum; ``num_groups``/``groups``: how the gradients are
    grouped into fused allreduces (default: all in one); ``sparse_as_dense``: reduce sparse
    gradients densely. ``device_*`` and ``average_aggregated_gradients`` are accepted for
    Horovod's signature."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError("DistributedOptimizer expects a Keras 3 optimizer "
                         "(keras.optimizers.Optimizer), got %s" % type(optimizer).__name__)
    settings = _settings(name or "Distributed%s" % type(optimizer).__name__, compression,
                         sparse_as_dense, gradient_predivide_factor, op,
                         backward_passes_per_step, num_groups, groups, process_set,
                         scale_local_gradients)
    backend_ops()  # an unsupported backend fails here, not at the first step
    return _wrapped_class(type(optimizer), settings).from_config(optimizer.get_config())


def _optimizer_classes():
    classes = {}
    for attr in dir(keras.optimizers):
        cls = getattr(keras.optimizers, attr)
        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer):
            classes[cls.__name__] = cls
    return classes


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None,
               **kwargs):
    """``keras.models.load_model`` with the model's optimizer made a DistributedOptimizer (its
    saved state restored). ``custom_optimizers``: optimizer classes of your own the file may
    name; ``custom_objects``: passed on; ``compression``: the wrapped optimizer's."""
    classes = _optimizer_classes()
    for cls in custom_optimizers or []:
        classes[cls.__name__] = cls
    settings = _settings(None, compression, False, 1.0, Average, 1, 0, None, global_process_set,
                         True)
    objects = {}
    for class_name, cls in classes.items():
        objects[class_name] = _wrapped_class(cls, dict(settings, name="Distributed" + class_name))
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects, **kwargs)


__all__ = ["DistributedOptimizer", "load_model"]
