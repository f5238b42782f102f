"""The collectives on torch tensors, with the names, signatures and semantics of
``horovod.torch``: allreduce, allgather, broadcast, alltoall and reducescatter (each single,
grouped, asynchronous and in place where Horovod has them), ``join`` and ``barrier``.

Ops are asynchronous: ``*_async`` functions return a handle at once; ``poll`` says whether it
has completed and ``synchronize`` waits for it (``tensor_bridge``). ``compression`` takes any
object with Horovod's ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)``
(``hvd.Compression.fp16``, ...; ``horovod_cpp.torch.compression`` stands above this module).
"""
import torch

from horovod_cpp.torch.adasum import adasum_async
from horovod_cpp.torch.basics import Adasum, Average, HorovodNotSupportedError, Sum, _core, rank
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.tensor_bridge import (CPU_DEVICE, check_tensor, describe,
                                             handle_average_backwards_compatibility,
                                             in_place_target, op_name, process_set_id,
                                             register, synchronize)


def _compress(compression, tensor):
    return (tensor, None) if compression is None else compression.compress(tensor)


def _decompress(compression, tensor, ctx):
    return tensor if compression is None else compression.decompress(tensor, ctx)


# ---- allreduce -----------------------------------------------------------------------------

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    check_tensor(tensor, "allreduce")
    source = tensor.contiguous()
    handle = _core.allreduce_async(describe(source), describe(output),
                                   op_name("allreduce", name), op, float(prescale_factor),
                                   float(postscale_factor), process_set_id(process_set))
    return register(handle, "single", (source, output), output)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of ``tensor`` into a new tensor; returns a handle for
    ``synchronize``. ``op``: Average (default), Sum, Adasum, Min, Max, Product. The name ``x``
    becomes ``allreduce.x``."""
    op = handle_average_backwards_compatibility(op, average)
    check_tensor(tensor, "allreduce")
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    if op == Adasum:
        return adasum_async([tensor], [output], name, prescale_factor, postscale_factor,
                             process_set, "allreduce", False)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place version of allreduce_async (the tensor must be contiguous)."""
    op = handle_average_backwards_compatibility(op, average)
    check_tensor(tensor, "allreduce")
    target = in_place_target(tensor, "allreduce_")
    if op == Adasum:
        return adasum_async([target], [target], name, prescale_factor, postscale_factor,
                             process_set, "allreduce", False)
    return _allreduce_in_place(target, name, op, prescale_factor, postscale_factor, process_set)


def _allreduce_in_place(target, name, op, prescale_factor, postscale_factor, process_set,
                        stats_group=-1):
    """allreduce_async_ past its checks; ``stats_group`` >= 0 has the core measure the
    tensor's squared norms into that group (adaptive training: ``_core.take_all_grad_stats``)."""
    # The per-gradient hot path: one description serves as input and output.
    desc = describe(target)
    handle = _core.allreduce_async(desc, desc, op_name("allreduce", name), op,
                                   float(prescale_factor), float(postscale_factor),
                                   process_set_id(process_set), stats_group)
    return register(handle, "single", target, target, None if desc[3] == CPU_DEVICE else
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


def allreduce(tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Averages (or sums, ...) ``tensor`` over every rank and returns the result as a new
    tensor. Differentiable."""
    check_tensor(tensor, "allreduce")
    tensor_compressed, ctx = _compress(compression, tensor)
    summed = HorovodAllreduce.apply(tensor_compressed, average, name, op, prescale_factor,
                                    postscale_factor, process_set)
    return _decompress(compression, summed, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns ``tensor``."""
    handle = allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                              process_set)
    return synchronize(handle)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set, stats_groups=()):
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    if op == Adasum:
        return adasum_async(tensors, outputs, name, prescale_factor, postscale_factor,
                             process_set, "grouped_allreduce", True)
    for t in tensors:
        check_tensor(t, "grouped_allreduce")
    if len({t.device for t in tensors}) > 1:
        raise ValueError("grouped_allreduce: every tensor of a group must be on the same device")
    sources = [t.contiguous() for t in tensors]
    handle = _core.grouped_allreduce_async(
        [describe(t) for t in sources], [describe(o) for o in outputs],
        op_name("grouped_allreduce", name), op, float(prescale_factor), float(postscale_factor),
        process_set_id(process_set), list(stats_groups))
    return register(handle, "group", (sources, outputs), outputs)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of a list of tensors, negotiated and fused together; one handle."""
    op = handle_average_backwards_compatibility(op, average)
    for t in tensors:
        check_tensor(t, "grouped_allreduce")
    outputs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place version of grouped_allreduce_async."""
    op = handle_average_backwards_compatibility(op, average)
    for t in tensors:
        check_tensor(t, "grouped_allreduce")
    targets = [in_place_target(t, "grouped_allreduce_") for t in tensors]
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


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors together (one negotiation, fused); differentiable."""
    for t in tensors:
        check_tensor(t, "grouped_allreduce")
    compressed = [_compress(compression, t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                            process_set, *[t for t, _ in compressed])
    return [_decompress(compression, t, c) for t, (_, c) in zip(reduced, compressed)]


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
    check_tensor(tensor, "allgather", allow_bool=True)
    source = tensor.contiguous()
    handle = _core.allgather_async(describe(source), op_name("allgather", name),
                                   process_set_id(process_set))
    return register(handle, "outputs", source, None)


def _allgather_into_async(tensor, output, name=None, process_set=global_process_set):
    """allgather_async writing the result into ``output`` (contiguous, on the CPU, the
    tensor's dtype; its size the gathered result's, else a copy into it or, of another number
    of elements, a ValueError from synchronize on this rank alone)."""
    check_tensor(tensor, "allgather", allow_bool=True)
    source = tensor.contiguous()
    if not output.is_contiguous():
        raise ValueError("allgather into a given output: the output must be contiguous")
    handle = _core.allgather_into_async(describe(source), describe(output),
                                        op_name("allgather", name), process_set_id(process_set))
    return register(handle, "into", source, output)


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
    check_tensor(tensor, "allgather", allow_bool=True)
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathers of a list of tensors, negotiated and fused together; one handle."""
    if not tensors:
        raise ValueError("grouped_allgather needs at least one tensor")
    for t in tensors:
        check_tensor(t, "grouped_allgather", allow_bool=True)
    sources = [t.contiguous() for t in tensors]
    handle = _core.grouped_allgather_async([describe(t) for t in sources],
                                           op_name("grouped_allgather", name),
                                           process_set_id(process_set))
    return register(handle, "outputs_list", sources, None)


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
        check_tensor(t, "grouped_allgather", allow_bool=True)
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---- broadcast -----------------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, process_set):
    check_tensor(tensor, "broadcast", allow_bool=True)
    source = tensor.contiguous()
    handle = _core.broadcast_async(describe(source), describe(output), int(root_rank),
                                   op_name("broadcast", name), process_set_id(process_set))
    return register(handle, "single", (source, output), output)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying ``root_rank``'s tensor (a global rank) into a new tensor everywhere."""
    check_tensor(tensor, "broadcast", allow_bool=True)
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place version of broadcast_async (the tensor must be contiguous)."""
    check_tensor(tensor, "broadcast", allow_bool=True)
    target = in_place_target(tensor, "broadcast_")
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
    check_tensor(tensor, "broadcast", allow_bool=True)
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites ``tensor`` with ``root_rank``'s; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall ------------------------------------------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending ``splits[d]`` rows of dim 0 to rank d of the set (default: an even
    split). ``synchronize`` returns (output, received_splits)."""
    check_tensor(tensor, "alltoall", allow_bool=True)
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
    handle = _core.alltoall_async(describe(source), split_list, op_name("alltoall", name),
                                  process_set_id(process_set))
    return register(handle, "alltoall", source, None)


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
    check_tensor(tensor, "alltoall", allow_bool=True)
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
    return _reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                postscale_factor)


def _reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor,
                         stats_group=-1):
    """reducescatter_async; ``stats_group`` >= 0 has the core measure the input's squared norm
    (and this rank's share's) into that group (adaptive training)."""
    _reducescatter_check_op(op)
    check_tensor(tensor, "reducescatter")
    source = tensor.contiguous()
    ps = process_set_id(process_set)
    shape = _core.reducescatter_shape(list(source.shape), ps) if source.dim() > 0 else []
    output = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    handle = _core.reducescatter_async(describe(source), describe(output),
                                       op_name("reducescatter", name), op,
                                       float(prescale_factor), float(postscale_factor), ps,
                                       stats_group)
    return register(handle, "single", (source, output), output)


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


def reducescatter(tensor, name=None, compression=None, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over every rank and returns this rank's share of dim 0;
    differentiable."""
    _reducescatter_check_op(op)
    check_tensor(tensor, "reducescatter")
    tensor_compressed, ctx = _compress(compression, tensor)
    reduced = HorovodReducescatter.apply(tensor_compressed, name, op, process_set,
                                         prescale_factor, postscale_factor)
    return _decompress(compression, reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducescatters of a list of tensors, negotiated and fused together."""
    _reducescatter_check_op(op)
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor")
    for t in tensors:
        check_tensor(t, "grouped_reducescatter")
    ps = process_set_id(process_set)
    sources = [t.contiguous() for t in tensors]
    outputs = [torch.empty(_core.reducescatter_shape(list(t.shape), ps) if t.dim() > 0 else [],
                           dtype=t.dtype, device=t.device) for t in sources]
    handle = _core.grouped_reducescatter_async(
        [describe(t) for t in sources], [describe(o) for o in outputs],
        op_name("grouped_reducescatter", name), op, float(prescale_factor),
        float(postscale_factor), ps)
    return register(handle, "group", (sources, outputs), outputs)


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


def grouped_reducescatter(tensors, name=None, compression=None, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors together; returns the list of results."""
    _reducescatter_check_op(op)
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor")
    for t in tensors:
        check_tensor(t, "grouped_reducescatter")
    compressed = [_compress(compression, t) for t in tensors]
    reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                postscale_factor, *[t for t, _ in compressed])
    return [_decompress(compression, t, c) for t, (_, c) in zip(reduced, compressed)]




def join(device=-1):
    """This rank has run out of data: until every rank has joined, it contributes zeros to
    the other ranks' allreduces. Returns the last rank to join (the same everywhere)."""
    handle = _core.join_async()
    outputs = _core.wait_outputs(handle)
    return int(outputs[0][4])


def barrier(process_set=global_process_set):
    """Returns once every rank of the process set has called barrier."""
    _core.barrier(process_set_id(process_set))


__all__ = ["allreduce_async", "allreduce_async_", "HorovodAllreduce", "allreduce", "allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "HorovodGroupedAllreduce",
    "grouped_allreduce", "grouped_allreduce_", "sparse_allreduce_async", "allgather_async",
    "HorovodAllgather", "allgather", "grouped_allgather_async", "HorovodGroupedAllgather",
    "grouped_allgather", "broadcast_async", "broadcast_async_", "HorovodBroadcast", "broadcast",
    "broadcast_", "alltoall_async", "HorovodAlltoall", "alltoall", "reducescatter_async",
    "HorovodReducescatter", "reducescatter", "grouped_reducescatter_async",
    "HorovodGroupedReducescatter", "grouped_reducescatter", "join", "barrier"]
