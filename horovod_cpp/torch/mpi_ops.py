"""Collective operations on torch tensors, with the names, signatures and semantics of
``horovod.torch``.

Tensors are handed to ``horovod_cpp._core`` as (data pointer, dtype, shape, device); this
module keeps them alive in ``_handle_map`` until the operation's handle is synchronized, so the
extension never links PyTorch. Ops are asynchronous: ``*_async`` functions return a handle at
once; ``poll`` says whether it has completed and ``synchronize`` waits for it.
"""
import atexit
import os
import threading
import warnings

import torch

import horovod_cpp
from horovod_cpp import elastic
from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.process_sets import ProcessSet, _registered, global_process_set

_core = horovod_cpp._import_core()
# Error messages about a collective name the caller's file:line, the first frame outside
# horovod_cpp and torch (a gradient's allreduce: the user's `loss.backward()`).
_core.set_call_site_skip(sorted({
    os.path.join(f(os.path.dirname(module.__file__)), "")
    for module in (horovod_cpp, torch) for f in (os.path.abspath, os.path.realpath)}))

HorovodInternalError = _core.HorovodInternalError
HorovodPreconditionError = _core.HorovodPreconditionError


class HorovodNotSupportedError(ValueError, NotImplementedError):
    """An operation horovod_cpp does not support with these arguments (op=Adasum, a
    reducescatter with Min/Max/Product). A ValueError, as horovod_cpp's other argument errors,
    and a NotImplementedError, a RuntimeError, as horovod.torch raises for them."""

Average = _core.AVERAGE
Sum = _core.SUM
Adasum = _core.ADASUM
Min = _core.MIN
Max = _core.MAX
Product = _core.PRODUCT

_CODES = _core.DTYPES
_TORCH_TO_CODE = {
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
_CODE_TO_TORCH = {code: dtype for dtype, code in _TORCH_TO_CODE.items()}
_CPU_DEVICE = _core.CPU_DEVICE

# handle -> (kind, objects to keep alive, what synchronize returns, CUDA device or None).
# Setting and popping one key are atomic under the GIL, so the map needs no lock of its own.
_handle_map = {}
_noname = {}
_noname_lock = threading.Lock()
_atexit_registered = False


# ---- lifecycle and topology ---------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Initializes horovod_cpp (idempotent). ``process_sets``: a list of ProcessSet objects
    registered on every rank (ids 1, 2, ... in order), or "dynamic" to allow
    ``add_process_set``/``remove_process_set`` later (like HOROVOD_DYNAMIC_PROCESS_SETS=1).
    Honours every HOROVOD_* variable set before the call (HOROVOD_TIMELINE included)."""
    if comm is not None:
        raise ValueError("horovod_cpp.torch.init() does not take an MPI communicator; run the "
                         "job with mpirun and use process sets for subsets of ranks")
    ranks = []
    if process_sets == "dynamic":
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    elif process_sets is not None:
        for ps in process_sets:
            if not isinstance(ps, ProcessSet):
                raise ValueError("process_sets must be a list of hvd.ProcessSet (or \"dynamic\")")
        ranks = [ps.ranks for ps in process_sets]
    if not _core.is_initialized():
        # Every rank starts again together: default names restart with the runtime, so a call
        # that failed on one rank while it was down cannot shift that rank's sequence.
        with _noname_lock:
            _noname.clear()
    if not _core.is_initialized() and elastic.enabled():
        _elastic_init(ranks)
    else:
        _core.init(ranks)
    global _atexit_registered
    if not _atexit_registered:
        # Before interpreter teardown (and before mpi4py finalizes MPI, if it owns it).
        atexit.register(shutdown)
        _atexit_registered = True
    if process_sets not in (None, "dynamic"):
        _registered(process_sets)
    global_process_set.ranks = list(range(_core.size()))


def _elastic_init(ranks, attempts=10):
    """Joins the driver's next round and initializes in it. A peer lost while the round
    forms (killed, or its host gone, during Init) fails this Init on the others: as for a
    failure while training, they leave that round and join the next one, which the driver forms
    without the lost worker, instead of ending (the chaos campaign found survivors exiting)."""
    for attempt in range(attempts):
        elastic.worker().join()  # this worker's rank and size in the driver's next round
        try:
            _core.init(ranks)
            return
        except HorovodInternalError as e:
            if attempt + 1 == attempts:
                raise
            warnings.warn("horovod_cpp elastic: Init failed (%s); joining the next round" % e)
            _core.shutdown()
            elastic.worker().request_reset("Init failed: %s" % e)


def shutdown():
    """Stops horovod_cpp on every rank; pending operations fail. Idempotent."""
    _core.shutdown()
    _handle_map.clear()


is_initialized = _core.is_initialized
size = _core.size
rank = _core.rank
local_size = _core.local_size
local_rank = _core.local_rank
cross_size = _core.cross_size
cross_rank = _core.cross_rank
mpi_threads_supported = _core.mpi_threads_supported


def mpi_built():
    return True


def _host_backend():
    """"MPI" or "Gloo": the running job's backend, before init the one the environment asks for."""
    if _core.is_initialized():
        return _core.host_backend()
    chosen = [os.environ.get(n, "").lower() for n in ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")]
    return "Gloo" if "gloo" in chosen else "MPI"


def mpi_enabled():
    """Whether the job uses MPI (horovod_cpp runs on MPI or on Gloo, not both)."""
    return _host_backend() == "MPI"


def gloo_built():
    return _core.gloo_built()


def gloo_enabled():
    """Whether the running job uses Gloo (HOROVOD_CONTROLLER=gloo, e.g. under hvdrun --gloo)."""
    return _host_backend() == "Gloo"


def nccl_built():
    """NCCL's version code (e.g. 22809) when built with NCCL, otherwise 0."""
    return _core.nccl_built()


def cuda_built():
    return _core.nccl_built() != 0


def rocm_built():
    return False


def ccl_built():
    return False


def ddl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts recording a timeline into ``file_path`` (written by rank 0)."""
    _core.start_timeline(file_path, mark_cycles)


def stop_timeline():
    """Stops recording; the file is left as valid JSON."""
    _core.stop_timeline()


# ---- helpers -------------------------------------------------------------------------------

def _op_name(prefix, name):
    """``<prefix>.<name>``, or ``<prefix>.noname.<n>`` numbered per process."""
    if name is not None and not isinstance(name, str):
        raise TypeError("%s: name must be a str or None, got %s" % (prefix, type(name).__name__))
    if name is not None:
        return "%s.%s" % (prefix, name)
    with _noname_lock:
        n = _noname.get(prefix, 0)
        _noname[prefix] = n + 1
    return "%s.noname.%d" % (prefix, n)


def _supported(allow_bool):
    return ", ".join(str(t) for t in _TORCH_TO_CODE if allow_bool or t != torch.bool)


def _check_tensor(tensor, op, allow_bool=False):
    if not torch.is_tensor(tensor):
        raise TypeError("%s expects a torch.Tensor, got %s" % (op, type(tensor).__name__))
    if tensor.is_sparse:
        raise ValueError("%s does not take sparse tensors (use sparse_allreduce_async, or "
                         "sparse_as_dense=True in DistributedOptimizer)" % op)
    if tensor.dtype not in _TORCH_TO_CODE or (tensor.dtype == torch.bool and not allow_bool):
        raise ValueError("Tensor type %s is not supported by %s; supported types: %s"
                         % (tensor.dtype, op, _supported(allow_bool)))


def _describe(tensor):
    """(data_ptr, dtype code, shape, device, stream) for the core. A CUDA tensor travels with
    the current stream of its device: the core's stream waits for it there."""
    # The hot path of every op: is_cpu costs a tenth of device.type, and the core takes the
    # torch.Size (a tuple) as it is.
    if tensor.is_cpu:
        return (tensor.data_ptr(), _TORCH_TO_CODE[tensor.dtype], tensor.shape, _CPU_DEVICE, 0)
    if tensor.is_cuda:
        device = tensor.device
        return (tensor.data_ptr(), _TORCH_TO_CODE[tensor.dtype], tensor.shape, device.index,
                torch.cuda.current_stream(device).cuda_stream)
    raise ValueError("tensors on %s are not supported" % tensor.device)


def _cuda_device_of(objects):
    """The device of the first CUDA tensor among ``objects`` (nested one level), or None when
    they are CPU tensors."""
    for obj in objects:
        for t in (obj if isinstance(obj, (list, tuple)) else [obj]):
            if isinstance(t, torch.Tensor) and t.is_cuda:
                return t.device
    return None


def _in_place_target(tensor, op):
    if not tensor.is_contiguous():
        raise ValueError("%s: the tensor is not contiguous, so it cannot be updated in place; "
                         "call .contiguous() first (or use the out-of-place op)" % op)
    return tensor


_UNKNOWN = object()


def _register(handle, kind, keep_alive, result, device=_UNKNOWN):
    if device is _UNKNOWN:
        device = _cuda_device_of(keep_alive if isinstance(keep_alive, (list, tuple))
                                 else [keep_alive])
    _handle_map[handle] = (kind, keep_alive, result, device)
    return handle


def _process_set_id(process_set):
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be an hvd.ProcessSet, got %r" % (process_set,))
    if process_set.process_set_id is None:
        raise ValueError("%r has not been registered (hvd.init(process_sets=...) or "
                         "hvd.add_process_set)" % (process_set,))
    return process_set.process_set_id


def handle_average_backwards_compatibility(op, average):
    """``op`` wins; ``average`` (deprecated) maps to Average/Sum; both at once is an error."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        check_supported_op(op)
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning)
        return Average if average else Sum
    return Average


def check_supported_op(op):
    if op not in (Average, Sum, Adasum, Min, Max, Product):
        raise ValueError("unknown reduction op %r; use hvd.Average, Sum, Adasum, Min, Max or "
                         "Product" % (op,))


# ---- Adasum --------------------------------------------------------------------------------
# Maleki et al., "Scaling Distributed Training with Adaptive Summation" (arXiv 2006.02924), with
# Horovod's semantics: the ranks' tensors combined pairwise up a binary tree over the rank
# order (ranks 2i and 2i+1, then those results 4i and 4i+2, ...), each tensor of a group on its
# own, dot products in float64, a power-of-two number of ranks. Every rank gathers every rank's
# tensor through the core's fused allgather (MPI or Gloo) and computes the same tree in the same
# order, so all hold the same bits; that sends N times the bytes of Horovod's vector-halving,
# distance-doubling exchange (README, differences from Horovod).
_SQRT_DBL_MIN = 1.4916681462400413e-154  # sqrt(DBL_MIN): below it a norm counts as zero


def adasum_pair(a, b):
    """Adaptive sum of two tensors of one shape: (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b.
    Orthogonal gradients are summed, equal ones averaged; a zero tensor's coefficient is 1."""
    a64, b64 = a.reshape(-1).double(), b.reshape(-1).double()
    dot, anormsq, bnormsq = (float(torch.dot(a64, b64)), float(torch.dot(a64, a64)),
                             float(torch.dot(b64, b64)))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _SQRT_DBL_MIN else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _SQRT_DBL_MIN else 1.0
    return a * acoeff + b * bcoeff


def _adasum_tree(rows):
    rows, distance = list(rows), 1
    while distance < len(rows):
        for i in range(0, len(rows), 2 * distance):
            rows[i] = adasum_pair(rows[i], rows[i + distance])
        distance *= 2
    return rows[0]


def _adasum_async(tensors, outputs, name, prescale_factor, postscale_factor, process_set,
                  prefix, grouped):
    ranks = process_set.size()
    if ranks & (ranks - 1):
        raise ValueError("Adasum needs a power-of-two number of ranks (as in Horovod); %s has "
                         "%d" % ("the job" if process_set.process_set_id == 0 else
                                 "this process set", ranks))
    for t in tensors:
        _check_tensor(t, prefix)
        if not t.is_floating_point():
            raise ValueError("Adasum reduces floating-point tensors, got %s" % t.dtype)
        if t.device.type != "cpu":
            raise HorovodNotSupportedError("horovod_cpp's Adasum takes CPU tensors (got %s)"
                                           % t.device)
    rows = [(t * prescale_factor if prescale_factor != 1.0 else t).reshape(1, -1).contiguous()
            for t in tensors]
    handle = _core.grouped_allgather_async([_describe(r) for r in rows], _op_name(prefix, name),
                                           _process_set_id(process_set))

    def finish(gathered):
        for rows_of_all, out in zip(gathered, outputs):
            if rows_of_all.shape[0] != ranks:
                raise HorovodInternalError("Adasum: %d of %d ranks contributed (a rank has "
                                           "joined; Adasum does not take joined ranks)"
                                           % (rows_of_all.shape[0], ranks))
            half = rows_of_all.dtype not in (torch.float32, torch.float64)
            result = _adasum_tree((rows_of_all.float() if half else rows_of_all).unbind(0))
            if postscale_factor != 1.0:
                result = result * postscale_factor
            out.copy_(result.view(out.shape))
        return outputs if grouped else outputs[0]

    _handle_map[handle] = ("adasum", rows, finish, None)
    return handle


def _tensor_from_output(buffer, code, shape, device=None):
    dtype = _CODE_TO_TORCH[code]
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


# ---- allreduce -----------------------------------------------------------------------------

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    _check_tensor(tensor, "allreduce")
    source = tensor.contiguous()
    handle = _core.allreduce_async(_describe(source), _describe(output),
                                   _op_name("allreduce", name), op, float(prescale_factor),
                                   float(postscale_factor), _process_set_id(process_set))
    return _register(handle, "single", (source, output), output)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of ``tensor`` into a new tensor; returns a handle for
    ``synchronize``. ``op``: Average (default), Sum, Adasum, Min, Max, Product. The name ``x``
    becomes ``allreduce.x``."""
    op = handle_average_backwards_compatibility(op, average)
    _check_tensor(tensor, "allreduce")
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    if op == Adasum:
        return _adasum_async([tensor], [output], name, prescale_factor, postscale_factor,
                             process_set, "allreduce", False)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place version of allreduce_async (the tensor must be contiguous)."""
    op = handle_average_backwards_compatibility(op, average)
    _check_tensor(tensor, "allreduce")
    target = _in_place_target(tensor, "allreduce_")
    if op == Adasum:
        return _adasum_async([target], [target], name, prescale_factor, postscale_factor,
                             process_set, "allreduce", False)
    # The per-gradient hot path: one description serves as input and output.
    desc = _describe(target)
    handle = _core.allreduce_async(desc, desc, _op_name("allreduce", name), op,
                                   float(prescale_factor), float(postscale_factor),
                                   _process_set_id(process_set))
    return _register(handle, "single", target, target, None if desc[3] == _CPU_DEVICE else
                     target.device)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce with autograd: the gradient is the allreduce of the gradient, same op and
    scale factors."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        handle = allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                 process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, average=ctx.average, op=ctx.op,
                          prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor, process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Averages (or sums, ...) ``tensor`` over every rank and returns the result as a new
    tensor. Differentiable."""
    _check_tensor(tensor, "allreduce")
    tensor_compressed, ctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(tensor_compressed, average, name, op, prescale_factor,
                                    postscale_factor, process_set)
    return compression.decompress(summed, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns ``tensor``."""
    handle = allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                              process_set)
    return synchronize(handle)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set):
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    if op == Adasum:
        return _adasum_async(tensors, outputs, name, prescale_factor, postscale_factor,
                             process_set, "grouped_allreduce", True)
    for t in tensors:
        _check_tensor(t, "grouped_allreduce")
    if len({t.device for t in tensors}) > 1:
        raise ValueError("grouped_allreduce: every tensor of a group must be on the same device")
    sources = [t.contiguous() for t in tensors]
    handle = _core.grouped_allreduce_async(
        [_describe(t) for t in sources], [_describe(o) for o in outputs],
        _op_name("grouped_allreduce", name), op, float(prescale_factor), float(postscale_factor),
        _process_set_id(process_set))
    return _register(handle, "group", (sources, outputs), outputs)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of a list of tensors, negotiated and fused together; one handle."""
    op = handle_average_backwards_compatibility(op, average)
    for t in tensors:
        _check_tensor(t, "grouped_allreduce")
    outputs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place version of grouped_allreduce_async."""
    op = handle_average_backwards_compatibility(op, average)
    for t in tensors:
        _check_tensor(t, "grouped_allreduce")
    targets = [_in_place_target(t, "grouped_allreduce_") for t in tensors]
    return _grouped_allreduce_async(targets, targets, name, op, prescale_factor,
                                    postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        handle = grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                         postscale_factor, process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), average=ctx.average, op=ctx.op,
                                  prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors together (one negotiation, fused); differentiable."""
    for t in tensors:
        _check_tensor(t, "grouped_allreduce")
    compressed = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                            process_set, *[t for t, _ in compressed])
    return [compression.decompress(t, c) for t, (_, c) in zip(reduced, compressed)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns the tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts an allreduce of a sparse COO tensor: every rank's indices and values are
    allgathered (each rank may have a different number of nonzeros) and the result is their
    sparse sum (Sum) or sum / size (Average), uncoalesced, as in Horovod. Returns a callable
    that waits and returns the reduced sparse tensor."""
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports Average and Sum")
    if not torch.is_tensor(tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async expects a sparse COO tensor")
    t = tensor.coalesce()
    # Allgather concatenates along dim 0: indices travel as (nnz, sparse_dim).
    indices_handle = allgather_async(t.indices().t().contiguous(), name="%s.indices" % name,
                                     process_set=process_set)
    values_handle = allgather_async(t.values().contiguous(), name="%s.values" % name,
                                    process_set=process_set)

    def handle():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.t(), values, size=t.size(),
                                       dtype=values.dtype, device=t.device)

    return handle


# ---- allgather -----------------------------------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's ``tensor`` along dim 0 (which may differ per rank)."""
    _check_tensor(tensor, "allgather", allow_bool=True)
    source = tensor.contiguous()
    handle = _core.allgather_async(_describe(source), _op_name("allgather", name),
                                   _process_set_id(process_set))
    return _register(handle, "outputs", source, None)


class HorovodAllgather(torch.autograd.Function):
    """Allgather with autograd: the gradient is this rank's slice of the averaged gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 0  # a scalar is rejected below
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set)
        offset = int(dims[:ctx.process_set.rank()].sum())
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along dim 0; differentiable."""
    _check_tensor(tensor, "allgather", allow_bool=True)
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathers of a list of tensors, negotiated and fused together; one handle."""
    if not tensors:
        raise ValueError("grouped_allgather needs at least one tensor")
    for t in tensors:
        _check_tensor(t, "grouped_allgather", allow_bool=True)
    sources = [t.contiguous() for t in tensors]
    handle = _core.grouped_allgather_async([_describe(t) for t in sources],
                                           _op_name("grouped_allgather", name),
                                           _process_set_id(process_set))
    return _register(handle, "outputs_list", sources, None)


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather with autograd: like HorovodAllgather for each tensor, the gradients
    averaged in one grouped allreduce and each rank's rows located with one grouped
    allgather of the first dimensions."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] if t.dim() > 0 else 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce([g.contiguous() for g in grad_outputs], op=Average,
                                  process_set=ctx.process_set)
        dims = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                 process_set=ctx.process_set)
        r = ctx.process_set.rank()
        out = [g.narrow(0, int(d[:r].sum()), dim) for g, d, dim in zip(grads, dims, ctx.dims)]
        return (None, None) + tuple(out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors together; returns the list of results. Differentiable."""
    if not tensors:
        raise ValueError("grouped_allgather needs at least one tensor")
    for t in tensors:
        _check_tensor(t, "grouped_allgather", allow_bool=True)
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---- broadcast -----------------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, process_set):
    _check_tensor(tensor, "broadcast", allow_bool=True)
    source = tensor.contiguous()
    handle = _core.broadcast_async(_describe(source), _describe(output), int(root_rank),
                                   _op_name("broadcast", name), _process_set_id(process_set))
    return _register(handle, "single", (source, output), output)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying ``root_rank``'s tensor (a global rank) into a new tensor everywhere."""
    _check_tensor(tensor, "broadcast", allow_bool=True)
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place version of broadcast_async (the tensor must be contiguous)."""
    _check_tensor(tensor, "broadcast", allow_bool=True)
    target = _in_place_target(tensor, "broadcast_")
    return _broadcast_async(target, target, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast with autograd: the root gets the averaged gradient, the others zeros."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced *= 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s tensor on every rank; differentiable."""
    _check_tensor(tensor, "broadcast", allow_bool=True)
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites ``tensor`` with ``root_rank``'s; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall ------------------------------------------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending ``splits[d]`` rows of dim 0 to rank d of the set (default: an even
    split). ``synchronize`` returns (output, received_splits)."""
    _check_tensor(tensor, "alltoall", allow_bool=True)
    if splits is None:
        split_list = []
    else:
        if torch.is_tensor(splits):
            if splits.dim() != 1:
                raise ValueError("alltoall expects a 1D splits tensor")
            if splits.dtype not in (torch.int32, torch.int64):
                raise ValueError("alltoall expects splits to contain integer elements")
            split_list = [int(s) for s in splits.tolist()]
        else:
            split_list = [int(s) for s in splits]
    source = tensor.contiguous()
    handle = _core.alltoall_async(_describe(source), split_list, _op_name("alltoall", name),
                                  _process_set_id(process_set))
    return _register(handle, "alltoall", source, None)


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall with autograd: the gradient goes back along the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received_splits = received_splits
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output, splits=ctx.received_splits, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters slices of dim 0 to every rank and gathers theirs; differentiable. Returns the
    output, or (output, received_splits) when ``splits`` is given."""
    _check_tensor(tensor, "alltoall", allow_bool=True)
    output, received_splits = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received_splits)


# ---- reducescatter -------------------------------------------------------------------------

def _reducescatter_check_op(op):
    if op not in (Average, Sum):
        raise HorovodNotSupportedError("Reducescatter currently only supports AVERAGE and SUM.")


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing ``tensor`` over every rank and scattering dim 0: rank i keeps
    ``dim0 // size`` rows, the first ``dim0 % size`` ranks one more."""
    _reducescatter_check_op(op)
    _check_tensor(tensor, "reducescatter")
    source = tensor.contiguous()
    ps = _process_set_id(process_set)
    shape = _core.reducescatter_shape(list(source.shape), ps) if source.dim() > 0 else []
    output = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    handle = _core.reducescatter_async(_describe(source), _describe(output),
                                       _op_name("reducescatter", name), op,
                                       float(prescale_factor), float(postscale_factor), ps)
    return _register(handle, "single", (source, output), output)


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter with autograd: the gradient is the allgather of the gradient, scaled like
    the forward pass (1/size for Average, times the scale factors)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output, process_set=ctx.process_set)
        scale = ctx.scale / (ctx.process_set.size() if ctx.op == Average else 1)
        return grad * scale, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over every rank and returns this rank's share of dim 0;
    differentiable."""
    _reducescatter_check_op(op)
    _check_tensor(tensor, "reducescatter")
    tensor_compressed, ctx = compression.compress(tensor)
    reduced = HorovodReducescatter.apply(tensor_compressed, name, op, process_set,
                                         prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducescatters of a list of tensors, negotiated and fused together."""
    _reducescatter_check_op(op)
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor")
    for t in tensors:
        _check_tensor(t, "grouped_reducescatter")
    ps = _process_set_id(process_set)
    sources = [t.contiguous() for t in tensors]
    outputs = [torch.empty(_core.reducescatter_shape(list(t.shape), ps) if t.dim() > 0 else [],
                           dtype=t.dtype, device=t.device) for t in sources]
    handle = _core.grouped_reducescatter_async(
        [_describe(t) for t in sources], [_describe(o) for o in outputs],
        _op_name("grouped_reducescatter", name), op, float(prescale_factor),
        float(postscale_factor), ps)
    return _register(handle, "group", (sources, outputs), outputs)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Grouped reducescatter with autograd: each gradient is the allgather of the incoming
    gradient scaled like the forward pass, as in HorovodReducescatter, in one grouped
    allgather."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allgather([g.contiguous() for g in grad_outputs],
                                  process_set=ctx.process_set)
        scale = ctx.scale / (ctx.process_set.size() if ctx.op == Average else 1)
        return (None, None, None, None, None) + tuple(g * scale for g in grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors together; returns the list of results."""
    _reducescatter_check_op(op)
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor")
    for t in tensors:
        _check_tensor(t, "grouped_reducescatter")
    compressed = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                postscale_factor, *[t for t, _ in compressed])
    return [compression.decompress(t, c) for t, (_, c) in zip(reduced, compressed)]


# ---- completion, join, barrier -------------------------------------------------------------

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
    outputs = [_tensor_from_output(buf, code, shape, device) for buf, code, shape, _, _ in raw]
    if kind == "adasum":
        return result(outputs)
    if kind == "outputs":
        return outputs[0]
    if kind == "outputs_list":
        return outputs
    return outputs[0], torch.tensor(raw[0][3], dtype=torch.int32)  # alltoall


def join(device=-1):
    """This rank has run out of data: until every rank has joined, it contributes zeros to
    the other ranks' allreduces. Returns the last rank to join (the same everywhere)."""
    handle = _core.join_async()
    outputs = _core.wait_outputs(handle)
    return int(outputs[0][4])


def barrier(process_set=global_process_set):
    """Returns once every rank of the process set has called barrier."""
    _core.barrier(_process_set_id(process_set))
