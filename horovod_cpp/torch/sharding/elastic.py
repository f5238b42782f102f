"""The elastic part of every sharding stage: commits that keep each rank's slice and a replica
on another host, and the reshard that rebuilds every slice after the job re-forms at any size."""
import copy
import socket
import time

import torch

from horovod_cpp.torch.basics import Sum
from horovod_cpp.torch.collectives import allreduce, alltoall
from horovod_cpp.torch.functions import allgather_object
from horovod_cpp.torch.sharding.flat import shard_range


class ElasticShards(object):
    """What hvd.elastic needs of a sharded optimizer (stages 1-3). A class using it has
    ``process_set``, ``_size``, ``_rank``, ``_committed``, ``_pending``, ``_commit_id``,
    ``agreed_commit``, ``_holders``, and the hooks: ``_elastic_slices()`` ({key: {name: value}}
    of this rank's slices), ``_hyperparameters()``, ``_install(slices, hypers)``,
    ``_elastic_relayout(hypers)`` (a layout over ``_size`` ranks, this rank ``_rank``),
    ``_elastic_keys()`` and ``_elastic_length(key)`` (the elements of the flat buffer ``key``,
    split over the ranks as ``shard_range`` splits it)."""

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

    def _new_slice(self, key, pieces, olds):
        """This rank's new slice of ``key`` (None when no old slice had state): per-element
        state from the ``pieces`` [(start, {name: tensor})] that overlap it (zeros elsewhere),
        the rest from the old slices ``olds`` [(had state, {name: value}, {name: dtype of the
        per-element state})], in old rank order: dicts merged (stage 3's per-parameter
        scalars), anything else the first one's."""
        if not any(present for present, _, _ in olds):
            return None
        start, end = shard_range(self._elastic_length(key), self._size, self._rank)
        out = {}
        for present, values, dtypes in olds:
            for k, v in values.items():
                if isinstance(v, dict):
                    out.setdefault(k, {}).update(copy.deepcopy(v))
                elif k not in out:
                    out[k] = v.clone() if torch.is_tensor(v) else copy.deepcopy(v)
            for k, dtype in dtypes.items():
                if k not in out:
                    out[k] = torch.zeros(end - start, dtype=dtype)
        for lo, st in pieces:
            for k, v in st.items():
                out[k][lo - start:lo - start + v.numel()].copy_(v)
        return out

    def _elastic_reshard(self, process_set=None):
        """Collective, on the re-formed job: agrees on the newest commit (``agreed_commit``),
        lays the buckets out over the job's ranks and gives each rank its new slice of that
        commit, taken from the survivors that hold the old slices (the owner or its replica).
        Returns the seconds it took."""
        started = time.perf_counter()
        if process_set is not None:
            self.process_set = process_set
        pending = getattr(self, "_pending", None)
        records = [r for r in (self._committed, pending) if r]
        metas = allgather_object([(r["id"], r["size"], sorted(r["slices"]), r["hypers"],
                                   r is not pending) for r in records],
                                 name="sharded.reshard.meta", process_set=self.process_set)
        # The newest commit that some rank confirmed: every rank had it then (confirmed or
        # pending). A commit pending everywhere was never confirmed: a rank may have failed in
        # its replica exchange before holding it, and it may be incomplete.
        best = max([m[0] for held in metas for m in held if m[4]] or [-1])
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
        me, size = self._rank, self._size
        # Each old slice this rank provides, cut at the new slices' bounds: each range travels
        # to its new owner alone (one alltoall); what is not per element (Adam's step, stage
        # 3's per-parameter scalars) and the element state's dtypes go to every rank with the
        # layouts (small, pickled).
        sends = {}  # (destination, key, start) -> {name: the range}, destinations in order
        small = {}
        for q in range(size):
            for key in self._elastic_keys():
                self._cut(q, key, provider, mine, old_size, sends, small)
        header, buffer = self._pack(sends)
        del sends
        layouts, splits = self._regions(header, size)
        everyone = allgather_object((layouts, small), name="sharded.reshard.layout",
                                    process_set=self.process_set)
        received, counts = alltoall(buffer, splits=torch.tensor(splits, dtype=torch.int32),
                                    name="sharded.reshard", process_set=self.process_set)
        del buffer
        self.reshard_bytes = int(received.numel())
        pieces, offset = {}, 0
        for src, n in enumerate(counts.tolist()):
            for (key, lo), st in self._unpack(everyone[src][0][me],
                                              received[offset:offset + n]).items():
                pieces.setdefault(key, []).append((lo, st))
            offset += n
        smalls = {}
        for _, theirs in everyone:
            smalls.update(theirs)
        slices = {}
        for key in self._elastic_keys():
            st = self._new_slice(key, pieces.get(key, []),
                                 [smalls.get((key, old), (False, {}, {}))
                                  for old in range(old_size)])
            if st is not None:
                slices[key] = st
        self._install(slices, hypers)
        return time.perf_counter() - started

    def _cut(self, q, key, provider, mine, old_size, sends, small):
        """The ranges of the old slices of ``key`` that this rank provides and new rank ``q``'s
        slice overlaps, into ``sends``; what is not per element, into ``small`` (once)."""
        length, size, me = self._elastic_length(key), self._size, self._rank
        for old, provider_rank in provider.items():
            if provider_rank != me:
                continue
            st = mine["slices"][old].get(key, {})
            olo, ohi = shard_range(length, old_size, old)
            elem = {k: v for k, v in st.items()
                    if torch.is_tensor(v) and v.dim() == 1 and v.numel() == ohi - olo}
            if (key, old) not in small:
                # (a tensor cloned: a view of the commit's buffer would pickle all of it)
                small[(key, old)] = (bool(st), {k: v.clone() if torch.is_tensor(v) else v
                                                for k, v in st.items() if k not in elem},
                                     {k: v.dtype for k, v in elem.items()})
            lo, hi = shard_range(length, size, q)
            lo, hi = max(lo, olo), min(hi, ohi)
            if elem and lo < hi:
                sends[(q, key, lo)] = {k: v[lo - olo:hi - olo] for k, v in elem.items()}

    @staticmethod
    def _regions(header, size):
        """The packed buffer's region of each destination (the entries are destination-major):
        ([each destination's header, offsets from its region's start], the regions' bytes)."""
        layout, _, total = header
        starts, layouts = [total] * size, [{} for _ in range(size)]
        for (q, key, lo), entries in layout.items():
            starts[q] = min([starts[q]] + [e[2] for e in entries.values()])
        for q in range(size - 2, -1, -1):  # (a destination with nothing: an empty region)
            starts[q] = min(starts[q], starts[q + 1])
        ends = starts[1:] + [total]
        for (q, key, lo), entries in layout.items():
            layouts[q][(key, lo)] = {k: (dtype, shape, off - starts[q], nbytes)
                                     for k, (dtype, shape, off, nbytes) in entries.items()}
        return ([(layouts[q], {}, ends[q] - starts[q]) for q in range(size)],
                [ends[q] - starts[q] for q in range(size)])
