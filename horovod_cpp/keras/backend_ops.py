"""What horovod_cpp.keras needs from the framework under Keras 3, chosen by
``keras.backend.backend()`` when first asked: TensorFlow's operations (horovod_cpp.tensorflow)
or PyTorch's (horovod_cpp.torch). JAX is not supported: its train step is a pure function
traced by ``jax.jit``, with no place for an operation of the host's."""
import functools

import keras

from horovod_cpp.common.process_sets import global_process_set


class BackendOps:
    """One framework's operations for horovod_cpp.keras: ``gradient_ops`` (the shared
    reducer's), ``compression`` (its codecs), ``broadcast_variables(variables, root_rank,
    process_set)`` and ``name``."""

    def __init__(self, name, gradient_ops, compression, broadcast_variables):
        self.name = name
        self.gradient_ops = gradient_ops
        self.compression = compression
        self.broadcast_variables = broadcast_variables


def _tensorflow():
    from horovod_cpp.tensorflow.collectives import broadcast_
    from horovod_cpp.tensorflow.compression import Compression
    from horovod_cpp.tensorflow.gradient_tape import TF_GRADIENT_OPS

    def broadcast_variables(variables, root_rank, process_set=global_process_set):
        broadcast_(variables, root_rank, name="keras.broadcast_variables",
                   process_set=process_set)
    return BackendOps("tensorflow", TF_GRADIENT_OPS, Compression, broadcast_variables)


def _torch():
    import torch

    from horovod_cpp.common.reducer import GradientOps
    from horovod_cpp.torch.collectives import broadcast_async_, grouped_allreduce
    from horovod_cpp.torch.compression import Compression
    from horovod_cpp.torch.tensor_bridge import synchronize

    def reduce(tensors, op, prescale, postscale, name, compression, process_set):
        return grouped_allreduce([t.detach() for t in tensors], name=name,
                                 compression=compression, op=op, prescale_factor=prescale,
                                 postscale_factor=postscale, process_set=process_set)

    def broadcast_variables(variables, root_rank, process_set=global_process_set):
        # Keras's torch variables hold a torch Parameter (``.value``): broadcast into it.
        handles = [broadcast_async_(v.value.data, root_rank,
                                    "keras.broadcast_variables.%d" % i, process_set=process_set)
                   for i, v in enumerate(variables)]
        for handle in handles:
            synchronize(handle)

    ops = GradientOps(reduce, is_sparse=lambda g: g.is_sparse, densify=lambda g: g.to_dense(),
                      scale=lambda g, factor: g * factor, none_compression=Compression.none)
    del torch
    return BackendOps("torch", ops, Compression, broadcast_variables)


@functools.lru_cache(maxsize=None)
def backend_ops():
    """The running Keras backend's operations (a clear error for one that is not supported)."""
    name = keras.backend.backend()
    if name == "tensorflow":
        return _tensorflow()
    if name == "torch":
        return _torch()
    raise NotImplementedError(
        "horovod_cpp.keras runs on Keras's TensorFlow and PyTorch backends; this job's is %r "
        "(set KERAS_BACKEND=tensorflow or torch before importing keras)" % name)


__all__ = ["BackendOps", "backend_ops"]
