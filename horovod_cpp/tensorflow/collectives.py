"""The collectives on TensorFlow tensors, with the names, signatures and semantics of
``horovod.tensorflow``: allreduce (dense and ``tf.IndexedSlices``), grouped_allreduce,
allgather, grouped_allgather, broadcast, alltoall, reducescatter, grouped_reducescatter,
``join`` and ``barrier``. Each works eagerly and inside ``tf.function`` (``tensor_bridge.run``),
and allreduce, allgather and broadcast are differentiable, as Horovod's ops are.

The ops are synchronous, as Horovod's TensorFlow ops are from Python's side; several tensors
travel together (and are fused by the core) through the grouped ops, which
``DistributedGradientTape`` and Keras's ``DistributedOptimizer`` use. The operations' names
are horovod_cpp.torch's (``allreduce.<name>``, ``allreduce.noname.<n>``, ...): a rank running
the same program on torch names the same calls alike, so a mismatch between them is reported
as any other (dtype, shape), never a hang.
"""
import tensorflow as tf

from horovod_cpp.common.ops import (handle_average_backwards_compatibility, op_name,
                                    process_set_id)
from horovod_cpp.common.process_sets import global_process_set
from horovod_cpp.tensorflow.basics import (Adasum, Average, HorovodNotSupportedError, Sum, _core,
                                           rank)
from horovod_cpp.common.elastic import add_internal_error_reader
from horovod_cpp.tensorflow.tensor_bridge import (check_tensor, describe, empty, from_output,
                                                  gradient_may_be_recorded, host_array,
                                                  internal_error_message, run, to_tensor)

# A job's failure inside a tf.function reaches Python as tf.errors.UnknownError: elastic
# training (hvd.elastic.run, Keras's too) treats it as the HorovodInternalError it wraps.
add_internal_error_reader(internal_error_message)


def _no_compression(compression):
    return compression is None or getattr(compression, "compress", None) is None


def _reject_adasum(op, what):
    if op == Adasum:
        raise HorovodNotSupportedError(
            "%s: horovod_cpp.tensorflow does not implement Adasum (horovod_cpp.torch does); use "
            "op=hvd.Average or hvd.Sum" % what)


def _size_of(process_set):
    if process_set.process_set_id == 0:
        return _core.size()
    return len(_core.process_set_info(process_set_id(process_set))[0])


# ---- allreduce -----------------------------------------------------------------------------

def _allreduce_kernel(name, op, prescale, postscale, ps):
    def kernel(*tensors):
        arrays = [host_array(t) for t in tensors]
        outs = [empty(a.shape, t.dtype) for a, t in zip(arrays, tensors)]
        if len(tensors) == 1:
            handle = _core.allreduce_async(describe(arrays[0], tensors[0].dtype),
                                           describe(outs[0], tensors[0].dtype),
                                           op_name("allreduce", name), op, prescale, postscale,
                                           ps)
        else:
            handle = _core.grouped_allreduce_async(
                [describe(a, t.dtype) for a, t in zip(arrays, tensors)],
                [describe(o, t.dtype) for o, t in zip(outs, tensors)],
                op_name("grouped_allreduce", name), op, prescale, postscale, ps)
        _core.wait(handle)
        return [to_tensor(o, t.dtype) for o, t in zip(outs, tensors)]
    return kernel


def _reduce_dense(tensors, name, op, prescale, postscale, process_set):
    """The allreduce of a list of dense tensors (one op, fused), differentiable: the gradient
    of each output is the same allreduce of the output's gradient."""
    ps = process_set_id(process_set)
    if (op not in (Average, Sum) and prescale == postscale == 1.0) or \
            not gradient_may_be_recorded():
        kernel = _allreduce_kernel(name, op, float(prescale), float(postscale), ps)
        return run(kernel, tensors, [t.dtype for t in tensors], [t.shape for t in tensors],
                   name or "HorovodAllreduce")

    @tf.custom_gradient
    def reduce(*xs):
        kernel = _allreduce_kernel(name, op, float(prescale), float(postscale), ps)
        ys = run(kernel, xs, [x.dtype for x in xs], [x.shape for x in xs],
                 name or "HorovodAllreduce")

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else tf.convert_to_tensor(dy)
                   for dy, x in zip(dys, xs)]
            back = _allreduce_kernel(None, op, float(prescale), float(postscale), ps)
            return run(back, dys, [d.dtype for d in dys], [d.shape for d in dys],
                       "HorovodAllreduceGrad")
        return ys, grad
    return list(reduce(*tensors))


def _allreduce_sparse(slices, op, name, process_set, prescale=1.0, postscale=1.0):
    if op not in (Average, Sum):
        raise HorovodNotSupportedError(
            "allreduce of tf.IndexedSlices supports Average and Sum only (they are gathered, not "
            "reduced); pass sparse_as_dense=True or convert with tf.convert_to_tensor")
    values = allgather(slices.values, name=None if name is None else name + ".values",
                       process_set=process_set)
    indices = allgather(slices.indices, name=None if name is None else name + ".indices",
                        process_set=process_set)
    scale = float(prescale) * float(postscale)
    if op == Average:
        scale /= _size_of(process_set)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None,
              op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=global_process_set, ignore_name_scope=False):
    """The reduction of ``tensor`` over the ranks of ``process_set`` (Average by default;
    Sum, Min, Max, Product). A ``tf.IndexedSlices`` is gathered instead (its values and indices;
    Average divides the values by the size), as Horovod does. ``compression`` casts the tensor
    for the wire (``hvd.Compression.fp16``, ``.bf16``). ``device_*`` and ``ignore_name_scope``
    are accepted for Horovod's signature: the tensors travel through host memory."""
    op = handle_average_backwards_compatibility(op, average)
    _reject_adasum(op, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_sparse(tensor, op, name, process_set, prescale_factor, postscale_factor)
    tensor = check_tensor(tensor, "allreduce")
    if _no_compression(compression):
        return _reduce_dense([tensor], name, op, prescale_factor, postscale_factor,
                             process_set)[0]
    compressed, ctx = compression.compress(tensor)
    reduced = _reduce_dense([compressed], name, op, prescale_factor, postscale_factor,
                            process_set)[0]
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=global_process_set, ignore_name_scope=False):
    """The allreduce of a list of tensors as one operation (negotiated and fused together).
    ``tf.IndexedSlices`` among them are gathered, as ``allreduce`` does."""
    op = handle_average_backwards_compatibility(op, average)
    _reject_adasum(op, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    results = [None] * len(tensors)
    dense = []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = _allreduce_sparse(t, op, None if name is None else "%s.%d" % (name, i),
                                           process_set, prescale_factor, postscale_factor)
        else:
            dense.append(i)
    if dense:
        inputs = [check_tensor(tensors[i], "grouped_allreduce") for i in dense]
        contexts = [None] * len(inputs)
        if not _no_compression(compression):
            pairs = [compression.compress(t) for t in inputs]
            inputs, contexts = [p[0] for p in pairs], [p[1] for p in pairs]
        reduced = _reduce_dense(inputs, name, op, prescale_factor, postscale_factor, process_set)
        for i, out, ctx in zip(dense, reduced, contexts):
            results[i] = out if _no_compression(compression) else \
                compression.decompress(out, ctx)
    return results


# ---- allgather -----------------------------------------------------------------------------

def _allgather_kernel(name, ps, grouped):
    def kernel(*tensors):
        arrays = [host_array(t) for t in tensors]
        if grouped:
            handle = _core.grouped_allgather_async(
                [describe(a, t.dtype) for a, t in zip(arrays, tensors)],
                op_name("grouped_allgather", name), ps)
        else:
            handle = _core.allgather_async(describe(arrays[0], tensors[0].dtype),
                                           op_name("allgather", name), ps)
        raw = _core.wait_outputs(handle)
        return [from_output(r, t.dtype) for r, t in zip(raw, tensors)]
    return kernel


def _gathered_shape(tensor):
    return tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0 (which may differ per rank);
    differentiable (the gradient: this rank's rows of the summed gradient)."""
    tensor = check_tensor(tensor, "allgather", allow_bool=True)
    ps = process_set_id(process_set)
    if tensor.shape.rank == 0:
        raise ValueError("allgather: the tensor must have at least one dimension")

    def forward(x):
        return run(_allgather_kernel(name, ps, False), [x], [x.dtype], [_gathered_shape(x)],
                   name or "HorovodAllgather")[0]

    if not tensor.dtype.is_floating or not gradient_may_be_recorded():
        return forward(tensor)

    @tf.custom_gradient
    def gather(x):
        y = forward(x)

        def grad(dy):
            summed = allreduce(dy, op=Sum, process_set=process_set)
            rows = tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])
            counts = allgather(rows, process_set=process_set)
            me = _core.process_set_info(ps)[1] if ps else rank()
            start = tf.reduce_sum(counts[:me])
            return tf.slice(summed, tf.concat([[start], tf.zeros([tf.rank(dy) - 1], tf.int64)], 0),
                            tf.shape(x, out_type=tf.int64))
        return y, grad
    return gather(tensor)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """The allgathers of a list of tensors as one operation."""
    tensors = [check_tensor(t, "grouped_allgather", allow_bool=True) for t in tensors]
    if not tensors:
        return []
    return run(_allgather_kernel(name, process_set_id(process_set), True), tensors,
               [t.dtype for t in tensors], [_gathered_shape(t) for t in tensors],
               name or "HorovodGroupedAllgather")


# ---- broadcast -----------------------------------------------------------------------------

def _broadcast_kernel(root_rank, names, ps):
    """Broadcasts of one or more tensors, enqueued together (the core fuses them) and waited
    for together; ``names``: one per tensor (None: numbered)."""
    def kernel(*tensors):
        sources = [host_array(x) for x in tensors]
        outs = [empty(a.shape, x.dtype) for a, x in zip(sources, tensors)]
        handles = [_core.broadcast_async(describe(a, x.dtype), describe(o, x.dtype),
                                         int(root_rank), op_name("broadcast", n), ps)
                   for a, o, x, n in zip(sources, outs, tensors, names)]
        for handle in handles:
            _core.wait(handle)
        return [to_tensor(o, x.dtype) for o, x in zip(outs, tensors)]
    return kernel


def grouped_broadcast(tensors, root_rank, names, process_set=global_process_set):
    """``root_rank``'s tensors on every rank of the set, as one op (not differentiable)."""
    tensors = [check_tensor(t, "broadcast", allow_bool=True) for t in tensors]
    if not tensors:
        return []
    return run(_broadcast_kernel(root_rank, names, process_set_id(process_set)), tensors,
               [t.dtype for t in tensors], [t.shape for t in tensors], "HorovodBroadcast")


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """``root_rank``'s tensor (a global rank) on every rank of the set; differentiable (the
    root gets the summed gradient, the others zeros)."""
    tensor = check_tensor(tensor, "broadcast", allow_bool=True)
    ps = process_set_id(process_set)

    def forward(x):
        return run(_broadcast_kernel(root_rank, [name], ps), [x], [x.dtype], [x.shape],
                   name or "HorovodBroadcast")[0]

    if not tensor.dtype.is_floating or not gradient_may_be_recorded():
        return forward(tensor)

    @tf.custom_gradient
    def bcast(x):
        def grad(dy):
            summed = allreduce(dy, op=Sum, process_set=process_set)
            return summed if rank() == root_rank else tf.zeros_like(summed)
        return forward(x), grad
    return bcast(tensor)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrites each variable with ``root_rank``'s value; returns the variables."""
    variables = list(variables)
    names = [None if name is None else "%s.%d" % (name, i) for i in range(len(variables))]
    for var, value in zip(variables, grouped_broadcast(variables, root_rank, names,
                                                       process_set)):
        var.assign(value)
    return variables


# ---- alltoall ------------------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends ``splits[d]`` rows of dimension 0 to rank d of the set (default: an even split).
    Returns (received, received_splits)."""
    tensor = check_tensor(tensor, "alltoall", allow_bool=True)
    ps = process_set_id(process_set)
    inputs = [tensor]
    if splits is not None:
        splits = tf.convert_to_tensor(splits)
        if splits.dtype not in (tf.int32, tf.int64) or splits.shape.rank != 1:
            raise ValueError("alltoall expects splits to be a 1D tensor of integers")
        inputs.append(tf.cast(splits, tf.int64))

    def kernel(x, *split):
        split_list = [int(s) for s in split[0].numpy()] if split else []
        source = host_array(x)
        handle = _core.alltoall_async(describe(source, x.dtype), split_list,
                                      op_name("alltoall", name), ps)
        raw = _core.wait_outputs(handle)[0]
        return [from_output(raw, x.dtype), tf.constant(list(raw[3]), dtype=tf.int32)]

    return tuple(run(kernel, inputs, [tensor.dtype, tf.int32],
                     [_gathered_shape(tensor), tf.TensorShape([None])],
                     name or "HorovodAlltoall"))


# ---- reducescatter -------------------------------------------------------------------------

def _reducescatter_kernel(name, op, prescale, postscale, ps, grouped):
    def kernel(*tensors):
        arrays = [host_array(t) for t in tensors]
        outs = [empty(_core.reducescatter_shape(list(a.shape), ps) if a.ndim else [], t.dtype)
                for a, t in zip(arrays, tensors)]
        ins = [describe(a, t.dtype) for a, t in zip(arrays, tensors)]
        outd = [describe(o, t.dtype) for o, t in zip(outs, tensors)]
        if grouped:
            handle = _core.grouped_reducescatter_async(
                ins, outd, op_name("grouped_reducescatter", name), op, prescale, postscale, ps)
        else:
            handle = _core.reducescatter_async(ins[0], outd[0], op_name("reducescatter", name),
                                               op, prescale, postscale, ps)
        _core.wait(handle)
        return [to_tensor(o, t.dtype) for o, t in zip(outs, tensors)]
    return kernel


def _reducescatter(tensors, name, op, prescale, postscale, process_set, grouped, compression):
    if op not in (Average, Sum):
        raise HorovodNotSupportedError("Reducescatter currently only supports AVERAGE and SUM.")
    tensors = [check_tensor(t, "reducescatter") for t in tensors]
    contexts = [None] * len(tensors)
    if not _no_compression(compression):
        pairs = [compression.compress(t) for t in tensors]
        tensors, contexts = [p[0] for p in pairs], [p[1] for p in pairs]
    kernel = _reducescatter_kernel(name, op, float(prescale), float(postscale),
                                   process_set_id(process_set), grouped)
    shapes = [tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank else None
              for t in tensors]
    outs = run(kernel, tensors, [t.dtype for t in tensors], shapes,
               name or "HorovodReducescatter")
    if _no_compression(compression):
        return list(outs)
    return [compression.decompress(o, c) for o, c in zip(outs, contexts)]


def reducescatter(tensor, device_dense="", compression=None, op=Average, name=None,
                  ignore_name_scope=False, process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over the set and scatters dimension 0: rank i keeps ``dim0 // size``
    rows, the first ``dim0 % size`` ranks one more."""
    return _reducescatter([tensor], name, op, prescale_factor, postscale_factor, process_set,
                          False, compression)[0]


def grouped_reducescatter(tensors, device_dense="", compression=None, op=Average, name=None,
                          ignore_name_scope=False, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatters of a list of tensors as one operation."""
    tensors = list(tensors)
    if not tensors:
        return []
    return _reducescatter(tensors, name, op, prescale_factor, postscale_factor, process_set,
                          True, compression)


# ---- join and barrier ----------------------------------------------------------------------

def join():
    """This rank has run out of data: until every rank has joined, it contributes zeros to the
    other ranks' allreduces. Returns the last rank to join (the same everywhere)."""
    handle = _core.join_async()
    return int(_core.wait_outputs(handle)[0][4])


def barrier(process_set=global_process_set):
    """Returns once every rank of the process set has called barrier."""
    _core.barrier(process_set_id(process_set))


__all__ = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
           "broadcast_", "grouped_broadcast", "alltoall", "reducescatter", "grouped_reducescatter", "join", "barrier"]


def _plain_python(module_globals, names):
    """Calls from inside a ``tf.function`` run these as the Python they are: AutoGraph would
    otherwise convert them (and everything they call) from their source at each trace, to no
    purpose (their control flow depends on Python values only) and at a cost."""
    for name in names:
        module_globals[name] = tf.autograph.experimental.do_not_convert(module_globals[name])


_plain_python(globals(), __all__)
