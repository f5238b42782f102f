"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient`` returns the gradients
reduced over the ranks, as Horovod's. The dense gradients of one call travel as one grouped
allreduce (negotiated and fused together; ``num_groups``/``groups`` split it), the
``tf.IndexedSlices`` ones are gathered (or densified with ``sparse_as_dense``): the shared
horovod_cpp.common.reducer with TensorFlow's operations (``TF_GRADIENT_OPS``)."""
import tensorflow as tf

from horovod_cpp.common.ops import handle_average_backwards_compatibility
from horovod_cpp.common.process_sets import global_process_set
from horovod_cpp.common.reducer import DistributedReducer, GradientOps
from horovod_cpp.tensorflow.basics import Average
from horovod_cpp.tensorflow.collectives import grouped_allreduce
from horovod_cpp.tensorflow.compression import Compression


def _grouped_allreduce(tensors, op, prescale, postscale, name, compression, process_set):
    return grouped_allreduce(tensors, op=op, prescale_factor=prescale,
                             postscale_factor=postscale, name=name, compression=compression,
                             process_set=process_set)


TF_GRADIENT_OPS = GradientOps(
    _grouped_allreduce, is_sparse=lambda g: isinstance(g, tf.IndexedSlices),
    densify=tf.convert_to_tensor, scale=lambda g, factor: g * tf.cast(factor, g.dtype),
    none_compression=Compression.none)


class _DistributedGradientTape(tf.GradientTape):
    """The class every DistributedGradientTape's own class derives from, with the tape's."""

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        reducer = self._hvd_reducer
        if isinstance(sources, dict) or not isinstance(sources, (list, tuple)):
            flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
            return tf.nest.pack_sequence_as(grads, reducer.reduce(flat_grads, flat_sources))
        return reducer.reduce(grads, sources)

    def register_local_source(self, var):
        """Keeps this variable's gradient local (not reduced)."""
        self._hvd_reducer.register_local_source(var)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wraps ``gradtape`` (recorded already, or used as a context manager afterwards):
    ``gradient`` returns the gradients reduced over the ranks of ``process_set``. The result
    is an instance of the tape's own class (``isinstance(tape, tf.GradientTape)`` holds).

    ``compression``: ``hvd.Compression.none``/``fp16``/``bf16``; ``sparse_as_dense``: reduce
    ``tf.IndexedSlices`` gradients densely; ``op``: Average (default) or Sum;
    ``num_groups``/``groups``: how the dense gradients are grouped into fused allreduces
    (default: all in one). ``device_*`` are accepted for Horovod's signature."""
    op = handle_average_backwards_compatibility(op, None)
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__ = gradtape.__dict__  # the same recording: entering either enters both
    tape._hvd_reducer = DistributedReducer(TF_GRADIENT_OPS, "DistributedGradientTape", compression,
                                           sparse_as_dense, op, gradient_predivide_factor,
                                           num_groups, groups, process_set,
                                           scale_local_gradients)
    return tape


__all__ = ["DistributedGradientTape", "TF_GRADIENT_OPS"]
