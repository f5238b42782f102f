"""Stage 3's optimizer: ``ShardedOptimizer(..., stage=3)`` over a model given to ``shard_model``.
It steps, for each parameter, the part of it in this rank's slice (a view of the slice), and
gathers nothing after the step: the next forward gathers what it uses. It registers itself as
stage 3 of ShardedOptimizer, which therefore names nothing above it."""
import torch

from horovod_cpp.torch.basics import HorovodNotSupportedError
from horovod_cpp.torch.collectives import allgather
from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.functions import allgather_object
from horovod_cpp.torch.sharding.common import (check_saved_ranks, clip_slices_by_global_norm,
                                               is_element_state, nonfinite_flag_grad)
from horovod_cpp.torch.sharding.flat import copy_overlap
from horovod_cpp.torch.sharding.optimizer import ShardedOptimizer


class _Piece(object):
    """The part of one parameter that lies in this rank's slice of its flat buffer."""

    def __init__(self, param, flat, i):
        self.param, self.flat, self.i = param, flat, i
        self.p_lo, self.p_hi = flat.part(i)                    # in the parameter, flattened
        self.lo = flat.offsets[i] + self.p_lo - flat.start     # in the slice
        self.hi = self.lo + self.p_hi - self.p_lo
        self.tensor = torch.nn.Parameter(flat.shard[self.lo:self.hi]) \
            if self.p_lo < self.p_hi else None


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
        self._committed = None    # elastic: the last commit (see ElasticShards)
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
        self._stats = sharding.stats  # adaptive training: the flats' (ShardedOptimizer's API)

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
        unsharded gradient), as ``torch.nn.utils.clip_grad_norm_`` would; returns that norm."""
        self._finish_reductions()
        return clip_slices_by_global_norm(
            [f.shard_grad for f in self.sharding.flats if f.trainable], max_norm, norm_type,
            self.process_set, "sharded3.clip")

    def _update_parameters(self):
        self.optim.step()   # nothing gathered: the next forward gathers what it uses

    # ---- adaptive training (the flats of shard_model; see sharding.common.SliceStats) ------

    def _gradient_slices(self):
        return [(k, f.shard_grad) for k, f in enumerate(self.sharding.flats) if f.trainable]

    def _take_gradient_stats(self):
        return self._stats.take(self._gradient_slices(), self.process_set, "sharded3.grad_stats")

    def _moment_slices(self):
        """[(flat, the wrapped optimizer's state for a piece of this rank's slice of it, the
        piece's param group)] (the Adam preconditioner: ShardedOptimizer._moment_slices)."""
        index = {id(f): k for k, f in enumerate(self.sharding.flats)}
        groups = {id(p): g for g in self.optim.param_groups for p in g["params"]}
        return [(index[id(pc.flat)], self.optim.state.get(pc.tensor, {}), groups[id(pc.tensor)])
                for pieces in self._pieces for pc in pieces
                if pc.tensor is not None and id(pc.tensor) in groups]

    def set_backward_passes_per_step(self, passes):
        """Between steps: the backward passes per step from now on (shard_model's)."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.sharding.backward_passes_per_step = passes

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
        saved = check_saved_ranks(saved, "sharded_state_dict")
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
                    copy_overlap(sl[k], f.start, f.end, v, start, end)
        self.zero_grad()
        self._install(slices, saved[0]["param_groups"])

    # ---- elastic (the hooks of ElasticShards) --------------------------------------------
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

    def _elastic_length(self, key):
        return self.sharding.flats[key].length

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
