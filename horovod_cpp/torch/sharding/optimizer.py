"""ShardedOptimizer: optimizer state (stage 1) and gradients too (stage 2) split over the ranks.

    optimizer = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=2,
                                     lr=1e-3)

The constructor follows torch's ``ZeroRedundancyOptimizer(params, optimizer_class, **defaults)``
(the wrapped optimizer is built here, for this rank's shard only); everything else keeps
Horovod's names (``process_set``, ``backward_passes_per_step``, ``op``).

Layout. The parameters that require a gradient are packed, per parameter group, dtype and
device, in reverse registration order (the order backward produces their gradients), into flat
buckets of at most ``bucket_cap_mb``; each parameter's ``.data`` becomes a view of its bucket.
Rank ``r`` of ``N`` owns one contiguous slice of every bucket, split as reducescatter splits
dim 0 (``L // N`` elements each, the first ``L % N`` ranks one more). The wrapped optimizer
holds one parameter per bucket: a view of this rank's slice, so its state covers that slice
alone.

Stage 1: each bucket's gradient is allreduced (in place, overlapped with backward, once every
parameter of the bucket has its gradient); the full averaged gradient stays in ``p.grad``.
Stage 2: each bucket's gradient is reduce-scattered as soon as it is complete, and the
parameters' ``.grad`` is dropped as soon as it has been copied into the bucket: a rank keeps
the averaged gradient of its slice only. With ``backward_passes_per_step`` > 1, stage 1
accumulates locally and reduces once; stage 2 reduce-scatters every pass and accumulates the
slice (the full gradient is never held across passes).

``step()`` waits for the reductions, steps the slice, and allgathers every bucket's updated
slices into the parameters (at most two buckets in flight, to bound the temporary memory).

``optimizer.param_groups`` are the wrapped optimizer's groups: hyperparameters as usual (LR
schedulers work), ``params`` are this rank's slices, plus, in group 0, one 1-element tensor
whose gradient is +inf when any rank's slice has a non-finite gradient (0 otherwise): AMP's
``GradScaler`` reads the gradients through ``param_groups``, so its inf/NaN check sees every
shard and every rank skips the same steps. It costs one 4-byte allreduce per step."""
import torch

from horovod_cpp.torch.basics import Average, HorovodNotSupportedError, Sum
from horovod_cpp.torch.collectives import (_allreduce_in_place, _reducescatter_async,
                                           allgather_async, grouped_allgather)
from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.grad_hooks import register_grad_ready_hook
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.sharding.common import (SliceStats, check_gradient,
                                               clip_slices_by_global_norm, is_element_state,
                                               nonfinite_flag_grad)
from horovod_cpp.torch.sharding.elastic import ElasticShards
from horovod_cpp.torch.sharding.flat import Bucket
from horovod_cpp.torch.tensor_bridge import poll, synchronize


# torch.optim's optimizers whose step updates each parameter from its own gradient and state
# alone: ShardedOptimizer steps them bucket by bucket, each bucket's allgather overlapping the
# next bucket's step. Any other optimizer class steps every slice at once.
_PER_PARAMETER_OPTIMIZERS = tuple(
    getattr(torch.optim, name) for name in (
        "SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam",
        "RMSprop", "Rprop") if hasattr(torch.optim, name))



class ShardedOptimizer(ElasticShards, torch.optim.Optimizer):
    """Shards ``optimizer_class``'s state (``stage=1``) and the gradients too (``stage=2``)
    over the ranks of ``process_set``.

    ``params``: ``model.named_parameters()``, ``model.parameters()``, or parameter groups
    (dicts whose ``params`` are either). ``defaults`` go to ``optimizer_class``.
    """

    # stage -> the subclass that implements it, registered by the module that defines it
    # (stage 3: sharding.stage3's FullyShardedOptimizer), so this module names none above it.
    _stages = {}

    @classmethod
    def register_stage(cls, stage):
        """A class decorator: ``ShardedOptimizer(..., stage=stage)`` constructs the class."""
        def register(subclass):
            cls._stages[stage] = subclass
            return subclass
        return register

    def __new__(cls, params=None, optimizer_class=None, stage=2, *args, **kwargs):
        if cls is ShardedOptimizer and stage in cls._stages:
            # Stage 3 steps the slices of a model given to hvd.shard_model (a subclass: its
            # __init__ runs next).
            return super().__new__(cls._stages[stage])
        return super().__new__(cls)

    def __init__(self, params, optimizer_class, stage=2, process_set=global_process_set,
                 backward_passes_per_step=1, op=Average, bucket_cap_mb=25,
                 compression=Compression.none, **defaults):
        if getattr(compression, "stateful", False):
            raise ValueError("ShardedOptimizer takes Compression.none, fp16 or bf16: PowerSGD "
                             "needs every gradient whole on every rank (and keeps a whole "
                             "error per rank), which is what sharding the gradients avoids; "
                             "use it with hvd.DistributedOptimizer")
        if stage not in (1, 2):
            raise ValueError("stage must be 1 (optimizer state sharded), 2 (gradients too) or "
                             "3 (parameters too: hvd.shard_model), got %r" % (stage,))
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        if op not in (Average, Sum):
            raise HorovodNotSupportedError("ShardedOptimizer supports op=Average and op=Sum")
        if not process_set.included():
            raise ValueError("ShardedOptimizer: this rank is not in %r" % (process_set,))
        self.stage = stage
        self.process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self._compression = compression  # the buckets' reductions travel as it says
        self._bucket_cap = max(1, int(bucket_cap_mb * 1024 * 1024))
        self._optimizer_class = optimizer_class
        self._defaults = dict(defaults)

        groups, self._names = self._normalize(params)
        self._groups_params = [g["params"] for g in groups]  # every parameter, as given
        self._size, self._rank = process_set.size(), process_set.rank()
        self._buckets = self._make_buckets(groups)
        self._bucket_of = {}
        for b in self._buckets:
            b.set_shard(self._size, self._rank)
            if stage == 1:
                b.grad_flat = torch.zeros_like(b.flat)
            for i, p in enumerate(b.params):
                self._bucket_of[p] = (b, i)

        # One 1-element tensor whose gradient says whether any rank's slice is non-finite.
        self._finite_flag = torch.nn.Parameter(torch.zeros(1))
        self._build_inner([{k: v for k, v in g.items() if k != "params"} for g in groups])
        self._building = True
        torch.optim.Optimizer.__init__(self, self.optim.param_groups, self.optim.defaults)
        self._building = False
        self.state = self.optim.state  # the slice's state

        self._passes = {p: 0 for b in self._buckets for p in b.params}
        self._in_flight = False   # reductions started that nobody waited for
        self._reduced = False     # the slices' gradients are ready for step()
        self._consolidated = None
        self._committed = None    # elastic: the last commit (see _elastic_save)
        self._pending = None      # elastic: a commit not yet confirmed by every rank
        self._commit_id = -1
        self.agreed_commit = None
        self._holders = None      # elastic: (size, {rank: the rank that keeps its replica})
        self._hooks = []
        for b in self._buckets:
            for p in b.params:
                self._hooks.append(self._register_hook(p))
        self._stats = SliceStats()  # adaptive training (_measure_gradients)
        self._stats.local_per_pass = stage != 1  # stage 1 reduces the passes' sum once

    # ---- construction ---------------------------------------------------------------------

    @staticmethod
    def _normalize(params):
        """-> (list of group dicts with a list of tensors, {param: name})."""
        params = list(params)
        if not params:
            raise ValueError("ShardedOptimizer got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        names = {}
        groups, seen = [], set()
        for gi, g in enumerate(params):
            if not isinstance(g, dict):
                raise ValueError("parameter groups must all be dicts")
            g = dict(g)
            plist = g["params"]
            plist = [plist] if torch.is_tensor(plist) else list(plist)
            tensors = []
            for j, item in enumerate(plist):
                if isinstance(item, tuple):
                    name, item = item
                else:
                    name = "group%d.param%d" % (gi, j)
                if not isinstance(item, torch.Tensor) or not item.is_leaf:
                    raise ValueError("ShardedOptimizer can only optimize leaf tensors, got %r"
                                     % (type(item),))
                if id(item) in seen:
                    raise ValueError("parameter %s appears twice" % name)
                seen.add(id(item))
                names[item] = name
                tensors.append(item)
            g["params"] = tensors
            groups.append(g)
        return groups, names

    def _make_buckets(self, groups):
        buckets = []
        for gi, g in enumerate(groups):
            by_kind = {}
            for p in reversed(g["params"]):
                if not p.requires_grad:
                    continue
                if p.is_sparse:
                    raise HorovodNotSupportedError("ShardedOptimizer: %s is sparse"
                                                   % self._names[p])
                by_kind.setdefault((p.dtype, str(p.device)), []).append(p)
            for kind in sorted(by_kind, key=lambda k: (str(k[0]), k[1])):
                current, nbytes = [], 0
                for p in by_kind[kind]:
                    size = p.numel() * p.element_size()
                    if current and nbytes + size > self._bucket_cap:
                        buckets.append(Bucket(len(buckets), gi, current))
                        current, nbytes = [], 0
                    current.append(p)
                    nbytes += size
                if current:
                    buckets.append(Bucket(len(buckets), gi, current))
        return buckets

    def _build_inner(self, hypers):
        """(Re)builds the wrapped optimizer over this rank's slices, one group per given group
        of hyperparameters (the finite flag in group 0); its state starts empty."""
        inner_groups = []
        for gi, hyper in enumerate(hypers):
            shards = [b.shard for b in self._buckets if b.group == gi]
            if gi == 0:
                shards.append(self._finite_flag)
            inner_groups.append(dict(hyper, params=shards))
        self.optim = self._optimizer_class(inner_groups, **self._defaults)

    def add_param_group(self, param_group):
        if not self.__dict__.get("_building", True):
            raise HorovodNotSupportedError("ShardedOptimizer.add_param_group after construction "
                                           "is not supported: pass every group to the "
                                           "constructor")
        super().add_param_group(param_group)

    def _register_hook(self, p):
        return register_grad_ready_hook(p, self._make_hook(p))

    # ---- gradients ------------------------------------------------------------------------

    def _make_hook(self, p):
        def hook(*ignore):
            self._on_grad(p)
        return hook

    def _on_grad(self, p):
        if p.grad is None:
            return
        check_gradient(p, self._names[p], self._passes[p], self.backward_passes_per_step,
                       "ShardedOptimizer")
        if self._reduced:
            self._reduced = False  # a backward pass after the last reduction: a new step
        self._passes[p] += 1
        b, i = self._bucket_of[p]
        if self.stage == 1:
            # Accumulates in p.grad as autograd does; the last pass moves it into the bucket.
            if self._passes[p] == self.backward_passes_per_step:
                self._into_bucket(b, i)
                b.arrived.add(p)
                if len(b.arrived) == len(b.params):
                    self._launch(b)
            return
        # Stage 2: into this pass's bucket gradient, then drop the full gradient.
        if p in b.arrived:  # a second pass before the bucket's other gradients arrived
            self._launch(b)
        if len(b.params) == 1:
            # A bucket of one parameter (one larger than the cap: an embedding) reduces its
            # gradient where autograd put it: no copy, no new buffer; op averages.
            b.grad_flat, b.direct = p.grad.reshape(-1), True
            p.grad = None
        else:
            if b.grad_flat is None:
                b.grad_flat = torch.empty_like(b.flat)
            self._into_bucket(b, i)
        b.arrived.add(p)
        if len(b.arrived) == len(b.params):
            self._launch(b)

    def _into_bucket(self, b, i):
        """Moves parameter i's gradient into its place in b.grad_flat, divided by the number of
        ranks for op=Average (so that the reduction is a sum: one pass over the data fewer than
        dividing afterwards); stage 1 leaves p.grad a view of it, stage 2 drops it."""
        p = b.params[i]
        view = b.view(b.grad_flat, i)
        if self.op == Average and self._size > 1:
            torch.mul(p.grad, 1.0 / self._size, out=view)
        else:
            view.copy_(p.grad)
        p.grad = view if self.stage == 1 else None

    def _launch(self, b):
        """Starts the reduction of bucket ``b``'s gradient: zeros for the parameters without
        one (stage 1: what they accumulated in earlier passes, if anything)."""
        if b.grad_flat is None:
            b.grad_flat = torch.zeros_like(b.flat)
        for i, p in enumerate(b.params):
            if p in b.arrived:
                continue
            if self.stage == 1 and p.grad is not None and \
                    p.grad.data_ptr() != b.view(b.grad_flat, i).data_ptr():
                self._into_bucket(b, i)
            else:
                b.view(b.grad_flat, i).zero_()
        name = "sharded.%d.%d" % (b.index, b.launched)
        # (measured: a bucket divided by the ranks before the reduction counts size^2 more)
        scale = 1.0 if b.direct or self.op != Average else float(self._size) ** 2
        if self._size == 1:  # nothing to reduce with: the bucket's gradient is the result
            b.handles.append((b.grad_flat, None))
            b.direct = False
            if self.stage == 2:  # the next pass writes a buffer of its own, not this result
                b.grad_flat = None
        elif self.stage == 1:
            send, ctx = self._compression.compress(b.grad_flat)
            group = self._stats.group(b.index, scale, b.grad_flat, send)
            b.handles.append((_allreduce_in_place(send, name, Sum, 1.0, 1.0, self.process_set,
                                                  group), ctx))
        else:
            op = self.op if b.direct else Sum
            send, ctx = self._compression.compress(b.grad_flat)
            group = self._stats.group(b.index, scale, b.grad_flat, send)
            b.handles.append((_reducescatter_async(send, name, op, self.process_set, 1.0, 1.0,
                                                   group), ctx))
            b.direct = False
            self._drain(wait=False)
            b.grad_flat = None  # the handle keeps it until the reduction is done
        b.launched += 1
        b.arrived = set()
        self._in_flight = True

    def _finish_reductions(self):
        """Starts what the hooks did not (so every rank starts the same reductions), waits,
        and sets each slice's gradient; then the non-finite flag."""
        if self._reduced:
            return
        want = 1 if self.stage == 1 else self.backward_passes_per_step
        for b in self._buckets:
            if b.arrived or b.launched == 0:
                self._launch(b)
            while b.launched < want:
                self._launch(b)
        self._drain(wait=True)
        for b in self._buckets:
            if self.stage == 1:
                b.shard.grad = b.grad_flat[b.start:b.end]
            else:
                b.shard.grad, b.reduced = b.reduced, None
            b.launched = 0
        for p in self._passes:
            self._passes[p] = 0
        self._finite_flag.grad = nonfinite_flag_grad(
            [b.shard.grad for b in self._buckets], self.process_set, "sharded.nonfinite")
        self._in_flight = False
        self._reduced = True

    def _drain(self, wait):
        """Takes the results of the reductions that are done (all of them with ``wait``), in
        order: stage 2 adds each into the bucket's reduced slice and lets go of its input, so
        that a bucket's full gradient lives only until its reducescatter is done."""
        for b in self._buckets:
            while b.handles and (wait or torch.is_tensor(b.handles[0][0]) or
                                 poll(b.handles[0][0])):
                h, ctx = b.handles.pop(0)
                if torch.is_tensor(h):
                    out = h
                else:
                    out = self._compression.decompress(synchronize(h), ctx)
                    if self.stage == 1 and out.data_ptr() != b.grad_flat.data_ptr():
                        b.grad_flat.copy_(out)  # reduced in another dtype: back in place
                if self.stage == 2:
                    b.reduced = out if b.reduced is None else b.reduced.add_(out)

    def synchronize(self):
        """Waits for the gradient reductions (as DistributedOptimizer.synchronize)."""
        self._finish_reductions()

    # ---- adaptive training (horovod_cpp.torch.adaptive; see sharding.common.SliceStats) ----

    def _measure_gradients(self, groups):
        """Measures the buckets' gradient norms (``groups``: anything but None) or stops."""
        self._stats.on = groups is not None

    def _gradient_slices(self):
        """[(stats group, this rank's slice of its reduced gradient)]."""
        return [(b.index, b.shard.grad) for b in self._buckets]

    def _take_gradient_stats(self):
        """Collective, after the reductions: {bucket: [local, reduced]} (SliceStats)."""
        return self._stats.take(self._gradient_slices(), self.process_set, "sharded.grad_stats")

    def _moment_slices(self):
        """Adaptive training's Adam preconditioner: [(stats group, the wrapped optimizer's
        state for this rank's slice of it, the slice's param group)]."""
        groups = {id(p): g for g in self.optim.param_groups for p in g["params"]}
        return [(b.index, self.optim.state.get(b.shard, {}), groups[id(b.shard)])
                for b in self._buckets if id(b.shard) in groups]

    def set_backward_passes_per_step(self, passes):
        """Between steps: the backward passes per step from now on."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes

    def _scale_gradients(self, factor):
        """Multiplies the slices' reduced gradients by ``factor`` (accumulation's mean)."""
        for _, g in self._gradient_slices():
            if g is not None:
                g.mul_(factor)

    def _reductions_pending(self):
        return bool(self.__dict__.get("_in_flight"))

    @property
    def param_groups(self):
        # GradScaler (unscale_, the inf check), clipping and schedulers read the groups after
        # backward: they see the reduced slices.
        if self._reductions_pending():
            self._finish_reductions()
        return self.__dict__["_hvd_param_groups"]

    @param_groups.setter
    def param_groups(self, value):
        self.__dict__["_hvd_param_groups"] = value

    def zero_grad(self, set_to_none=True):
        if self._in_flight:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() "
                                 "but before optimizer.step() or optimizer.synchronize(). "
                                 "This is prohibited as it can cause a race condition.")
        for b in self._buckets:
            for p in b.params:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()
            b.shard.grad = None
            b.arrived = set()
        self._finite_flag.grad = None
        for p in self._passes:
            self._passes[p] = 0
        self._reduced = False

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the gradients of every shard by their global norm (the norm of the whole,
        unsharded gradient), as ``torch.nn.utils.clip_grad_norm_`` would; returns that norm."""
        self._finish_reductions()
        return clip_slices_by_global_norm([b.shard.grad for b in self._buckets], max_norm,
                                          norm_type, self.process_set, "sharded.clip")

    # ---- step -----------------------------------------------------------------------------

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._finish_reductions()
        self._finite_flag.grad = None
        self._update_parameters()
        self._reduced = False
        return loss

    def _update_parameters(self):
        """Steps this rank's slices and brings the updated parameters to every rank."""
        self._step_and_gather()

    def _step_and_gather(self, window=2):
        """Steps the slices bucket by bucket, starting each bucket's allgather into the
        parameters as soon as its slice is stepped, so that the gathers overlap the next
        buckets' steps (at most ``window`` in flight, to bound the temporary memory)."""
        grads = [b.shard.grad for b in self._buckets]
        per_bucket = isinstance(self.optim, _PER_PARAMETER_OPTIMIZERS)
        if per_bucket:
            for b in self._buckets:
                b.shard.grad = None
        else:  # (an optimizer that may couple its parameters: one step, then the gathers)
            self.optim.step()
        pending = []
        with torch.no_grad():
            for b, g in zip(self._buckets, grads):
                if per_bucket:
                    b.shard.grad = g
                    self.optim.step()  # only this slice has a gradient: only it is stepped
                    b.shard.grad = None
                if self._size == 1:
                    continue  # the slice is the bucket: the parameters are stepped already
                pending.append((b, allgather_async(b.shard.detach(),
                                                   name="sharded.gather.%d" % b.index,
                                                   process_set=self.process_set)))
                if len(pending) > window:
                    done, h = pending.pop(0)
                    done.flat.copy_(synchronize(h))
            for done, h in pending:
                done.flat.copy_(synchronize(h))
        for b, g in zip(self._buckets, grads):
            b.shard.grad = g

    # ---- checkpoints ----------------------------------------------------------------------

    def _hyperparameters(self):
        return [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]

    def _slice_state(self, b):
        """{key: value} of bucket b's slice: element state as 1-D tensors, scalars as they are."""
        return self.optim.state.get(b.shard, {})

    def _gather_bucket_state(self, b):
        """{key: (per-element?, value)} of bucket b: per-element state as the full flat tensor
        gathered from every rank's slice, scalars (Adam's step) as they are."""
        st = self._slice_state(b)
        keys = sorted(k for k, v in st.items() if is_element_state(v, b.shard))
        full = {k: (False, v) for k, v in st.items() if k not in keys}
        if keys:
            gathered = grouped_allgather([st[k].detach() for k in keys],
                                         name="sharded.state.%d" % b.index,
                                         process_set=self.process_set)
            full.update((k, (True, v)) for k, v in zip(keys, gathered))
        return full

    def _param_index(self):
        """{parameter: its index in the unsharded optimizer's state_dict}."""
        index = {}
        for params in self._groups_params:
            for p in params:
                index[p] = len(index)
        return index

    def _full_state(self, bucket_states):
        """The unsharded optimizer's state_dict from {bucket index: gathered state}."""
        index = self._param_index()
        state = {}
        for b in self._buckets:
            full = bucket_states[b.index]
            if not full:
                continue
            for i, p in enumerate(b.params):
                state[index[p]] = {
                    k: b.view(v, i).clone() if elem else (v.clone() if torch.is_tensor(v) else v)
                    for k, (elem, v) in full.items()}
        groups = [dict(hyper, params=[index[p] for p in params])
                  for hyper, params in zip(self._hyperparameters(), self._groups_params)]
        return {"state": state, "param_groups": groups}

    def consolidate_state_dict(self, to=0):
        """Gathers the full optimizer state (as the unsharded optimizer would hold it) on rank
        ``to`` of the process set (every rank with ``to=None``); every rank must call it.
        ``state_dict()`` then returns it there."""
        self._consolidated = None
        states = {b.index: self._gather_bucket_state(b) for b in self._buckets}
        if to is None or self._rank == to:
            self._consolidated = self._full_state(states)

    def state_dict(self):
        """The full state gathered by the last ``consolidate_state_dict()`` (on its rank),
        handed over: the optimizer keeps nothing of it (a second call needs another
        consolidation)."""
        if self._consolidated is None:
            raise RuntimeError("ShardedOptimizer.state_dict(): the state is sharded; every rank "
                               "must call optimizer.consolidate_state_dict(to=...) first, and "
                               "state_dict() then returns it once on that rank (this one has "
                               "none)")
        full, self._consolidated = self._consolidated, None
        return full

    def _check_loaded_groups(self, state_dict):
        """A full state's parameter groups, checked against this optimizer's."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self._groups_params) or any(
                len(g["params"]) != len(ps) for g, ps in zip(groups, self._groups_params)):
            raise ValueError("loaded state dict has a different number of parameter groups "
                             "or parameters than this optimizer")
        return groups

    def _slice_from_full(self, b, entries):
        """This rank's slice state of bucket b from the unsharded per-parameter entries."""
        present = [(i, e) for i, e in enumerate(entries) if e]
        if not present:
            return None
        i0, e0 = present[0]
        out = {}
        for k, v in e0.items():
            if k != "step" and torch.is_tensor(v) and v.shape == b.params[i0].shape:
                flat = torch.zeros(b.length, dtype=v.dtype, device=b.device)
                for i, e in present:
                    if k in e:
                        b.view(flat, i).copy_(e[k])
                out[k] = flat[b.start:b.end].clone()
            else:
                out[k] = v.clone() if torch.is_tensor(v) else v
        return out

    def load_state_dict(self, state_dict):
        """Loads a full (unsharded) optimizer state, saved at any world size (by
        ``consolidate_state_dict``/``state_dict`` or by the unsharded optimizer); this rank
        keeps its slice."""
        groups = self._check_loaded_groups(state_dict)
        saved = state_dict["state"]
        slices = {}
        for b in self._buckets:
            pos = {p: j for j, p in enumerate(self._groups_params[b.group])}
            ids = [groups[b.group]["params"][pos[p]] for p in b.params]
            st = self._slice_from_full(b, [saved.get(i) for i in ids])
            if st is not None:
                slices[b.index] = st
        self._install(slices, [{k: v for k, v in g.items() if k != "params"} for g in groups])

    def _install(self, slices, hypers):
        """Makes {bucket index: slice state} and the groups' hyperparameters the wrapped
        optimizer's (through its own load_state_dict, which casts the state as it should)."""
        inner = self.optim.state_dict()
        order = {p: k for k, p in enumerate(
            p for g in self.optim.param_groups for p in g["params"])}
        inner["state"] = {order[b.shard]: slices[b.index] for b in self._buckets
                          if b.index in slices}
        for ig, hyper in zip(inner["param_groups"], hypers):
            ig.update(hyper)
        self.optim.load_state_dict(inner)
        self.param_groups = self.optim.param_groups  # load_state_dict made new group dicts
        self.state = self.optim.state
        self._reset_step()
        self._consolidated = None

    def _reset_step(self):
        """Forgets every gradient and reduction of the step under way (after a load, or a
        reset of the job whose collectives are gone)."""
        self._in_flight = False
        for b in self._buckets:
            b.handles = []
            b.reduced = None
            b.launched = 0
            if self.stage == 2:
                b.grad_flat = None
        self.zero_grad()

    # ---- elastic (the hooks of ElasticShards) --------------------------------------------

    def _elastic_slices(self):
        return {b.index: self._slice_state(b) for b in self._buckets}

    def _elastic_keys(self):
        return [b.index for b in self._buckets]

    def _elastic_relayout(self, hypers):
        for b in self._buckets:
            b.set_shard(self._size, self._rank)
            if self.stage == 1:
                b.grad_flat = torch.zeros_like(b.flat)
        self._build_inner(hypers)

    def _elastic_length(self, key):
        return self._buckets[key].length

    # ---- accounting -----------------------------------------------------------------------

    def held_bytes(self):
        """{'parameters', 'gradients', 'optimizer_state'}: bytes this rank holds, counted from
        the tensors (parameters in full; gradients and state of its slice)."""
        params = sum(b.flat.numel() * b.flat.element_size() for b in self._buckets)
        grads = 0
        for b in self._buckets:
            if self.stage == 1:
                grads += b.grad_flat.numel() * b.grad_flat.element_size()
            elif b.shard.grad is not None:
                grads += b.shard.grad.numel() * b.shard.grad.element_size()
            grads += sum(p.grad.numel() * p.grad.element_size() for p in b.params
                         if p.grad is not None and self.stage == 2)
        state = 0
        for v in self.optim.state.values():
            for t in v.values():
                if torch.is_tensor(t):
                    state += t.numel() * t.element_size()
        return {"parameters": params, "gradients": grads, "optimizer_state": state}
