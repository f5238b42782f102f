"""The c10d backend: every torch.distributed collective of a group becomes an operation of
horovod_cpp's core, named ``c10d.<group>.<n>`` (n counts the group's collectives, so the
ranks of a group, which must issue them in the same order, give the same names). The core
negotiates each one like any other: a rank that passes another shape, dtype or operation, or
skips one, gets an error naming the ranks and their call sites instead of a hang; small
tensors are fused; the timeline shows them.

Each call returns a ``Work`` whose future one thread per process completes as the core
finishes the operations, in the order they finish (what DDP's reducer and FSDP wait on).
Only CPU tensors: give CUDA tensors to NCCL (``backend="cpu:horovod_cpp,cuda:nccl"``).
"""
import atexit
import contextlib
import itertools
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from horovod_cpp.torch.basics import Average, Max, Min, Product, Sum, _core
from horovod_cpp.torch.tensor_bridge import check_tensor, describe, register, synchronize

NAME = "horovod_cpp"

_REDUCE_OPS = {
    dist.ReduceOp.SUM: Sum, dist.ReduceOp.AVG: Average, dist.ReduceOp.MIN: Min,
    dist.ReduceOp.MAX: Max, dist.ReduceOp.PRODUCT: Product,
}


class Work(dist.Work):
    """One operation: ``wait()`` raises its error; ``get_future()`` completes with its
    result (the tensors it wrote)."""

    def __init__(self, op, result):
        super().__init__()
        self._op = op
        self._future = op.future
        self._result = result

    def wait(self, timeout=None):
        # A thread that waits runs the operation's completion itself unless the completion
        # thread already has (no thread switch for a blocking call).
        self._op.run(waiter=True)
        self._future.wait()
        return True

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        if not self._future.done():
            return False
        try:
            self._future.value()
            return True
        except Exception:
            return False

    def get_future(self):
        return self._future

    def result(self):
        return self._result

    def synchronize(self):
        pass


class _Failed(object):
    """The value of a future whose operation failed. ``Future.set_exception`` stores the
    exception as the value, which C++ consumers take for a result: DDP's reducer looks for the
    reduced bucket in it, finds no tensor and crashes (PyTorch 2.15). This value raises the
    error when its tensors are extracted (by pickling, torch/_jit_internal.py), so backward()
    raises it; Python's ``wait()``/``value()`` raise it through the future's unwrap function,
    as after ``set_exception``."""

    def __init__(self, error):
        self.error = error

    def __reduce__(self):
        raise self.error


def _fail(fut, error):
    def unwrap(value):
        raise value.error
    fut._set_unwrap_func(unwrap)
    fut.set_result(_Failed(error))


class _Op(object):
    """An operation's completion (wait for its handle, copy results out) and its future; run
    once, by whichever thread claims it first: the completion thread, woken by the core when
    the operation has finished, or a thread that waits on it."""

    __slots__ = ("token", "finish", "future", "_claim", "_armed")

    def __init__(self, token=-1):
        self.token = token
        self.finish = None
        self.future = torch.futures.Future()
        self._claim = threading.Lock()
        self._armed = threading.Event()

    def arm(self, finish):
        self.finish = finish
        self._armed.set()

    def run(self, waiter=False):
        if not self._claim.acquire(blocking=False):
            return  # the other thread runs it
        if waiter and self.token >= 0:
            _COMPLETIONS.forget(self.token)
        self._armed.wait()  # (the core may finish before the caller has armed it)
        try:
            value = self.finish()
        except BaseException as e:  # the operation's error, for whoever waits on it
            _fail(self.future, e)
            return
        finally:
            self.finish = None
        self.future.set_result(value)


class _Completions(object):
    """One thread for the process that completes operations as the core finishes them: each is
    enqueued with a number (``notify=``) that the core posts when it completes
    (``_core.take_notices``), so the thread wakes only for finished operations, in the order
    they finish. What futures (DDP's reducer) wait for; a thread that waits on a Work runs the
    completion itself, without a switch to this thread."""

    _STOP = -1  # the notice that ends the thread (operations' numbers count from 0)

    def __init__(self):
        self._lock = threading.Lock()
        self._ops = {}
        self._count = itertools.count()
        self._thread = None
        self._stop_at_exit = False

    @contextlib.contextmanager
    def reserve(self):
        """An op whose number the enqueue in the with-block passes as ``notify=``."""
        op = _Op(next(self._count))
        with self._lock:
            self._ops[op.token] = op
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="hvd-c10d-completion")
                self._thread.start()
                if not self._stop_at_exit:
                    atexit.register(self.stop)
                    self._stop_at_exit = True
        try:
            yield op
        except BaseException:
            with self._lock:
                self._ops.pop(op.token, None)  # never enqueued: no notice will come
            raise

    def forget(self, token):
        """The caller completes this op itself: the core's notice is not wanted."""
        _core.ignore_notice(token)
        with self._lock:
            self._ops.pop(token, None)

    def stop(self, timeout=10.0):
        """Ends the thread once it has completed what finished before (a later operation
        starts it again); registered to run at exit. The thread waits in the core with the GIL
        released: woken while the interpreter finalizes, it would take the GIL then, which ends
        the process with "terminate called without an active exception" (what torch's own
        ProcessGroupGloo threads do, pytorch/pytorch#179291)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        _core.post_notice(self._STOP)
        thread.join(timeout)

    def _run(self):
        while True:
            tokens = _core.take_notices(-1.0)
            for token in tokens:
                with self._lock:
                    op = self._ops.pop(token, None)
                if op is not None:
                    op.run()
            if self._STOP in tokens:
                return


_COMPLETIONS = _Completions()


def _when_done(ops, op):
    """Runs ``op`` once every one of ``ops`` has completed (at once if there are none)."""
    left = [len(ops)]
    lock = threading.Lock()

    def one_done(_):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            op.run()
    if not ops:
        op.run()
    for inner in ops:
        inner.future.add_done_callback(one_done)


def _contiguous(t):
    return t if t.is_contiguous() else t.contiguous()


def _copy_back(pairs):
    for target, buf in pairs:
        if buf is not target:
            target.copy_(buf)


class HorovodBackend(_C10dBackend):
    """horovod_cpp's core behind one c10d process group: ``ranks`` are the group's global
    ranks, ``process_set`` the core's process set holding them."""

    def __init__(self, rank, size, ranks, process_set, group_name, on_shutdown=None):
        super().__init__(rank, size)
        self._ranks = list(ranks)
        self._ps = process_set
        self._prefix = "c10d.%s." % group_name
        self._seq = itertools.count(1)
        self._on_shutdown = on_shutdown
        self._coalesced = None  # operations started since start_coalescing

    def getBackendName(self):
        return NAME

    # ---- plumbing -------------------------------------------------------------------------

    def _name(self):
        return self._prefix + str(next(self._seq))

    def _work(self, finish, result, op=None, after=None):
        """The Work of an operation: ``op`` reserved for its enqueue (the core notifies its
        completion), or one that completes once the ops in ``after`` have."""
        if op is None:
            op = _Op()
            op.arm(finish)
            _when_done(after or [], op)
        else:
            op.arm(finish)
        if self._coalesced is not None:
            self._coalesced.append(op)
        return Work(op, result)

    def _check(self, tensors, what, allow_bool=False):
        for t in tensors:
            check_tensor(t, "horovod_cpp backend: " + what, allow_bool)
            if not t.is_cpu:
                raise ValueError(
                    "horovod_cpp backend: %s of a tensor on %s; this backend serves CPU "
                    "tensors (give CUDA tensors to NCCL: init_process_group(backend="
                    "\"cpu:horovod_cpp,cuda:nccl\"))" % (what, t.device))

    def _op(self, reduce_op, what, allowed=None):
        kind = getattr(reduce_op, "op", reduce_op)
        op = _REDUCE_OPS.get(kind)
        if op is None or (allowed is not None and op not in allowed):
            raise ValueError("horovod_cpp backend: %s does not support %s (supported: %s)"
                             % (what, kind, ", ".join(str(k) for k, v in _REDUCE_OPS.items()
                                                       if allowed is None or v in allowed)))
        return op

    def _root(self, root):
        if not 0 <= root < len(self._ranks):
            raise ValueError("horovod_cpp backend: root %d is not a rank of this group of %d"
                             % (root, len(self._ranks)))
        return self._ranks[root]

    def _gather_into(self, source, flat, op):
        """Starts gathering every rank's ``source`` (flattened) into ``flat`` (size x n)."""
        src = _contiguous(source).reshape(1, -1)
        h = _core.allgather_into_async(describe(src), describe(flat), self._name(), self._ps,
                                       notify=op.token)
        return register(h, "into", src, flat)

    # ---- allreduce --------------------------------------------------------------------------

    def _allreduce(self, tensors, op, what):
        self._check(tensors, what)
        bufs = [_contiguous(t) for t in tensors]
        views = [describe(b) for b in bufs]
        with _COMPLETIONS.reserve() as done:
            if len(bufs) == 1:
                h = _core.allreduce_async(views[0], views[0], self._name(), op, 1.0, 1.0,
                                          self._ps, notify=done.token)
            else:
                h = _core.grouped_allreduce_async(views, views, self._name(), op, 1.0, 1.0,
                                                  self._ps, notify=done.token)
        register(h, "group", bufs, bufs)

        def finish():
            synchronize(h)
            _copy_back(zip(tensors, bufs))
            return tensors
        return self._work(finish, tensors, done)

    def allreduce(self, tensors, opts):
        return self._allreduce(tensors, self._op(opts.reduceOp, "allreduce"), "allreduce")

    def allreduce_coalesced(self, tensors, opts):
        return self._allreduce(tensors, self._op(opts.reduceOp, "allreduce_coalesced"),
                               "allreduce_coalesced")

    def reduce(self, tensors, opts):
        (t,) = tensors
        root = self._root(opts.rootRank)
        tmp = t.detach().clone(memory_format=torch.contiguous_format)
        inner = self._allreduce([tmp], self._op(opts.reduceOp, "reduce"), "reduce")
        mine = self._ranks[self.rank()] == root

        def finish():
            inner.wait()
            if mine:
                t.copy_(tmp)
            return tensors
        return self._work(finish, tensors, after=[inner._op])

    # ---- allgather --------------------------------------------------------------------------

    def all_gather_single(self, output, input, opts):
        self._check([input, output], "all_gather_into_tensor", allow_bool=True)
        n, size = input.numel(), self.size()
        if output.numel() != n * size:
            raise ValueError("horovod_cpp backend: all_gather_into_tensor: the output has %d "
                             "elements, the group of %d gathers %d of %d each"
                             % (output.numel(), size, n * size, n))
        out = output if output.is_contiguous() else torch.empty_like(
            output, memory_format=torch.contiguous_format)
        with _COMPLETIONS.reserve() as done:
            h = self._gather_into(input, out.view(size, n), done)

        def finish():
            synchronize(h)
            _copy_back([(output, out)])
            return [output]
        return self._work(finish, [output], done)

    _allgather_base = all_gather_single  # the name before PyTorch 2.6

    def allgather(self, output_lists, input_list, opts):
        if len(input_list) != 1 or len(output_lists) != 1:
            raise ValueError("horovod_cpp backend: allgather takes one input tensor")
        (outs,), (inp,) = output_lists, input_list
        self._check([inp] + list(outs), "all_gather", allow_bool=True)
        size = self.size()
        if len(outs) != size or any(o.numel() != inp.numel() for o in outs):
            raise ValueError("horovod_cpp backend: all_gather needs %d outputs of %d elements, "
                             "got %s" % (size, inp.numel(), [o.numel() for o in outs]))
        return self._gather_rows(inp, outs, output_lists)

    def _gather_rows(self, inp, outs, result):
        """Gathers every rank's ``inp`` and copies rank i's into ``outs[i]`` (if any)."""
        flat = torch.empty((self.size(), inp.numel()), dtype=inp.dtype)
        with _COMPLETIONS.reserve() as done:
            h = self._gather_into(inp, flat, done)

        def finish():
            synchronize(h)
            for i, o in enumerate(outs):
                o.copy_(flat[i].view(o.shape))
            return result
        return self._work(finish, result, done)

    def _several(self, works, result):
        def finish():
            for w in works:
                w.wait()
            return result
        return self._work(finish, result, after=[w._op for w in works])

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        return self._several([self.all_gather_single(o, i, opts)
                              for o, i in zip(outputs, inputs)], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, input_list, opts):
        (inp,) = input_list
        root = self._root(opts.rootRank)
        self._check([inp], "gather", allow_bool=True)
        outs = output_lists[0] if self._ranks[self.rank()] == root else []
        return self._gather_rows(inp, outs, output_lists)

    # ---- reduce-scatter ---------------------------------------------------------------------

    def _reduce_scatter(self, output, source_rows, op, what):
        """``source_rows``: contiguous (size, n); this rank gets row ``rank`` into output."""
        n = output.numel()
        out = output if output.is_contiguous() else torch.empty_like(
            output, memory_format=torch.contiguous_format)
        target = out.view(1, n)
        with _COMPLETIONS.reserve() as done:
            h = _core.reducescatter_async(describe(source_rows), describe(target),
                                          self._name(), op, 1.0, 1.0, self._ps,
                                          notify=done.token)
        register(h, "single", (source_rows, target), target)

        def finish():
            synchronize(h)
            _copy_back([(output, out)])
            return [output]
        return self._work(finish, [output], done)

    def reduce_scatter_single(self, output, input, opts):
        what = "reduce_scatter_tensor"
        self._check([input, output], what)
        op = self._op(opts.reduceOp, what, allowed=(Sum, Average))
        n, size = output.numel(), self.size()
        if input.numel() != n * size:
            raise ValueError("horovod_cpp backend: %s: the input has %d elements, the group of "
                             "%d needs %d for an output of %d" % (what, input.numel(), size,
                                                                  n * size, n))
        return self._reduce_scatter(output, _contiguous(input).view(size, n), op, what)

    _reduce_scatter_base = reduce_scatter_single  # the name before PyTorch 2.6

    def reduce_scatter(self, outputs, input_lists, opts):
        what = "reduce_scatter"
        (output,), (inputs,) = outputs, input_lists
        self._check([output] + list(inputs), what)
        op = self._op(opts.reduceOp, what, allowed=(Sum, Average))
        if len(inputs) != self.size() or any(t.numel() != output.numel() for t in inputs):
            raise ValueError("horovod_cpp backend: reduce_scatter needs %d inputs of %d "
                             "elements, got %s" % (self.size(), output.numel(),
                                                   [t.numel() for t in inputs]))
        rows = torch.stack([t.reshape(-1) for t in inputs]) if inputs[0].numel() else \
            torch.empty((self.size(), 0), dtype=output.dtype)
        return self._reduce_scatter(output, rows, op, what)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        return self._several([self.reduce_scatter_single(o, i, opts)
                              for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- broadcast, alltoall, scatter ----------------------------------------------------------

    def broadcast(self, tensors, opts):
        self._check(tensors, "broadcast", allow_bool=True)
        root = self._root(opts.rootRank)
        works = []
        with _COMPLETIONS.reserve() as done:
            for i, t in enumerate(tensors):
                buf = _contiguous(t)
                last = i == len(tensors) - 1  # its notice completes the Work (waiting for all)
                h = _core.broadcast_async(describe(buf), describe(buf), root, self._name(),
                                          self._ps, notify=done.token if last else -1)
                register(h, "single", buf, buf)
                works.append((t, buf, h))

        def finish():
            for t, buf, h in works:
                synchronize(h)
                _copy_back([(t, buf)])
            return tensors
        return self._work(finish, tensors, done)

    def _alltoall(self, flat, splits, on_received, result):
        with _COMPLETIONS.reserve() as done:
            h = _core.alltoall_async(describe(flat), [int(s) for s in splits], self._name(),
                                     self._ps, notify=done.token)
        register(h, "alltoall", flat, None)

        def finish():
            got, received = synchronize(h)
            on_received(got, [int(r) for r in received])
            return result
        return self._work(finish, result, done)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        what = "all_to_all_single"
        self._check([input, output], what, allow_bool=True)
        size = self.size()
        row = 1
        for d in input.shape[1:]:
            row *= d
        if input_splits:
            splits = [s * row for s in input_splits]
        else:
            if input.numel() % size:
                raise ValueError("horovod_cpp backend: %s: %d elements do not split evenly over "
                                 "%d ranks" % (what, input.numel(), size))
            splits = [input.numel() // size] * size
        if sum(splits) != input.numel():
            raise ValueError("horovod_cpp backend: %s: input splits %s do not add up to the "
                             "input's %d rows" % (what, list(input_splits), input.shape[0]))

        def on_received(got, received):
            if got.numel() != output.numel():
                raise ValueError("horovod_cpp backend: %s: received %d elements for an output "
                                 "of %d" % (what, got.numel(), output.numel()))
            output.copy_(got.view(output.shape))
        return self._alltoall(_contiguous(input).reshape(-1), splits, on_received, [output])

    alltoall_base = all_to_all_single  # the name before PyTorch 2.6

    def alltoall(self, outputs, inputs, opts):
        self._check(list(inputs) + list(outputs), "all_to_all", allow_bool=True)
        flat = torch.cat([t.reshape(-1) for t in inputs])

        def on_received(got, received):
            parts = torch.split(got, received)
            if [p.numel() for p in parts] != [o.numel() for o in outputs]:
                raise ValueError("horovod_cpp backend: all_to_all: received %s elements for "
                                 "outputs of %s" % (received, [o.numel() for o in outputs]))
            for o, p in zip(outputs, parts):
                o.copy_(p.view(o.shape))
        return self._alltoall(flat, [t.numel() for t in inputs], on_received, outputs)

    def scatter(self, output_lists, input_lists, opts):
        (output,) = output_lists
        root = self._root(opts.rootRank)
        if self._ranks[self.rank()] == root:
            inputs = input_lists[0]
            self._check(list(inputs) + [output], "scatter", allow_bool=True)
            flat = torch.cat([t.reshape(-1) for t in inputs])
            splits = [t.numel() for t in inputs]
        else:
            self._check([output], "scatter", allow_bool=True)
            flat = torch.empty(0, dtype=output.dtype)
            splits = [0] * self.size()

        def on_received(got, received):
            output.copy_(got.view(output.shape))
        return self._alltoall(flat, splits, on_received, output_lists)

    # ---- barrier, point-to-point, coalescing, shutdown ------------------------------------------

    def barrier(self, opts):
        # Started after this group's earlier operations, it returns once every rank has
        # started it; then those operations are waited for, as Gloo's barrier does.
        _core.barrier(self._ps)
        return self._work(lambda: [], [], after=[])

    def _no_p2p(self, *args):
        raise RuntimeError("horovod_cpp backend: point-to-point send/recv is not supported "
                           "(horovod_cpp's core has collectives only); use a group with a "
                           "backend that has them, e.g. dist.new_group(backend=\"gloo\")")

    send = recv = recv_anysource = _no_p2p

    def start_coalescing(self, *args):
        self._coalesced = []

    def end_coalescing(self, *args):
        ops, self._coalesced = self._coalesced or [], None

        def finish():
            for op in ops:
                op.run()
                op.future.wait()
            return []
        return self._work(finish, [], after=ops)

    _start_coalescing, _end_coalescing = start_coalescing, end_coalescing

    def shutdown(self):
        if self._on_shutdown is not None:
            callback, self._on_shutdown = self._on_shutdown, None
            callback()

    def abort(self):
        self.shutdown()
