"""Lifecycle and topology of ``horovod_cpp.tensorflow``, as Horovod's ``horovod.tensorflow``
has them: horovod_cpp.common.basics (one runtime per process, shared with horovod_cpp.torch),
with TensorFlow's and Keras's frames skipped in the call sites that error messages name (a
gradient's allreduce: the user's ``tape.gradient`` or ``model.fit``). Also Horovod's
``*_op`` functions: the topology as a tensor, read when the graph runs (so a ``tf.function``
traced before an elastic resize sees the new size).
"""
import tensorflow as tf

from horovod_cpp.common import basics as _common
from horovod_cpp.common.basics import *  # noqa: F401,F403
from horovod_cpp.common.basics import __all__ as _common_all
from horovod_cpp.common.basics import _core, _host_backend  # noqa: F401

_common.skip_call_sites_in(tf)
try:  # Keras 3 is a package of its own; its frames (model.fit's train step) are not the user's
    import keras as _keras
    _common.skip_call_sites_in(_keras)
except ImportError:
    pass


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    return _core.size() == _core.local_size() * _core.cross_size()


def _topology_op(query, name):
    if tf.executing_eagerly():
        return tf.constant(query(), dtype=tf.int32, name=name)
    out = tf.py_function(lambda: tf.constant(query(), dtype=tf.int32), [], tf.int32, name=name)
    out.set_shape([])
    return out


def size_op(process_set_id=0, name=None):
    """The number of ranks (of the process set), as an int32 tensor read when it runs."""
    if process_set_id:
        return _topology_op(lambda: len(_core.process_set_info(process_set_id)[0]), name)
    return _topology_op(_core.size, name)


def rank_op(name=None):
    """This rank, as an int32 tensor read when it runs."""
    return _topology_op(_core.rank, name)


def local_size_op(name=None):
    return _topology_op(_core.local_size, name)


def local_rank_op(name=None):
    return _topology_op(_core.local_rank, name)


def process_set_included_op(process_set_id=0, name=None):
    """1 if this rank belongs to the process set, else 0 (int32)."""
    return _topology_op(lambda: int(_core.process_set_info(process_set_id)[2]), name)


__all__ = list(_common_all) + ["is_homogeneous", "size_op", "rank_op", "local_size_op",
                               "local_rank_op", "process_set_included_op"]
