"""The bridge between TensorFlow tensors and ``horovod_cpp._core``, which never links
TensorFlow.

Eagerly, a CPU tensor travels to the core as the address of its own buffer (DLPack, no copy),
and the result is a 64-byte-aligned NumPy buffer that the core writes and TensorFlow adopts
(DLPack, no copy; a copy where DLPack cannot carry the dtype: bfloat16). Inside a
``tf.function`` the same eager code runs as a ``tf.py_function`` op: no TensorFlow op is
compiled, so a TensorFlow upgrade never needs horovod_cpp rebuilt. What that costs: each op
holds the GIL around its enqueue, blocks one of TensorFlow's inter-op threads until it
completes, and cannot run under XLA (``jit_compile=True``, a clear error) or be saved in a
SavedModel. The ops of one ``tf.function`` run in program order (py_function ops are
stateful), so every rank enqueues them in the same order.
"""
import re

import numpy as np
import tensorflow as tf

from horovod_cpp.tensorflow.basics import _core

_CODES = _core.DTYPES
TF_TO_CODE = {
    tf.uint8: _CODES["uint8"],
    tf.int8: _CODES["int8"],
    tf.int16: _CODES["int16"],
    tf.int32: _CODES["int32"],
    tf.int64: _CODES["int64"],
    tf.float16: _CODES["float16"],
    tf.bfloat16: _CODES["bfloat16"],
    tf.float32: _CODES["float32"],
    tf.float64: _CODES["float64"],
    tf.bool: _CODES["bool"],
}
CODE_TO_TF = {code: dtype for dtype, code in TF_TO_CODE.items()}
CPU_DEVICE = _core.CPU_DEVICE
_ALIGN = 64  # TensorFlow adopts a buffer without a copy only when it is this aligned


def _supported(allow_bool):
    return ", ".join(t.name for t in TF_TO_CODE if allow_bool or t != tf.bool)


def check_tensor(tensor, op, allow_bool=False):
    """``tensor`` as a tf.Tensor (a tf.Variable is read, a list or array converted); a clear
    error for a type the core does not reduce."""
    if isinstance(tensor, tf.IndexedSlices):
        raise ValueError("%s does not take tf.IndexedSlices (allreduce does: it gathers their "
                         "values and indices; or convert them with tf.convert_to_tensor)" % op)
    if isinstance(tensor, tf.SparseTensor):
        raise ValueError("%s does not take tf.SparseTensor; convert it with "
                         "tf.sparse.to_dense" % op)
    t = tf.convert_to_tensor(tensor)
    if t.dtype not in TF_TO_CODE or (t.dtype == tf.bool and not allow_bool):
        raise ValueError("Tensor type %s is not supported by %s; supported types: %s"
                         % (t.dtype.name, op, _supported(allow_bool)))
    return t


def host_array(tensor):
    """The tensor's data as a C-contiguous NumPy array: its own buffer where TensorFlow lends
    it (a CPU tensor), else a copy (bfloat16, a GPU tensor)."""
    try:
        array = np.from_dlpack(tensor)
    except (BufferError, TypeError, RuntimeError, ValueError):
        array = tensor.numpy()
    # (np.ascontiguousarray would make a 0-d array 1-d)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def empty(shape, dtype):
    """An uninitialized, 64-byte-aligned NumPy array of TensorFlow dtype ``dtype``."""
    np_dtype = np.dtype(dtype.as_numpy_dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start:start + nbytes].view(np_dtype).reshape(shape)


def to_tensor(array, dtype):
    """A tf.Tensor over ``array``: adopted without a copy where DLPack carries the dtype."""
    try:
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    except (BufferError, TypeError, RuntimeError, ValueError, AttributeError):
        return tf.convert_to_tensor(array, dtype=dtype)


def describe(array, dtype):
    """(data pointer, dtype code, shape, device, stream) for the core."""
    return (array.ctypes.data, TF_TO_CODE[dtype], array.shape, CPU_DEVICE, 0)


def from_output(raw, dtype):
    """A tf.Tensor from one of the core's outputs (buffer, dtype code, shape, ...)."""
    buffer, shape = raw[0], raw[2]
    out = empty(shape, dtype)
    if buffer is not None and out.size:
        np.copyto(out.reshape(-1).view(np.uint8),
                  np.frombuffer(buffer, dtype=np.uint8, count=out.nbytes))
    return to_tensor(out, dtype)


def _in_xla_context():
    try:
        from tensorflow.python.ops import control_flow_util
        return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):
        return False


_INTERNAL_ERROR = "HorovodInternalError: "


def internal_error_message(error):
    """The message of a HorovodInternalError raised by one of these ops inside a
    ``tf.function``: TensorFlow hands it to Python as a ``tf.errors.UnknownError`` whose message
    names it (as Horovod's compiled ops' errors arrive). None for any other exception."""
    if isinstance(error, tf.errors.OpError) and _INTERNAL_ERROR in (error.message or ""):
        return error.message.split(_INTERNAL_ERROR, 1)[1].split("\n", 1)[0]
    return None


def gradient_may_be_recorded():
    """Whether an op made now may be differentiated: inside a graph, or eagerly under a
    GradientTape. Eagerly without one, the collectives skip ``tf.custom_gradient`` (which
    costs ~150 us a call here, most of an eager call's overhead)."""
    if not tf.executing_eagerly():
        return True
    try:
        from tensorflow.python.eager import record
        return record.could_possibly_record()
    except (ImportError, AttributeError):
        return True


def _op_name(name):
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", name or "horovod_cpp")


def run(kernel, inputs, output_dtypes, output_shapes, name):
    """``kernel(*tensors) -> [tensors]`` eagerly, or inside a graph as one ``tf.py_function``
    op whose outputs get ``output_shapes`` (None: unknown)."""
    if tf.executing_eagerly():
        return kernel(*inputs)
    if _in_xla_context():
        raise ValueError(
            "horovod_cpp's TensorFlow collectives cannot run inside an XLA-compiled function "
            "(%s): compile the model with jit_compile=False (model.compile(..., "
            "jit_compile=False), tf.function(jit_compile=False))" % name)
    outputs = tf.py_function(kernel, list(inputs), list(output_dtypes), name=_op_name(name))
    for out, shape in zip(outputs, output_shapes):
        if shape is not None:
            out.set_shape(shape)
    return outputs
