"""The bridge between torch tensors and ``horovod_cpp._core``: a tensor travels to the core as
(data pointer, dtype code, shape, device, stream), and this module keeps it alive in
``_handle_map`` until its operation's handle is synchronized, so the extension never links
PyTorch. Also the checks every collective makes of its tensors, and ``poll``/``synchronize``;
the operations' names and the checks of their arguments are horovod_cpp.common.ops's
(re-exported here).
"""
import warnings

import torch

from horovod_cpp.common.ops import (check_supported_op,  # noqa: F401
                                    handle_average_backwards_compatibility, op_name,
                                    process_set_id)
from horovod_cpp.torch.basics import _core, add_lifecycle_hooks

_CODES = _core.DTYPES
TORCH_TO_CODE = {
    torch.uint8: _CODES["uint8"],
    torch.int8: _CODES["int8"],
    torch.int16: _CODES["int16"],
    torch.int32: _CODES["int32"],
    torch.int64: _CODES["int64"],
    torch.float16: _CODES["float16"],
    torch.bfloat16: _CODES["bfloat16"],
    torch.float32: _CODES["float32"],
    torch.float64: _CODES["float64"],
    torch.bool: _CODES["bool"],
}
CODE_TO_TORCH = {code: dtype for dtype, code in TORCH_TO_CODE.items()}
CPU_DEVICE = _core.CPU_DEVICE

# handle -> (kind, objects to keep alive, what synchronize returns, CUDA device or None).
# Setting and popping one key are atomic under the GIL, so the map needs no lock of its own.
_handle_map = {}
add_lifecycle_hooks(on_shutdown=_handle_map.clear)


# ---- helpers -------------------------------------------------------------------------------

def _supported(allow_bool):
    return ", ".join(str(t) for t in TORCH_TO_CODE if allow_bool or t != torch.bool)


def check_tensor(tensor, op, allow_bool=False):
    if not torch.is_tensor(tensor):
        raise TypeError("%s expects a torch.Tensor, got %s" % (op, type(tensor).__name__))
    if tensor.is_sparse:
        raise ValueError("%s does not take sparse tensors (use sparse_allreduce_async, or "
                         "sparse_as_dense=True in DistributedOptimizer)" % op)
    if tensor.dtype not in TORCH_TO_CODE or (tensor.dtype == torch.bool and not allow_bool):
        raise ValueError("Tensor type %s is not supported by %s; supported types: %s"
                         % (tensor.dtype, op, _supported(allow_bool)))


def describe(tensor):
    """(data_ptr, dtype code, shape, device, stream) for the core. A CUDA tensor travels with
    the current stream of its device: the core's stream waits for it there."""
    # The hot path of every op: is_cpu costs a tenth of device.type, and the core takes the
    # torch.Size (a tuple) as it is.
    if tensor.is_cpu:
        return (tensor.data_ptr(), TORCH_TO_CODE[tensor.dtype], tensor.shape, CPU_DEVICE, 0)
    if tensor.is_cuda:
        device = tensor.device
        return (tensor.data_ptr(), TORCH_TO_CODE[tensor.dtype], tensor.shape, device.index,
                torch.cuda.current_stream(device).cuda_stream)
    raise ValueError("tensors on %s are not supported" % tensor.device)


def cuda_device_of(objects):
    """The device of the first CUDA tensor among ``objects`` (nested one level), or None when
    they are CPU tensors."""
    for obj in objects:
        for t in (obj if isinstance(obj, (list, tuple)) else [obj]):
            if isinstance(t, torch.Tensor) and t.is_cuda:
                return t.device
    return None


def in_place_target(tensor, op):
    if not tensor.is_contiguous():
        raise ValueError("%s: the tensor is not contiguous, so it cannot be updated in place; "
                         "call .contiguous() first (or use the out-of-place op)" % op)
    return tensor


_UNKNOWN = object()


def register(handle, kind, keep_alive, result, device=_UNKNOWN):
    if device is _UNKNOWN:
        device = cuda_device_of(keep_alive if isinstance(keep_alive, (list, tuple))
                                 else [keep_alive])
    _handle_map[handle] = (kind, keep_alive, result, device)
    return handle


def tensor_from_output(buffer, code, shape, device=None):
    dtype = CODE_TO_TORCH[code]
    if isinstance(buffer, _core.DeviceBuffer):  # CUDA memory owned by the core
        t = torch.as_tensor(buffer, device=device)
        return t.view(dtype) if t.dtype != dtype else t
    if device is not None:
        return torch.empty(shape, dtype=dtype, device=device)
    if buffer is None or len(buffer) == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "buffer is not writable": it is, the warning is generic
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)


def poll(handle):
    """True once the operation behind ``handle`` has completed (does not release it)."""
    return _core.poll(handle)


def synchronize(handle):
    """Waits for ``handle`` and returns the operation's output (a tuple (output,
    received_splits) for alltoall). Returns None for a handle that is not known. Raises
    HorovodInternalError if the operation failed (on every rank, for cross-rank problems)."""
    entry = _handle_map.pop(handle, None)
    if entry is None:
        return None
    kind, _keep_alive, result, device = entry
    if device is not None:
        # CUDA: the handle completes once the work is enqueued; the current stream (not this
        # thread) waits for it.
        raw = _core.wait_outputs(handle, torch.cuda.current_stream(device).cuda_stream)
    elif kind in ("single", "group"):
        _core.wait(handle)
        return result
    else:
        raw = _core.wait_outputs(handle)  # [(buffer, dtype code, shape, received splits, value)]
    if kind in ("single", "group"):
        return result
    outputs = [tensor_from_output(buf, code, shape, device) for buf, code, shape, _, _ in raw]
    if kind == "adasum":
        return result(outputs)
    if kind == "outputs":
        return outputs[0]
    if kind == "into":  # result: the caller's output (allgather_into)
        got = outputs[0]
        if got.numel() and got.data_ptr() != result.data_ptr():
            if got.numel() != result.numel():
                raise ValueError("allgather into a given output: the output has %d elements, "
                                 "the gathered result %d" % (result.numel(), got.numel()))
            result.view(-1).copy_(got.view(-1))
        return result
    if kind == "outputs_list":
        return outputs
    return outputs[0], torch.tensor(raw[0][3], dtype=torch.int32)  # alltoall
