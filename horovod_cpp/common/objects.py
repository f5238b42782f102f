"""Values sent between ranks with no framework: ``broadcast_object`` and ``allgather_object``
on NumPy buffers handed straight to the core (cloudpickle; the names ``broadcast.<name>.sz``/
``.t`` and ``allgather.<name>.sz``/``.t``, as horovod_cpp.torch's), and ``allreduce_array`` of
a NumPy array. What every face's ``broadcast_object``, the elastic states and Keras's metric
averaging use."""
import cloudpickle
import numpy as np

from horovod_cpp.common.basics import _core, rank
from horovod_cpp.common.ops import op_name, process_set_id
from horovod_cpp.common.process_sets import global_process_set

_CODES = _core.DTYPES


def _view(array):
    return (array.ctypes.data, _CODES[array.dtype.name], array.shape, _core.CPU_DEVICE, 0)


def _broadcast_(array, root_rank, name, ps):
    handle = _core.broadcast_async(_view(array), _view(array), int(root_rank),
                                   op_name("broadcast", name), ps)
    _core.wait(handle)


def _allgather(array, name, ps):
    handle = _core.allgather_async(_view(array), op_name("allgather", name), ps)
    buffer = _core.wait_outputs(handle)[0][0]
    if buffer is None:
        return np.zeros(0, array.dtype)
    return np.frombuffer(buffer, dtype=array.dtype).copy()


def allreduce_array(array, op, name=None, process_set=global_process_set):
    """The reduction (``op``: hvd.Average, Sum, ...) of a NumPy array over the set, as a new
    array."""
    source = np.ascontiguousarray(array)
    out = np.empty_like(source)
    handle = _core.allreduce_async(_view(source), _view(out), op_name("allreduce", name), op, 1.0,
                                   1.0, process_set_id(process_set))
    _core.wait(handle)
    return out


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Sends any picklable ``obj`` from ``root_rank`` to every rank of the set; returns it."""
    name = name or type(obj).__name__
    ps = process_set_id(process_set)
    size = np.zeros(1, np.int64)
    if rank() == root_rank:
        payload = np.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=np.uint8)
        size[0] = payload.size
    _broadcast_(size, root_rank, name + ".sz", ps)
    if rank() != root_rank:
        payload = np.empty(int(size[0]), np.uint8)
    _broadcast_(payload, root_rank, name + ".t", ps)
    return obj if rank() == root_rank else cloudpickle.loads(payload.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Gathers any picklable ``obj`` from every rank of the set; the list, in rank order."""
    name = name or type(obj).__name__
    ps = process_set_id(process_set)
    payload = np.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=np.uint8)
    sizes = _allgather(np.array([payload.size], np.int64), name + ".sz", ps).tolist()
    gathered = _allgather(payload, name + ".t", ps)
    objects, start = [], 0
    for size in sizes:
        objects.append(cloudpickle.loads(gathered[start:start + size].tobytes()))
        start += size
    return objects
