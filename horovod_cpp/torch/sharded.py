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
shard and every rank skips the same steps. It costs one 4-byte allreduce per step.
"""
import copy
import math
import socket
import time

import torch

from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.functions import allgather_object
from horovod_cpp.torch.basics import Average, HorovodNotSupportedError, Max, Sum
from horovod_cpp.torch.collectives import (allgather, allgather_async, allreduce,
                                           allreduce_async_, alltoall, grouped_allgather,
                                           reducescatter_async)
from horovod_cpp.torch.tensor_bridge import poll, synchronize
from horovod_cpp.torch.optimizer import _POST_ACCUMULATE_GRAD_HOOK
from horovod_cpp.torch.process_sets import global_process_set


# torch.optim's optimizers whose step updates each parameter from its own gradient and state
# alone: ShardedOptimizer steps them bucket by bucket, each bucket's allgather overlapping the
# next bucket's step. Any other optimizer class steps every slice at once.
_PER_PARAMETER_OPTIMIZERS = tuple(
    getattr(torch.optim, name) for name in (
        "SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam",
        "RMSprop", "Rprop") if hasattr(torch.optim, name))


def shard_range(length, size, rank):
    """This rank's [start, end) of a flat bucket of ``length`` elements: reducescatter's split
    of dim 0 (``length // size`` each, the first ``length % size`` ranks one more)."""
    base, rem = divmod(length, size)
    start = rank * base + min(rank, rem)
    return start, start + base + (1 if rank < rem else 0)


def register_grad_ready_hook(p, hook):
    """Calls ``hook()`` each time autograd has accumulated p's gradient: a post-accumulate-grad
    hook on PyTorch 2.1+, a hook on p's gradient accumulator before (which must then be made
    while p has its shape: the accumulator keeps it). Returns what keeps the hook."""
    if _POST_ACCUMULATE_GRAD_HOOK:
        return p.register_post_accumulate_grad_hook(lambda *ignore: hook())
    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
    grad_acc.register_hook(lambda *ignore: hook())
    return grad_acc


def check_gradient(p, name, passes, backward_passes_per_step, who):
    """Refuses a sparse gradient, and one more backward pass than backward_passes_per_step."""
    if p.grad.is_sparse:
        raise HorovodNotSupportedError("%s: the gradient of %s is sparse" % (who, name))
    if passes >= backward_passes_per_step:
        raise AssertionError(
            "Gradients were computed more than backward_passes_per_step times "
            "before call to step(). Increase backward_passes_per_step to "
            "accumulate gradients locally.")


def nonfinite_flag_grad(grads, process_set, name):
    """Collective: the gradient of the optimizer's 1-element finite flag: +inf when any rank's
    ``grads`` (its slices) hold a non-finite value, 0 otherwise (one 4-byte allreduce)."""
    nonfinite = False
    for g in grads:
        if g is not None and g.numel():
            # One pass: a non-finite element makes the sum non-finite (summed in fp32 at
            # least, so that finite half-precision values cannot overflow it).
            total = g.sum(dtype=torch.float32 if g.element_size() < 4 else g.dtype)
            if not bool(torch.isfinite(total)):
                nonfinite = True
                break
    flag = allreduce(torch.tensor([1.0 if nonfinite else 0.0]), op=Max, name=name,
                     process_set=process_set)
    return torch.full((1,), math.inf) if flag.item() > 0 else torch.zeros(1)


def clip_slices_by_global_norm(grads, max_norm, norm_type, process_set, name):
    """Collective: clips every rank's gradient slices by the norm of the whole gradient (as
    torch.nn.utils.clip_grad_norm_ would, unsharded) and returns that norm."""
    norm_type = float(norm_type)
    grads = [g for g in grads if g is not None]
    if norm_type == math.inf:
        local = max([float(g.abs().max()) for g in grads if g.numel()] or [0.0])
        total = allreduce(torch.tensor([local], dtype=torch.float64), op=Max, name=name,
                          process_set=process_set)[0]
    else:
        local = sum(float(torch.linalg.vector_norm(g.double(), norm_type)) ** norm_type
                    for g in grads if g.numel())
        total = allreduce(torch.tensor([local], dtype=torch.float64), op=Sum, name=name,
                          process_set=process_set)[0]
        total = total ** (1.0 / norm_type)
    coef = float(max_norm) / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    dtypes = {g.dtype for g in grads}
    return total.to(dtypes.pop() if len(dtypes) == 1 else torch.float32)


class _Bucket(object):
    """Parameters of one group, dtype and device, flattened into one buffer."""

    def __init__(self, index, group, params):
        self.index = index
        self.group = group
        self.params = params
        self.offsets = []
        offset = 0
        for p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.length = offset
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.flat = torch.empty(self.length, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            for p, off in zip(params, self.offsets):
                self.flat[off:off + p.numel()].copy_(p.data.reshape(-1))
                p.data = self.flat[off:off + p.numel()].view_as(p)
        self.start = self.end = 0
        self.shard = None
        self.grad_flat = None  # stage 1: persistent; stage 2: the pass being filled
        self.arrived = set()   # parameters whose gradient is in grad_flat (this pass / step)
        self.direct = False    # grad_flat is the parameter's own gradient (not yet averaged)
        self.launched = 0      # reductions started this step
        self.handles = []      # their handles (a tensor: done already), oldest first
        self.reduced = None    # stage 2: the reduced slice gradient taken so far this step

    def set_shard(self, size, rank):
        self.start, self.end = shard_range(self.length, size, rank)
        self.shard = torch.nn.Parameter(self.flat[self.start:self.end])

    def view(self, flat, i):
        p, off = self.params[i], self.offsets[i]
        return flat[off:off + p.numel()].view_as(p)


def is_element_state(value, shard):
    """State that has one value per element of the slice (momentum, exp_avg), as opposed to
    scalars (Adam's step)."""
    return torch.is_tensor(value) and value.dim() == 1 and value.shape == shard.shape


class _ElasticShards(object):
    """What hvd.elastic needs of a sharded optimizer (stages 1-3). A class using it has
    ``process_set``, ``_size``, ``_rank``, ``_committed``, ``_pending``, ``_commit_id``,
    ``agreed_commit``, ``_holders``, and the hooks: ``_elastic_slices()`` ({key: {name: value}}
    of this rank's slices), ``_hyperparameters()``, ``_install(slices, hypers)``,
    ``_elastic_relayout(hypers)`` (a layout over ``_size`` ranks, this rank ``_rank``),
    ``_elastic_keys()`` and ``_elastic_reslice(key, old slices, old size)``."""

    #
    # A commit keeps this rank's slice state and a replica of it on one other rank (on another
    # host when there is one), so that losing one rank, or one host, loses nothing committed.
    # A commit is atomic across the ranks: the replicas travel first (the commit is then only
    # pending), and it becomes the commit once a collective confirms that every rank received
    # its replicas; a rank that fails between the two still holds it as pending, so the job
    # agrees on the newest commit that some rank confirmed (every rank holds it, confirmed or
    # pending), never on a mix. After the job re-forms at any size, _elastic_reshard rebuilds
    # every new rank's slice from whichever survivor holds each old slice. Collective:
    # _elastic_save(replicate=True), _elastic_reshard.

    def _elastic_holders(self):
        """{rank: the rank that keeps its replica}: the next rank, in rank order, on another
        host; the next rank when every rank is on one host."""
        if self._holders is None or self._holders[0] != self._size:
            hosts = allgather_object(socket.gethostname(), name="sharded.hosts",
                                     process_set=self.process_set)
            holders = {}
            for r in range(self._size):
                ring = [(r + k) % self._size for k in range(1, self._size)]
                other = [q for q in ring if hosts[q] != hosts[r]]
                holders[r] = (other or ring or [r])[0]
            self._holders = (self._size, holders)
        return self._holders[1]

    @property
    def commit_id(self):
        """The number of the last commit this rank holds (-1 before the first)."""
        return self._commit_id

    @staticmethod
    def _pack(slices):
        """{id: {key: value}} copied once into one byte buffer, and the header to read it back
        with _unpack: the tensors' (dtype, shape, offset, bytes) and the other values as they
        are. A commit keeps the buffer itself as its snapshot (_unpack gives views of it)."""
        layout, values, tensors, total = {}, {}, [], 0
        for i, st in slices.items():
            for k, v in st.items():
                if torch.is_tensor(v):
                    t = v.detach().reshape(-1)
                    nbytes = t.numel() * t.element_size()
                    layout.setdefault(i, {})[k] = (v.dtype, tuple(v.shape), total, nbytes)
                    tensors.append((t, total, nbytes))
                    total += -(-nbytes // 8) * 8  # 8-byte aligned, so that views can be typed
                else:
                    values.setdefault(i, {})[k] = copy.deepcopy(v)
        buffer = torch.empty(total, dtype=torch.uint8)
        for t, offset, nbytes in tensors:
            if nbytes:
                buffer[offset:offset + nbytes].copy_(t.cpu().contiguous().view(torch.uint8))
        return (layout, values, total), buffer

    @staticmethod
    def _unpack(header, buffer):
        """{bucket: {key: value}} of a packed slice state; tensors are views of ``buffer``."""
        layout, values, _ = header
        out = {b: dict(v) for b, v in values.items()}
        for b, entries in layout.items():
            for k, (dtype, shape, offset, nbytes) in entries.items():
                out.setdefault(b, {})[k] = buffer[offset:offset + nbytes].view(dtype).reshape(
                    shape)
        return out

    def _elastic_save(self, replicate=True):
        """Saves this rank's slice state as the point to roll back to. ``replicate``
        (collective): also sends it to its holder, keeps the slices it holds for others, and
        makes it the commit once every rank has its replicas."""
        header, buffer = self._pack(self._elastic_slices())
        record = {"id": self._commit_id + (1 if replicate else 0), "size": self._size,
                  "rank": self._rank, "hypers": copy.deepcopy(self._hyperparameters()),
                  "slices": {self._rank: self._unpack(header, buffer)}}
        if not replicate:
            self._committed = record
            return
        if self._size > 1:
            # The layouts (small, pickled) to every rank, then the bytes to the holder alone.
            holder = self._elastic_holders()[self._rank]
            headers = allgather_object(header, name="sharded.replica.layout",
                                       process_set=self.process_set)
            splits = torch.zeros(self._size, dtype=torch.int32)
            splits[holder] = buffer.numel()
            received, counts = alltoall(buffer, splits=splits, name="sharded.replica",
                                        process_set=self.process_set)
            offset = 0
            for src, n in enumerate(counts.tolist()):
                if self._elastic_holders()[src] == self._rank and src != self._rank:
                    record["slices"][src] = self._unpack(headers[src],
                                                         received[offset:offset + n])
                offset += n
        self._pending = record
        # Completes on a rank only once every rank has submitted it, i.e. has its replicas.
        allreduce(torch.zeros(1), op=Sum, name="sharded.commit", process_set=self.process_set)
        self._committed, self._pending = record, None
        self._commit_id = record["id"]

    @staticmethod
    def _copy_slices(slices):
        """A copy of {bucket: {key: value}} (what the optimizer may change in place)."""
        return {b: {k: (v.clone() if torch.is_tensor(v) else copy.deepcopy(v))
                    for k, v in st.items()} for b, st in slices.items()}

    def _elastic_restore(self):
        """Rolls this rank's slice back to the last commit (the layout is the commit's: it
        only changes in _elastic_reshard, which is followed by a commit). The optimizer gets a
        copy: PyTorch 2's load_state_dict keeps the tensors it is given."""
        record = self._committed
        if record is not None and record["size"] == self._size and \
                record["rank"] == self._rank:
            self._install(self._copy_slices(record["slices"][self._rank]), record["hypers"])

    def _elastic_reshard(self, process_set=None):
        """Collective, on the re-formed job: agrees on the newest commit (``agreed_commit``),
        lays the buckets out over the job's ranks and gives each rank its new slice of that
        commit, taken from the survivors that hold the old slices (the owner or its replica).
        Returns the seconds it took."""
        started = time.perf_counter()
        if process_set is not None:
            self.process_set = process_set
        records = [r for r in (self._committed, getattr(self, "_pending", None)) if r]
        metas = allgather_object([(r["id"], r["size"], sorted(r["slices"]), r["hypers"])
                                  for r in records], name="sharded.reshard.meta",
                                 process_set=self.process_set)
        best = max([m[0] for held in metas for m in held] or [-1])
        mine = ([r for r in records if r["id"] == best] or [None])[0]
        if mine is not None:  # (a pending commit that another rank confirmed: it is the one)
            self._committed, self._commit_id = mine, best
        self._pending = None
        self.agreed_commit = best
        held = {i: [m for m in ms if m[0] == best][0] for i, ms in enumerate(metas)
                if any(m[0] == best for m in ms)}
        if held:
            old_size, hypers = next(iter(held.values()))[1], next(iter(held.values()))[3]
        else:  # nothing saved anywhere yet: a fresh state
            old_size, hypers = 0, self._hyperparameters()
        provider = {}
        for old in range(old_size):
            holders = [i for i, m in sorted(held.items()) if old in m[2]]
            if not holders:
                raise RuntimeError(
                    "ShardedOptimizer: the optimizer state of rank %d of the last commit (%d "
                    "ranks) is lost: neither that rank nor the rank that kept its replica is "
                    "in the job now (more than one rank, or ranks on more than one host, were "
                    "lost between two commits). Restart from a checkpoint." % (old, old_size))
            provider[old] = holders[0]

        self._size, self._rank = self.process_set.size(), self.process_set.rank()
        self._holders = None
        self._elastic_relayout(hypers)
        me = self.process_set.rank()
        slices = {}
        for key in self._elastic_keys():
            # The old slices this rank provides, as bytes (their layouts, small, pickled).
            header, buffer = self._pack({old: mine["slices"][old].get(key, {})
                                         for old, i in provider.items() if i == me})
            headers = allgather_object(header, name="sharded.reshard.layout.%s" % (key,),
                                       process_set=self.process_set)
            gathered = allgather(buffer, name="sharded.reshard.%s" % (key,),
                                 process_set=self.process_set)
            pieces, offset = {}, 0
            for h in headers:
                pieces.update(self._unpack(h, gathered[offset:offset + h[2]]))
                offset += h[2]
            for old in range(old_size):
                pieces.setdefault(old, {})
            st = self._elastic_reslice(key, [pieces[old] for old in range(old_size)], old_size)
            if st is not None:
                slices[key] = st
        self._install(slices, hypers)
        return time.perf_counter() - started


class ShardedOptimizer(_ElasticShards, torch.optim.Optimizer):
    """Shards ``optimizer_class``'s state (``stage=1``) and the gradients too (``stage=2``)
    over the ranks of ``process_set``.

    ``params``: ``model.named_parameters()``, ``model.parameters()``, or parameter groups
    (dicts whose ``params`` are either). ``defaults`` go to ``optimizer_class``.
    """

    # stage -> the subclass that implements it, registered by the module that defines it
    # (stage 3: sharded_model's FullyShardedOptimizer), so this module names none above it.
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
                        buckets.append(_Bucket(len(buckets), gi, current))
                        current, nbytes = [], 0
                    current.append(p)
                    nbytes += size
                if current:
                    buckets.append(_Bucket(len(buckets), gi, current))
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
        if self._size == 1:  # nothing to reduce with: the bucket's gradient is the result
            b.handles.append((b.grad_flat, None))
            b.direct = False
        elif self.stage == 1:
            send, ctx = self._compression.compress(b.grad_flat)
            b.handles.append((allreduce_async_(send, name=name, op=Sum,
                                               process_set=self.process_set), ctx))
        else:
            op = self.op if b.direct else Sum
            send, ctx = self._compression.compress(b.grad_flat)
            b.handles.append((reducescatter_async(send, name=name, op=op,
                                                  process_set=self.process_set), ctx))
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
        unsharded gradient), as torch.nn.utils.clip_grad_norm_ would; returns that norm."""
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
        self._step_and_gather()
        self._reduced = False
        return loss

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
        """The full state gathered by the last ``consolidate_state_dict()`` (on its rank)."""
        if self._consolidated is None:
            raise RuntimeError("ShardedOptimizer.state_dict(): the state is sharded; every rank "
                               "must call optimizer.consolidate_state_dict(to=...) first, and "
                               "state_dict() then returns it on that rank (this one has none)")
        return self._consolidated

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

    # ---- elastic (the hooks of _ElasticShards) --------------------------------------------

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

    def _elastic_reslice(self, key, old_slices, old_size):
        """This rank's new slice of bucket ``key`` from the old ranks' slices (in old rank
        order)."""
        b = self._buckets[key]
        present = [s for s in old_slices if s]
        if not present:
            return None
        out = {}
        for k, v in present[0].items():
            if k != "step" and torch.is_tensor(v) and v.dim() == 1:
                whole = []
                for old, s in enumerate(old_slices):
                    lo, hi = shard_range(b.length, old_size, old)
                    whole.append(s[k] if s else
                                 torch.zeros(hi - lo, dtype=v.dtype, device=v.device))
                out[k] = torch.cat(whole)[b.start:b.end].clone()
            else:
                out[k] = v.clone() if torch.is_tensor(v) else copy.deepcopy(v)
        return out

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
