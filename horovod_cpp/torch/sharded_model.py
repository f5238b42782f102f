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
  prefetches the unit before it); each parameter's gradient goes into the flat gradient of its
  unit (scaled by 1/N for op=Average, and dropped at once), and once every trainable parameter
  of a flat buffer has its gradient the buffer is reduce-scattered: each rank keeps the reduced
  gradient of its slice only, and the gathered parameters are freed. At the end of backward the
  reductions the hooks did not start (parameters without a gradient: zeros) are started, so
  every rank runs the same collectives, and whatever is still gathered is freed.
* A rank whose forward differs from the others' (a unit it skips) waits for collectives the
  others never start: the runtime's deadlock detection ends that as an error on every rank,
  naming what each rank waits for (the collectives are named after the units' modules).

``ShardedOptimizer(..., stage=3)`` steps each parameter's part of this rank's slice (views of
the slice: parameter groups with their own hyperparameters work) and does not gather after the
step: the next forward does.
"""
import contextlib

import torch

from horovod_cpp.torch.basics import Average, HorovodNotSupportedError, Sum
from horovod_cpp.torch.collectives import allgather, allgather_async, reducescatter_async
from horovod_cpp.torch.tensor_bridge import poll, synchronize
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.functions import allgather_object
from horovod_cpp.torch.sharded import (ShardedOptimizer, check_gradient,
                                       clip_slices_by_global_norm, is_element_state,
                                       nonfinite_flag_grad, register_grad_ready_hook,
                                       shard_range)


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _storage_bytes(t):
    s = _storage(t)
    return s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()


def _resize_storage(t, numel):
    """Frees (numel 0) or reallocates the storage under ``t`` and every view of it."""
    s = _storage(t)
    if hasattr(t, "untyped_storage"):
        s.resize_(numel * t.element_size())
    else:
        s.resize_(numel)


def _eager(fn):
    """``fn`` run as it is under torch.compile (a graph break around it): the hooks gather,
    free and reduce through the runtime, which the compiler must not trace."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "disable"):
        return compiler.disable(fn)
    return fn


_EMPTY = {}


def _empty_like(p):
    key = (p.dtype, p.device)
    if key not in _EMPTY:
        _EMPTY[key] = torch.empty(0, dtype=p.dtype, device=p.device)
    return _EMPTY[key]


class _Flat(object):
    """One unit's parameters of one dtype, device and requires_grad, as one flat buffer of
    which this rank stores the slice [start, end)."""

    def __init__(self, index, unit, params, names, size, rank):
        self.index = index
        self.unit = unit
        self.params = params
        self.names = names
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = []
        offset = 0
        for p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.length = offset
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.trainable = params[0].requires_grad
        self.start, self.end = shard_range(self.length, size, rank)
        with torch.no_grad():
            whole = torch.cat([p.detach().reshape(-1) for p in params])
            self.shard = whole[self.start:self.end].clone()
        del whole
        # The gathered parameters live in `full`; its storage is freed between uses (views of
        # it that autograd saved for backward are filled again before the backward runs).
        self.full = torch.empty(self.length, dtype=self.dtype, device=self.device)
        _resize_storage(self.full, 0)
        self.gathering = None   # allgather handle in flight
        self.grad_full = None   # the flat gradient being filled (this pass)
        self.direct = False     # grad_full is a parameter's own gradient (a one-parameter flat)
        self.arrived = set()
        self.launched = 0       # reductions started this step
        self.handles = []       # their handles, oldest first
        self.shard_grad = None  # the reduced gradient of the slice, summed over this step

    def view(self, flat, i):
        off = self.offsets[i]
        return flat[off:off + self.numels[i]].view(self.shapes[i])

    @property
    def label(self):
        return "%s.%d" % (self.unit.name or "root", self.index)


class _Unit(object):
    def __init__(self, index, module, name):
        self.index = index
        self.module = module
        self.name = name
        self.flats = []
        self.gathered = False
        self.handles = []
        self.awaiting = None  # in backward: trainable parameters whose gradient is to come


class ShardedModel(object):
    """The sharding of one model (``model._hvd_sharded``); made by ``shard_model``."""

    def __init__(self, model, auto_wrap, process_set, op, backward_passes_per_step, prefetch):
        if op not in (Average, Sum):
            raise HorovodNotSupportedError("shard_model supports op=Average and op=Sum")
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
        self.units = self._make_units(model, auto_wrap)
        self.flats = [f for u in self.units for f in u.flats]
        self.flat_of = {}
        self.names = {}
        for f in self.flats:
            for i, (p, name) in enumerate(zip(f.params, f.names)):
                self.flat_of[p] = (f, i)
                self.names[p] = name
                p._hvd_sharding = self
        self.order = []          # units in the order of the last forward
        self._recording = []
        self._depth = 0
        self._backward_queued = False
        self.passes = {p: 0 for f in self.flats if f.trainable for p in f.params}
        self.in_flight = False
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
                p.data = _empty_like(p)

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

    def _make_units(self, model, auto_wrap):
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
                u.flats.append(_Flat(index, u, ps, [names[p] for p in ps], size, rank))
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
            else:
                u.handles.append((f, allgather_async(
                    f.shard, name="sharded3.gather.%s.%s" % (f.label, tag),
                    process_set=self.process_set)))

    def _gather(self, u, tag):
        """Makes unit u's parameters whole (waits for its allgather, started here if not
        prefetched)."""
        if u.gathered:
            return
        self._start_gather(u, tag)
        with torch.no_grad():
            for f, h in u.handles:
                out = h if torch.is_tensor(h) else self._wait(h)
                _resize_storage(f.full, f.length)
                f.full.copy_(out)
                del out
                for i, p in enumerate(f.params):
                    p.data = f.view(f.full, i)
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

    def _free(self, u):
        if not u.gathered:
            return
        for f in u.flats:
            for p in f.params:
                p.data = _empty_like(p)
            _resize_storage(f.full, 0)
        u.gathered = False

    def _prefetch(self, position, step, tag):
        """Starts the allgather of the unit ``step`` places after ``position`` in the last
        forward's order."""
        k = position + step
        if self.prefetch and 0 <= k < len(self.order):
            self._start_gather(self.order[k], tag)

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
            self._gather(u, "b")
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
            op = self.op if f.direct else Sum
            f.handles.append(reducescatter_async(
                f.grad_full, name="sharded3.reduce.%s.%d" % (f.label, f.launched), op=op,
                process_set=self.process_set))
        f.direct = False
        f.grad_full = None  # the handle keeps it until the reduction is done
        f.launched += 1
        f.arrived = set()
        self.in_flight = True
        self._drain(wait=False)

    def _drain(self, wait):
        for f in self.flats:
            while f.handles and (wait or torch.is_tensor(f.handles[0]) or poll(f.handles[0])):
                h = f.handles.pop(0)
                out = h if torch.is_tensor(h) else self._wait(h)
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
            u.handles, u.awaiting = [], None
            self._free(u)
        for f in self.flats:
            f.handles, f.arrived, f.launched, f.grad_full, f.direct = [], set(), 0, None, False
            f.shard_grad = None
            for p in f.params:
                p.grad = None
        for p in self.passes:
            self.passes[p] = 0
        self.in_flight = False
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
            if writeback:
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
        saved = _check_saved_ranks(saved, "sharded_state_dict")
        with torch.no_grad():
            for i, f in enumerate(self.flats):
                for sd in saved:
                    entry = sd["flats"][i] if i < len(sd["flats"]) else None
                    if entry is None or entry["names"] != f.names or \
                            entry["length"] != f.length:
                        raise ValueError("load_sharded_state_dict: the saved model's layout "
                                         "differs from this one's at %s (same model, same "
                                         "auto_wrap?)" % f.label)
                    _copy_overlap(f.shard, f.start, f.end, entry["shard"], entry["start"],
                                  entry["end"])

    def held_bytes(self):
        """{'parameters', 'gradients'}: bytes this rank holds now, counted from the tensors."""
        params = sum(f.shard.numel() * f.shard.element_size() + _storage_bytes(f.full)
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


def _check_saved_ranks(saved, what):
    """The saved per-rank dicts, sorted by rank, checked to be one whole job's."""
    saved = sorted(saved, key=lambda sd: sd["rank"])
    sizes = {sd["world_size"] for sd in saved}
    if len(sizes) != 1 or [sd["rank"] for sd in saved] != list(range(sizes.pop())):
        raise ValueError("%s: give the dicts of every rank of the saved job (got ranks %s of "
                         "world sizes %s)" % (what, [sd["rank"] for sd in saved],
                                              sorted({sd["world_size"] for sd in saved})))
    return saved


def _copy_overlap(dst, dst_start, dst_end, src, src_start, src_end):
    """Copies the part of src (the range [src_start, src_end) of a flat buffer) that overlaps
    dst (the range [dst_start, dst_end) of the same buffer) into dst."""
    lo, hi = max(dst_start, src_start), min(dst_end, src_end)
    if lo < hi:
        dst[lo - dst_start:hi - dst_start].copy_(src[lo - src_start:hi - src_start])


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


def shard_model(model, auto_wrap=None, process_set=global_process_set, op=Average,
                backward_passes_per_step=1, prefetch=True):
    """Shards ``model``'s parameters over the ranks of ``process_set`` (in place; returns the
    model). ``auto_wrap``: which submodules gather and free their parameters on their own: a
    set of module classes, a callable ``fn(module) -> bool``, or a minimum number of
    parameters; None: the whole model is one unit. Every rank must start from the same
    parameters (broadcast them first). Use with ``ShardedOptimizer(..., stage=3)``."""
    if getattr(model, "_hvd_sharded", None) is not None:
        raise ValueError("shard_model: this model is sharded already")
    model._hvd_sharded = ShardedModel(model, auto_wrap, process_set, op,
                                      backward_passes_per_step, prefetch)
    return model


def sharding_of(model):
    """The ShardedModel of a model given to shard_model."""
    sharded = getattr(model, "_hvd_sharded", None)
    if sharded is None:
        raise ValueError("this model has not been given to hvd.shard_model")
    return sharded


class _Piece(object):
    """The part of one parameter that lies in this rank's slice of its flat buffer."""

    def __init__(self, param, flat, i):
        self.param, self.flat, self.i = param, flat, i
        begin = flat.offsets[i]
        lo, hi = max(begin, flat.start), min(begin + flat.numels[i], flat.end)
        self.lo, self.hi = lo - flat.start, hi - flat.start    # in the slice
        self.p_lo, self.p_hi = lo - begin, hi - begin          # in the parameter, flattened
        self.tensor = torch.nn.Parameter(flat.shard[self.lo:self.hi]) if lo < hi else None


@ShardedOptimizer.register_stage(3)
class FullyShardedOptimizer(ShardedOptimizer):
    """``ShardedOptimizer(params, optimizer_class, stage=3, **defaults)`` over the parameters
    of a model given to ``shard_model``: the wrapped optimizer steps, for each parameter, the
    part of it in this rank's slice (a view of the slice), so it holds state for that part
    alone; nothing is gathered after the step (the next forward gathers what it uses)."""

    def __init__(self, params, optimizer_class, stage=3, process_set=None,
                 backward_passes_per_step=None, op=None, bucket_cap_mb=None, **defaults):
        compression = defaults.pop("compression", None)
        if compression is not None and compression is not Compression.none:
            raise HorovodNotSupportedError(
                "ShardedOptimizer(stage=3) does not compress: its gradients are reduce-scattered "
                "by hvd.shard_model's hooks in their own dtype (stages 1 and 2 take fp16 and "
                "bf16)")
        groups, names = ShardedOptimizer._normalize(params)
        shardings = {getattr(p, "_hvd_sharding", None) for g in groups for p in g["params"]}
        if None in shardings or len(shardings) != 1:
            raise ValueError("ShardedOptimizer(stage=3) takes the parameters of one model "
                             "given to hvd.shard_model(model, ...) first (%s)"
                             % ("some parameters are not sharded" if None in shardings
                                else "parameters of several sharded models"))
        self.sharding = sharding = shardings.pop()
        for given, have, what in ((process_set, sharding.process_set, "process_set"),
                                  (backward_passes_per_step, sharding.backward_passes_per_step,
                                   "backward_passes_per_step"), (op, sharding.op, "op")):
            if given is not None and given != have:
                raise ValueError("ShardedOptimizer(stage=3): %s belongs to shard_model (the "
                                 "model's is %r, got %r)" % (what, have, given))
        self.stage = 3
        self.process_set = sharding.process_set
        self._size, self._rank = sharding.size, sharding.rank
        self._names = names
        self._groups_params = [g["params"] for g in groups]
        self._optimizer_class = optimizer_class
        self._defaults = dict(defaults)
        self._finite_flag = torch.nn.Parameter(torch.zeros(1))
        self._build_inner([{k: v for k, v in g.items() if k != "params"} for g in groups])
        self._committed = None    # elastic: the last commit (see _ElasticShards)
        self._pending = None
        self._commit_id = -1
        self.agreed_commit = None
        self._holders = None
        self._building = True
        torch.optim.Optimizer.__init__(self, self.optim.param_groups, self.optim.defaults)
        self._building = False
        self.param_groups = self.optim.param_groups
        self.state = self.optim.state
        self._reduced = False
        self._consolidated = None

    def _build_inner(self, hypers):
        """(Re)builds the wrapped optimizer over the parts of this rank's slices, one group per
        given group of hyperparameters (the finite flag in group 0); its state starts empty."""
        self._pieces = [[_Piece(p, *self.sharding.flat_of[p]) for p in params
                         if p.requires_grad] for params in self._groups_params]
        inner = []
        for gi, hyper in enumerate(hypers):
            ts = [pc.tensor for pc in self._pieces[gi] if pc.tensor is not None]
            if gi == 0:
                ts.append(self._finite_flag)
            inner.append(dict(hyper, params=ts))
        self.optim = self._optimizer_class(inner, **self._defaults)

    def _reductions_pending(self):
        return self.__dict__.get("sharding") is not None and self.sharding.in_flight

    def _finish_reductions(self):
        if self._reduced and not self.sharding.in_flight:
            return
        self.sharding.finish_reductions()
        for pieces in self._pieces:
            for pc in pieces:
                if pc.tensor is not None:
                    g = pc.flat.shard_grad
                    pc.tensor.grad = None if g is None else g[pc.lo:pc.hi]
        self._finite_flag.grad = nonfinite_flag_grad(
            [f.shard_grad for f in self.sharding.flats if f.trainable], self.process_set,
            "sharded3.nonfinite")
        self._reduced = True

    def zero_grad(self, set_to_none=True):
        if self.sharding.in_flight:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() "
                                 "but before optimizer.step() or optimizer.synchronize(). "
                                 "This is prohibited as it can cause a race condition.")
        self.sharding.zero_grad()
        for pieces in self._pieces:
            for pc in pieces:
                if pc.tensor is not None:
                    pc.tensor.grad = None
        self._finite_flag.grad = None
        self._reduced = False

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the gradients of every shard by their global norm (the norm of the whole,
        unsharded gradient), as torch.nn.utils.clip_grad_norm_ would; returns that norm."""
        self._finish_reductions()
        return clip_slices_by_global_norm(
            [f.shard_grad for f in self.sharding.flats if f.trainable], max_norm, norm_type,
            self.process_set, "sharded3.clip")

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._finish_reductions()
        self._finite_flag.grad = None
        self.optim.step()
        self._reduced = False
        return loss

    # ---- checkpoints ----------------------------------------------------------------------

    def _local_slices(self):
        """{flat index: {"param": this rank's slice of the parameters, state key: that state
        over the slice (zeros where a parameter has none), "scalars": {parameter index: its
        other state (Adam's step)}}}; a parameter with any state has an entry in "scalars"
        (maybe empty), which is how _install knows which parameters had state."""
        index = self._param_index()
        out = {f.index: {"param": f.shard, "scalars": {}} for f in self.sharding.flats}
        for pieces in self._pieces:
            for pc in pieces:
                st = self.optim.state.get(pc.tensor, {}) if pc.tensor is not None else {}
                if not st:
                    continue
                f, entry = pc.flat, out[pc.flat.index]
                scalars = entry["scalars"].setdefault(index[pc.param], {})
                for k, v in st.items():
                    if is_element_state(v, pc.tensor):
                        if k not in entry:
                            entry[k] = torch.zeros(f.end - f.start, dtype=v.dtype,
                                                   device=v.device)
                        entry[k][pc.lo:pc.hi].copy_(v)
                    else:
                        scalars[k] = v.clone() if torch.is_tensor(v) else v
        return out

    def consolidate_state_dict(self, to=0):
        """Collective: gathers the full optimizer state (the unsharded optimizer's format) on
        rank ``to`` of the process set (every rank with ``to=None``); ``state_dict()`` then
        returns it there."""
        self._consolidated = None
        index = self._param_index()
        local = self._local_slices()
        mine = {fi: {k: v.dtype for k, v in sl.items() if k not in ("param", "scalars")}
                for fi, sl in local.items()}
        scalars = {pi: e for sl in local.values() for pi, e in sl["scalars"].items()}
        everyone = allgather_object((mine, scalars), name="sharded3.state.meta",
                                    process_set=self.process_set)
        keys, all_scalars = {}, {}
        for m, sc in everyone:
            for fi, ks in m.items():
                keys.setdefault(fi, {}).update(ks)
            for pi, entries in sc.items():
                all_scalars.setdefault(pi, {}).update(entries)
        full = {}
        for f in self.sharding.flats:
            for k, dtype in sorted(keys.get(f.index, {}).items()):
                mine_k = local[f.index].get(k)
                if mine_k is None:
                    mine_k = torch.zeros(f.end - f.start, dtype=dtype, device=f.device)
                full[(f.index, k)] = allgather(mine_k, name="sharded3.state.%s.%s"
                                               % (f.label, k), process_set=self.process_set)
        if to is not None and self.sharding.rank != to:
            return
        state = {}
        for pieces in self._pieces:
            for pc in pieces:
                pi = index[pc.param]
                if pi not in all_scalars:  # no state (never stepped)
                    continue
                entry = dict(all_scalars[pi])
                for k in keys.get(pc.flat.index, {}):
                    entry[k] = pc.flat.view(full[(pc.flat.index, k)], pc.i).clone()
                state[pi] = entry
        self._consolidated = {"state": state, "param_groups": [
            dict(h, params=[index[p] for p in ps])
            for h, ps in zip(self._hyperparameters(), self._groups_params)]}

    def load_state_dict(self, state_dict):
        """Loads a full (unsharded) optimizer state, saved at any world size (by
        ``consolidate_state_dict``/``state_dict`` or by the unsharded optimizer); this rank
        keeps the parts of its slice."""
        groups = self._check_loaded_groups(state_dict)
        saved = state_dict["state"]
        index = self._param_index()
        slices = {f.index: {"scalars": {}} for f in self.sharding.flats}
        for gi, pieces in enumerate(self._pieces):
            pos = {p: j for j, p in enumerate(self._groups_params[gi])}
            for pc in pieces:
                entry = saved.get(groups[gi]["params"][pos[pc.param]])
                if pc.tensor is None or not entry:
                    continue
                f, sl = pc.flat, slices[pc.flat.index]
                scalars = sl["scalars"].setdefault(index[pc.param], {})
                for k, v in entry.items():
                    if k != "step" and torch.is_tensor(v) and v.shape == f.shapes[pc.i]:
                        if k not in sl:
                            sl[k] = torch.zeros(f.end - f.start, dtype=v.dtype,
                                                device=f.device)
                        sl[k][pc.lo:pc.hi].copy_(v.reshape(-1)[pc.p_lo:pc.p_hi])
                    else:
                        scalars[k] = v.clone() if torch.is_tensor(v) else v
        self.zero_grad()
        self._install(slices, [{k: v for k, v in g.items() if k != "params"} for g in groups])

    def sharded_state_dict(self):
        """This rank's part of the optimizer state (no communication): per flat buffer, each
        per-element state over this rank's slice, and per parameter its scalar state (Adam's
        step); save one per rank, ``load_sharded_state_dict`` takes every rank's at any world
        size."""
        local = self._local_slices()
        return {"world_size": self.sharding.size, "rank": self.sharding.rank,
                "ranges": [(f.start, f.end) for f in self.sharding.flats],
                "flats": {fi: {k: v.cpu().clone() for k, v in sl.items()
                               if k not in ("param", "scalars")} for fi, sl in local.items()},
                "scalars": {pi: e for sl in local.values() for pi, e in sl["scalars"].items()},
                "param_groups": self._hyperparameters()}

    def load_sharded_state_dict(self, saved):
        """Loads the state that ``sharded_state_dict`` gave on every rank of a job of any size
        (``saved``: all of them); each rank keeps the parts of its slice."""
        saved = _check_saved_ranks(saved, "sharded_state_dict")
        scalars = {}
        for sd in saved:
            for pi, entry in sd["scalars"].items():
                scalars.setdefault(pi, {}).update(entry)
        slices = {}
        for f in self.sharding.flats:
            sl = slices[f.index] = {"scalars": scalars}
            for sd in saved:
                start, end = sd["ranges"][f.index]
                for k, v in sd["flats"].get(f.index, {}).items():
                    if k not in sl:
                        sl[k] = torch.zeros(f.end - f.start, dtype=v.dtype, device=f.device)
                    _copy_overlap(sl[k], f.start, f.end, v, start, end)
        self.zero_grad()
        self._install(slices, saved[0]["param_groups"])

    # ---- elastic (the hooks of _ElasticShards) --------------------------------------------
    #
    # A commit keeps, per flat buffer, this rank's slice of the parameters and of the optimizer
    # state (and each parameter's scalar state, Adam's step), with a replica on another rank;
    # a reshard re-splits every flat buffer over the ranks there are and gives each rank the
    # ranges of its new slices: the parameters too, since no rank holds them whole.

    def _elastic_slices(self):
        return self._local_slices()

    def _elastic_keys(self):
        return [f.index for f in self.sharding.flats]

    def _elastic_relayout(self, hypers):
        self.sharding.relayout(self.process_set)
        self._build_inner(hypers)

    def _elastic_reslice(self, key, old_slices, old_size):
        f = self.sharding.flats[key]
        present = [sl for sl in old_slices if sl]
        if not present:
            return None
        out = {"scalars": {}}
        for sl in present:
            for pi, entry in sl.get("scalars", {}).items():
                out["scalars"].setdefault(pi, {}).update(entry)
        for k, v in present[0].items():
            if k == "scalars":
                continue
            new = torch.zeros(f.end - f.start, dtype=v.dtype, device=f.device)
            for old, sl in enumerate(old_slices):
                if sl and k in sl:
                    lo, hi = shard_range(f.length, old_size, old)
                    _copy_overlap(new, f.start, f.end, sl[k], lo, hi)
            out[k] = new
        return out

    def _install(self, slices, hypers):
        """Makes {flat index: slice} (the parameters' slice, per-element state over it, and
        per-parameter scalars) this rank's, with the groups' hyperparameters."""
        with torch.no_grad():
            for f in self.sharding.flats:
                sl = slices.get(f.index)
                if sl is not None and "param" in sl:
                    f.shard = sl["param"].to(device=f.device, dtype=f.dtype).clone()
        self.sharding.reset_step()
        self._build_inner(hypers)
        index = self._param_index()
        inner = self.optim.state_dict()
        order = {t: k for k, t in enumerate(
            t for g in self.optim.param_groups for t in g["params"])}
        state = {}
        for pieces in self._pieces:
            for pc in pieces:
                sl = slices.get(pc.flat.index)
                if pc.tensor is None or sl is None or index[pc.param] not in sl["scalars"]:
                    continue  # (a parameter without state keeps none)
                entry = {k: v[pc.lo:pc.hi].clone() for k, v in sl.items()
                         if k not in ("param", "scalars")}
                for k, v in sl["scalars"][index[pc.param]].items():
                    entry[k] = v.clone() if torch.is_tensor(v) else v
                state[order[pc.tensor]] = entry
        inner["state"] = state
        self.optim.load_state_dict(inner)
        self.param_groups = self.optim.param_groups
        self.state = self.optim.state
        self._consolidated = None
        self._reduced = False
        self._finite_flag.grad = None

    def held_bytes(self):
        """{'parameters', 'gradients', 'optimizer_state'}: bytes this rank holds now, counted
        from the tensors."""
        held = self.sharding.held_bytes()
        state = 0
        for v in self.optim.state.values():
            for t in v.values():
                if torch.is_tensor(t):
                    state += t.numel() * t.element_size()
        held["optimizer_state"] = state
        return held
