"""``import horovod_cpp.keras as hvd`` (also ``horovod_cpp.tensorflow.keras``): Horovod's Keras
API for Keras 3, on its TensorFlow and PyTorch backends::

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

``Compression`` is the running backend's (``none``, ``fp16``, ``bf16``). The topology and
lifecycle functions are horovod_cpp's one runtime's, whichever backend runs.
"""
from horovod_cpp.common.basics import (Adasum, Average, HorovodInternalError,  # noqa: F401
                                       Max, Min, Product, Sum, ccl_built, cross_rank, cross_size,
                                       gloo_built, gloo_enabled, init, is_initialized,
                                       local_rank, local_size, mpi_built, mpi_enabled,
                                       mpi_threads_supported, nccl_built, rank, shutdown, size,
                                       start_timeline, stop_timeline)
from horovod_cpp.common.objects import allgather_object, broadcast_object  # noqa: F401
from horovod_cpp.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                             global_process_set, remove_process_set)
from horovod_cpp.keras import callbacks, elastic  # noqa: F401
from horovod_cpp.keras.backend_ops import backend_ops as _backend_ops
from horovod_cpp.keras.optimizer import DistributedOptimizer, load_model  # noqa: F401


def __getattr__(name):
    # The running backend's codecs, looked up when first used (the backend is Keras's choice).
    if name == "Compression":
        return _backend_ops().compression
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def broadcast_global_variables(root_rank, model=None):
    """Horovod's TF1 helper has no meaning without a session; broadcast a model's variables
    with BroadcastGlobalVariablesCallback or ``hvd.broadcast_variables``."""
    raise NotImplementedError("broadcast_global_variables needs a TF1 session; use "
                              "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)")
