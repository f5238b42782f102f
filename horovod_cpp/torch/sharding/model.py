"""Stage 3: the parameters sharded too (ZeRO-3, FSDP's FULL_SHARD), on horovod_cpp's runtime.

    model = hvd.shard_model(model, auto_wrap={TransformerBlock})
    optimizer = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=3,
                                     lr=1e-3)

``shard_model`` changes the model in place and returns it. Its modules are split into *units*:
the root (the model itself) and every submodule that ``auto_wrap`` selects. Each parameter
belongs to one unit: the deepest one whose forward uses it, and the root for a parameter two
separate units share (tied weights). A unit's parameters are packed into flat buffers, one per
dtype, device and requires_grad; every rank stores only its slice of each flat buffer (split
as reducescatter splits dim 0), and outside the unit's forward and backward a parameter holds
no data (``p.data`` is an empty tensor).

* Forward: just before a unit runs, its flat buffers are allgathered (through the background
  thread, fused like any other collective) and its parameters become views of them; the next
  unit in the order of the last forward is prefetched while this one computes. Right after the
  unit, the gathered storage is freed (kept for the root when a backward will follow).
* Backward: a hook on the unit's outputs gathers it again before its backward runs (and
  prefetches the unit before it; a unit that is one ``nn.Embedding`` is not gathered: its
  backward needs the indices and the weight's shape only); each parameter's gradient goes
  into the flat gradient of its unit (scaled by 1/N for op=Average, and dropped at once), and
  once every trainable parameter of a flat buffer has its gradient the buffer is
  reduce-scattered: each rank keeps the reduced gradient of its slice only, and the gathered
  parameters are freed. At the end of backward the reductions the hooks did not start
  (parameters without a gradient: zeros) are started, so every rank runs the same
  collectives, and whatever is still gathered is freed.
* A rank whose forward differs from the others' (a unit it skips) waits for collectives the
  others never start: the runtime's deadlock detection ends that as an error on every rank,
  naming what each rank waits for (the collectives are named after the units' modules).

``ShardedOptimizer(..., stage=3)`` steps each parameter's part of this rank's slice (views of
the slice: parameter groups with their own hyperparameters work) and does not gather after the
step: the next forward does."""
import collections
import contextlib

import torch

from horovod_cpp.torch.basics import Average, HorovodNotSupportedError, Sum
from horovod_cpp.torch.collectives import _allgather_into_async, _reducescatter_async
from horovod_cpp.torch.grad_hooks import register_grad_ready_hook
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.sharding.common import SliceStats, check_gradient, check_saved_ranks
from horovod_cpp.torch.sharding.deferred import initialise, is_deferred, make_placeholders
from horovod_cpp.torch.sharding.flat import (FlatBuffer, copy_overlap, empty_like,
                                             resize_storage, shard_range, storage_bytes)
from horovod_cpp.torch.tensor_bridge import poll, synchronize


def _eager(fn):
    """``fn`` run as it is under torch.compile (a graph break around it): the hooks gather,
    free and reduce through the runtime, which the compiler must not trace."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "disable"):
        return compiler.disable(fn)
    return fn



def _tensors(output):
    if torch.is_tensor(output):
        yield output
    elif isinstance(output, (list, tuple)):
        for o in output:
            for t in _tensors(o):
                yield t
    elif isinstance(output, dict):
        for o in output.values():
            for t in _tensors(o):
                yield t



class _Unit(object):
    def __init__(self, index, module, name):
        self.index = index
        self.module = module
        self.name = name
        self.flats = []
        self.gathered = False
        self.handles = []
        self.awaiting = None  # in backward: trainable parameters whose gradient is to come
        self.backward_needs_params = True  # False: see _backward_needs_params


def _backward_needs_params(u):
    """Whether unit u's backward reads its parameters' values. Not for a unit that is one
    ``nn.Embedding`` (torch's own forward, dense) holding only its own weight: the gradient of an
    embedding lookup needs the indices and the weight's shape only, so in backward such a unit
    is not gathered again (its weight gets a stand-in of its shape with one element of storage;
    the gradient autograd makes is a new dense tensor either way). For a language model's token
    embedding that is the largest gather of the backward (vocabulary x hidden)."""
    m = u.module
    if type(m).forward is not torch.nn.Embedding.forward or m.sparse:
        return True
    return any(p is not m.weight for f in u.flats for p in f.params)


class ShardedModel(object):
    """The sharding of one model (``model._hvd_sharded``); made by ``shard_model``."""

    def __init__(self, model, auto_wrap, process_set, op, backward_passes_per_step, prefetch,
                 param_init_fn=None, device=None, reductions_in_flight=1):
        if op not in (Average, Sum):
            raise HorovodNotSupportedError("shard_model supports op=Average and op=Sum")
        if isinstance(reductions_in_flight, bool) or not isinstance(reductions_in_flight, int) \
                or reductions_in_flight < 0:
            raise ValueError("shard_model: reductions_in_flight must be an int >= 0 (0: no "
                             "bound); got %r" % (reductions_in_flight,))
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        if not process_set.included():
            raise ValueError("shard_model: this rank is not in %r" % (process_set,))
        self.model = model
        self.process_set = process_set
        self.op = op
        self.backward_passes_per_step = backward_passes_per_step
        self.prefetch = prefetch
        self.size, self.rank = process_set.size(), process_set.rank()
        meta, deferred = is_deferred(model), (set(), [])
        device = torch.device(device if device is not None else "cpu")
        if meta:
            deferred = make_placeholders(model, device)
        elif param_init_fn is not None:
            raise ValueError("shard_model: param_init_fn initialises a model built on the meta "
                             "device (or under hvd.sharded_init()); this one is built already")
        self.units = self._make_units(model, auto_wrap, deferred[0])
        for u in self.units:
            u.backward_needs_params = _backward_needs_params(u)
        self.flats = [f for u in self.units for f in u.flats]
        self.stats = SliceStats()  # adaptive training: the flats' gradient norms
        self._flat_index = {id(f): k for k, f in enumerate(self.flats)}
        self.flat_of = {}
        self.names = {}
        for f in self.flats:
            for i, (p, name) in enumerate(zip(f.params, f.names)):
                self.flat_of[p] = (f, i)
                self.names[p] = name
                p._hvd_sharding = self
        if meta:
            initialise(model, deferred, lambda p, whole: self.flat_of[p][0].fill(
                self.flat_of[p][1], whole), process_set, param_init_fn, device)
        self.order = []          # units in the order of the last forward
        self._recording = []
        self._depth = 0
        self._backward_queued = False
        self.passes = {p: 0 for f in self.flats if f.trainable for p in f.params}
        self.in_flight = False
        # Reductions started and not yet waited for, oldest first (a flat per reduction);
        # each keeps its unit's whole flat gradient until it is done.
        self._reducing = collections.deque()
        self.reductions_in_flight = reductions_in_flight
        self._hooks = []
        for u in self.units:
            self._hooks.append(u.module.register_forward_pre_hook(self._make_pre_forward(u)))
            self._hooks.append(u.module.register_forward_hook(self._make_post_forward(u)))
        for f in self.flats:
            for p in f.params:
                if f.trainable:
                    # (Before p holds no data: PyTorch 1.13's gradient accumulator, made here,
                    # keeps the shape p has now.)
                    self._hooks.append(self._register_grad_hook(p))
                p.data = empty_like(p)

    # ---- layout ---------------------------------------------------------------------------

    @staticmethod
    def _wraps(auto_wrap, module):
        if auto_wrap is None:
            return False
        if isinstance(auto_wrap, (set, frozenset, list, tuple)):
            return isinstance(module, tuple(auto_wrap))
        if isinstance(auto_wrap, type):
            return isinstance(module, auto_wrap)
        if isinstance(auto_wrap, int) and not isinstance(auto_wrap, bool):
            return sum(p.numel() for p in module.parameters()) >= auto_wrap
        if callable(auto_wrap):
            return bool(auto_wrap(module))
        raise ValueError("auto_wrap must be None, module classes, a callable(module) -> bool, "
                         "or a minimum number of parameters; got %r" % (auto_wrap,))

    def _make_units(self, model, auto_wrap, deferred):
        units = [_Unit(0, model, "")]
        parent = {}       # unit index -> its parent unit's index
        unit_of = {}      # id(wrapped module) -> its unit's index
        owners, names, order = {}, {}, []

        def ancestors(u):
            chain = [u]
            while u in parent:
                u = parent[u]
                chain.append(u)
            return chain

        def use(module, prefix, u):
            # Each parameter belongs to the lowest common ancestor of the units using it.
            for pname, p in module._parameters.items():
                if p is None:
                    continue
                if p not in owners:
                    owners[p] = u
                    names[p] = prefix + pname
                    order.append(p)
                elif owners[p] != u:
                    mine = ancestors(owners[p])
                    owners[p] = next(a for a in ancestors(u) if a in mine)

        def walk(module, prefix, u):
            use(module, prefix, u)
            for name, child in module.named_children():
                v = u
                if self._wraps(auto_wrap, child):
                    if id(child) not in unit_of:
                        units.append(_Unit(len(units), child, prefix + name))
                        unit_of[id(child)] = len(units) - 1
                        parent[len(units) - 1] = u
                    v = unit_of[id(child)]
                walk(child, prefix + name + ".", v)

        walk(model, "", 0)
        size, rank = self.process_set.size(), self.process_set.rank()
        index = 0
        for u in units:
            kinds = {}
            for p in order:
                if owners[p] == u.index:
                    kinds.setdefault((p.dtype, str(p.device), p.requires_grad), []).append(p)
            for kind in sorted(kinds, key=lambda k: (str(k[0]), k[1], k[2])):
                ps = kinds[kind]
                if any(p.is_sparse for p in ps):
                    raise HorovodNotSupportedError("shard_model: sparse parameters")
                u.flats.append(FlatBuffer(index, u, ps, [names[p] for p in ps], size, rank,
                                          deferred))
                index += 1
        return units

    # ---- gathering ------------------------------------------------------------------------

    def _start_gather(self, u, tag):
        """Starts unit u's allgathers. ``tag`` names the place: the unit's position in this
        forward ("f3"), backward ("b"), or a whole-model gather ("s"); a rank whose forward runs
        other units than the others' then waits for collectives they never start, which the
        runtime's deadlock detection ends as an error on every rank."""
        if u.gathered or u.handles:
            return
        for f in u.flats:
            if self.size == 1:
                u.handles.append((f, f.shard))
            else:  # straight into the unit's storage (the core takes it as its output)
                resize_storage(f.full, f.length)
                u.handles.append((f, _allgather_into_async(
                    f.shard, f.full, name="sharded3.gather.%s.%s" % (f.label, tag),
                    process_set=self.process_set)))

    def _gather(self, u, tag):
        """Makes unit u's parameters whole (waits for its allgather, started here if not
        prefetched)."""
        if u.gathered:
            return
        self._start_gather(u, tag)
        with torch.no_grad():
            for f, h in u.handles:
                if self.size == 1:  # the slice is the whole buffer: no copy of it
                    whole = f.shard
                else:
                    whole = self._wait(h)  # f.full, filled by the core
                for i, p in enumerate(f.params):
                    p.data = f.view(whole, i)
        u.handles = []
        u.gathered = True

    def _wait(self, handle):
        """synchronize(handle); when it fails (a deadlock declared, a peer lost), every other
        collective this model started is waited for too (each fails or completes), so that none
        is left in flight under a name the next step would reuse, and the step is forgotten."""
        try:
            return synchronize(handle)
        except Exception:
            self._abort()
            raise

    def _abort(self):
        for u in self.units:
            for _, h in u.handles:
                if not torch.is_tensor(h):
                    try:
                        synchronize(h)
                    except Exception:
                        pass
            u.handles = []
            u.awaiting = None
            self._free(u)
        for f in self.flats:
            for h in f.handles:
                if not torch.is_tensor(h):
                    try:
                        synchronize(h)
                    except Exception:
                        pass
            f.handles, f.arrived, f.launched, f.grad_full, f.direct = [], set(), 0, None, False
            f.shard_grad = None
        for p in self.passes:
            self.passes[p] = 0
        self.in_flight = False
        self._reducing.clear()

    def _free(self, u):
        """Frees unit u's gathered storage (none of its gathers may be in flight)."""
        for f in u.flats:
            if u.gathered:
                for p in f.params:
                    p.data = empty_like(p)
            resize_storage(f.full, 0)
        u.gathered = False

    def _prefetch(self, position, step, tag):
        """Starts the allgather of the unit ``step`` places after ``position`` in the last
        forward's order."""
        k = position + step
        if self.prefetch and 0 <= k < len(self.order):
            if step > 0 or self.order[k].backward_needs_params:
                self._start_gather(self.order[k], tag)

    def _stand_in(self, u):
        """For a unit whose backward reads only its parameters' shapes: each parameter becomes
        a tensor of its shape that holds one element (stride 0), freed like a gathered one."""
        if u.gathered or u.handles:
            self._gather(u, None)  # (gathered already, or being gathered)
            return
        for f in u.flats:
            for i, p in enumerate(f.params):
                p.data = torch.zeros((), dtype=f.dtype, device=f.device).expand(f.shapes[i])
        u.gathered = True

    # ---- forward and backward hooks -------------------------------------------------------

    def _make_pre_forward(self, u):
        @_eager
        def hook(module, inputs):
            if u.index == 0:
                self._recording = []
                self._backward_queued = False
            position = len(self._recording)
            self._recording.append(u)
            self._gather(u, "f%d" % position)
            if self.order[position:position + 1] == [u]:
                self._prefetch(position, 1, "f%d" % (position + 1))
        return hook

    def _make_post_forward(self, u):
        @_eager
        def hook(module, inputs, output):
            grads = torch.is_grad_enabled()
            if u.index == 0:
                self.order = self._recording
                for v in self.units:  # prefetches that this forward did not use
                    if v.handles and v is not u:
                        self._gather(v, None)
                        self._free(v)
            keep = False
            if grads:
                tensors = [t for t in _tensors(output) if t.requires_grad]
                for t in tensors:
                    t.register_hook(self._make_pre_backward(u))
                # The root is needed first in backward; a unit whose outputs carry no
                # gradient hook (outputs hidden in other objects) stays whole until the end of
                # backward.
                keep = u.index == 0 or (not tensors and any(f.trainable for f in u.flats))
            if not keep:
                self._free(u)
            return output
        return hook

    def _make_pre_backward(self, u):
        @_eager
        def hook(grad):
            if not self._backward_queued:
                self._backward_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            if u.awaiting is None:
                u.awaiting = set(p for f in u.flats if f.trainable for p in f.params)
            if u.backward_needs_params:
                self._gather(u, "b")
            else:
                self._stand_in(u)
            if u in self.order:
                self._prefetch(len(self.order) - 1 - self.order[::-1].index(u), -1, "b")
            return grad
        return hook

    def _end_backward(self):
        """After a backward pass: starts what the hooks did not (so every rank starts the
        same reductions) and frees every unit."""
        self._backward_queued = False
        done = self._passes_done()
        for f in self.flats:
            if f.trainable and (f.arrived or f.launched < done):
                self._launch(f)
        for u in self.units:
            u.awaiting = None
            if u.handles:
                self._gather(u, None)
            self._free(u)

    def _passes_done(self):
        return max(self.passes.values()) if self.passes else 0

    def _register_grad_hook(self, p):
        return register_grad_ready_hook(p, lambda: self._on_grad(p))

    # ---- gradients ------------------------------------------------------------------------

    def _on_grad(self, p):
        if p.grad is None:
            return
        check_gradient(p, self.names[p], self.passes[p], self.backward_passes_per_step,
                       "shard_model")
        self.passes[p] += 1
        f, i = self.flat_of[p]
        if p in f.arrived:  # a second pass before the flat's other gradients arrived
            self._launch(f)
        if len(f.params) == 1:
            f.grad_full, f.direct = p.grad.reshape(-1), True
        else:
            if f.grad_full is None:
                f.grad_full = torch.empty(f.length, dtype=f.dtype, device=f.device)
            view = f.view(f.grad_full, i)
            if self.op == Average and self.size > 1:
                torch.mul(p.grad, 1.0 / self.size, out=view)
            else:
                view.copy_(p.grad)
        p.grad = None
        f.arrived.add(p)
        if len(f.arrived) == len(f.params):
            self._launch(f)
        u = f.unit
        if u.awaiting is not None:
            u.awaiting.discard(p)
            # Every gradient of the unit is in: its parameters are not needed again in this
            # backward (a unit with frozen parameters keeps them until the end: they may still
            # be needed for the gradient of its input).
            if not u.awaiting and all(g.trainable for g in u.flats):
                self._free(u)

    def _launch(self, f):
        """Starts the reduce-scatter of flat f's gradient (zeros where it has none)."""
        if f.grad_full is None:
            f.grad_full = torch.zeros(f.length, dtype=f.dtype, device=f.device)
        elif not f.direct:
            for i, p in enumerate(f.params):
                if p not in f.arrived:
                    f.view(f.grad_full, i).zero_()
        if self.size == 1:
            f.handles.append(f.grad_full)
        else:
            while 0 < self.reductions_in_flight <= len(self._reducing):
                self._complete_oldest(self._reducing[0])
            op = self.op if f.direct else Sum
            # (measured: a flat divided by the ranks before the reduction counts size^2 more)
            scale = 1.0 if f.direct or self.op != Average else float(self.size) ** 2
            group = self.stats.group(self._flat_index[id(f)], scale, f.grad_full, f.grad_full)
            f.handles.append(_reducescatter_async(
                f.grad_full, "sharded3.reduce.%s.%d" % (f.label, f.launched), op,
                self.process_set, 1.0, 1.0, group))
            self._reducing.append(f)
        f.direct = False
        f.grad_full = None  # the handle keeps it until the reduction is done
        f.launched += 1
        f.arrived = set()
        self.in_flight = True
        self._drain(wait=False)

    def _drain(self, wait):
        for f in self.flats:
            while f.handles and (wait or torch.is_tensor(f.handles[0]) or poll(f.handles[0])):
                self._complete_oldest(f)

    def _complete_oldest(self, f):
        """Waits for flat f's oldest reduction and adds its result to f's slice gradient."""
        h = f.handles[0]
        out = h if torch.is_tensor(h) else self._wait(h)
        f.handles.pop(0)
        if not torch.is_tensor(h):
            self._reducing.remove(f)  # (its first entry: f's reductions complete in order)
        f.shard_grad = out if f.shard_grad is None else f.shard_grad.add_(out)

    def finish_reductions(self):
        """Starts the reductions no backward started, waits for all; each trainable flat's
        ``shard_grad`` is then the reduced gradient of this rank's slice."""
        for f in self.flats:
            if not f.trainable:
                continue
            if f.arrived:
                self._launch(f)
            while f.launched < self.backward_passes_per_step:
                self._launch(f)
        self._drain(wait=True)
        for f in self.flats:
            f.launched = 0
        for p in self.passes:
            self.passes[p] = 0
        self.in_flight = False

    def reset_step(self):
        """Forgets the step under way (after a job reset, whose collectives are gone): drops
        every handle without waiting, frees every unit."""
        for u in self.units:
            dropped = [h for _, h in u.handles if not torch.is_tensor(h)]
            u.handles, u.awaiting = [], None
            if dropped:  # (their storage stays: a gather dropped unwaited may still write it)
                for f in u.flats:
                    for p in f.params:
                        p.data = empty_like(p)
                u.gathered = False
            else:
                self._free(u)
        for f in self.flats:
            f.handles, f.arrived, f.launched, f.grad_full, f.direct = [], set(), 0, None, False
            f.shard_grad = None
            for p in f.params:
                p.grad = None
        for p in self.passes:
            self.passes[p] = 0
        self.in_flight = False
        self._reducing.clear()
        self._backward_queued = False

    def relayout(self, process_set):
        """Splits every flat buffer over ``process_set``'s ranks (after an elastic resize);
        the slices' contents are set afterwards (zeros until then)."""
        self.reset_step()
        self.process_set = process_set
        self.size, self.rank = process_set.size(), process_set.rank()
        for f in self.flats:
            f.start, f.end = shard_range(f.length, self.size, self.rank)
            f.shard = torch.zeros(f.end - f.start, dtype=f.dtype, device=f.device)

    def zero_grad(self):
        for f in self.flats:
            f.shard_grad = None
            f.arrived = set()
            for p in f.params:
                p.grad = None
        for p in self.passes:
            self.passes[p] = 0

    # ---- whole parameters and state -------------------------------------------------------

    @contextlib.contextmanager
    def gathered(self, writeback=False):
        """Collective: every parameter whole inside the block (FSDP's summon_full_params);
        with ``writeback``, changes made to them are kept (each rank keeps its slice)."""
        for u in self.units:
            self._start_gather(u, "s")
        for u in self.units:
            self._gather(u, "s")
        try:
            yield self.model
        finally:
            if writeback and self.size > 1:  # (at one rank the parameters are the slice)
                with torch.no_grad():
                    for f in self.flats:
                        f.shard.copy_(f.full[f.start:f.end])
            for u in self.units:
                self._free(u)

    def state_dict(self, to=0):
        """Collective: the model's full state_dict (CPU copies) on rank ``to`` of the process
        set (every rank with ``to=None``); an empty dict elsewhere."""
        with self.gathered():
            if to is None or self.rank == to:
                return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return {}

    def load_state_dict(self, state_dict, strict=True):
        """Loads a full state_dict (saved at any world size, or by the unsharded model); each
        rank keeps its slice."""
        with self.gathered(writeback=True):
            return self.model.load_state_dict(state_dict, strict=strict)

    def sharded_state_dict(self):
        """This rank's slices of the parameters (no communication): save one per rank;
        ``load_sharded_state_dict`` takes every rank's at any world size."""
        return {"world_size": self.size, "rank": self.rank, "flats": [
            {"names": list(f.names), "length": f.length, "start": f.start, "end": f.end,
             "shard": f.shard.detach().cpu().clone()} for f in self.flats]}

    def load_sharded_state_dict(self, saved):
        """Loads the slices that ``sharded_state_dict`` gave on every rank of a job of any
        size (``saved``: all of them, in any order); each rank copies the ranges of its own
        slices from the saved slices that overlap them."""
        saved = check_saved_ranks(saved, "sharded_state_dict")
        with torch.no_grad():
            for i, f in enumerate(self.flats):
                for sd in saved:
                    entry = sd["flats"][i] if i < len(sd["flats"]) else None
                    if entry is None or entry["names"] != f.names or \
                            entry["length"] != f.length:
                        raise ValueError("load_sharded_state_dict: the saved model's layout "
                                         "differs from this one's at %s (same model, same "
                                         "auto_wrap?)" % f.label)
                    copy_overlap(f.shard, f.start, f.end, entry["shard"], entry["start"],
                                  entry["end"])

    def held_bytes(self):
        """{'parameters', 'gradients'}: bytes this rank holds now, counted from the tensors."""
        params = sum(f.shard.numel() * f.shard.element_size() + storage_bytes(f.full)
                     for f in self.flats)
        grads = sum(f.shard_grad.numel() * f.shard_grad.element_size()
                    for f in self.flats if f.shard_grad is not None)
        return {"parameters": params, "gradients": grads}

    def remove(self):
        """Removes the hooks; the parameters are whole again (collective)."""
        for u in self.units:
            self._gather(u, "s")
        for h in self._hooks:
            if hasattr(h, "remove"):
                h.remove()
        self._hooks = []



def shard_model(model, auto_wrap=None, process_set=global_process_set, op=Average,
                backward_passes_per_step=1, prefetch=True, param_init_fn=None, device=None,
                reductions_in_flight=1):
    """Shards ``model``'s parameters over the ranks of ``process_set`` (in place; returns the
    model). ``auto_wrap``: which submodules gather and free their parameters on their own: a
    set of module classes, a callable ``fn(module) -> bool``, or a minimum number of
    parameters; None: the whole model is one unit. Use with ``ShardedOptimizer(...,
    stage=3)``.

    A built model: every rank must start from the same parameters (broadcast them first).
    A model built on the meta device (``torch.device("meta")``, or under
    ``hvd.sharded_init()``) is never whole: each module in turn is initialised on the CPU by
    its ``reset_parameters()``, or by ``param_init_fn(module)`` when given (which must set the
    module's own parameters and buffers, real but unset when it is called), from rank 0's
    random state, and each rank keeps its slices, on ``device`` (default: the CPU). The same
    seed gives the same parameters as building the model whole, at any world size, when the
    model's modules are built in the order of ``model.modules()``.

    ``reductions_in_flight``: at most this many gradient reduce-scatters started and not done
    (each keeps its unit's whole flat gradient until it is); starting one more first waits for
    the oldest. 1 (FSDP2 keeps one too) bounds backward's memory to about four units whatever
    the ranks' skew; 0: no bound (a rank ahead of the others may hold one flat gradient per
    unit it is ahead by)."""
    if getattr(model, "_hvd_sharded", None) is not None:
        raise ValueError("shard_model: this model is sharded already")
    model._hvd_sharded = ShardedModel(model, auto_wrap, process_set, op,
                                      backward_passes_per_step, prefetch, param_init_fn,
                                      device, reductions_in_flight)
    return model


def sharding_of(model):
    """The ShardedModel of a model given to shard_model."""
    sharded = getattr(model, "_hvd_sharded", None)
    if sharded is None:
        raise ValueError("this model has not been given to hvd.shard_model")
    return sharded
