"""Flat-parameter storage: the parameters of one bucket (stages 1-2) or one unit (stage 3) packed
into one flat buffer, of which each rank owns the slice that reducescatter gives it, and the
storage helpers that free and refill a buffer under its views."""
import torch


def shard_range(length, size, rank):
    """This rank's [start, end) of a flat bucket of ``length`` elements: reducescatter's split
    of dim 0 (``length // size`` each, the first ``length % size`` ranks one more)."""
    base, rem = divmod(length, size)
    start = rank * base + min(rank, rem)
    return start, start + base + (1 if rank < rem else 0)



def storage_of(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def storage_bytes(t):
    s = storage_of(t)
    return s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()


def resize_storage(t, numel):
    """Frees (numel 0) or reallocates the storage under ``t`` and every view of it."""
    s = storage_of(t)
    if hasattr(t, "untyped_storage"):
        s.resize_(numel * t.element_size())
    else:
        s.resize_(numel)



_EMPTY = {}


def empty_like(p):
    key = (p.dtype, p.device)
    if key not in _EMPTY:
        _EMPTY[key] = torch.empty(0, dtype=p.dtype, device=p.device)
    return _EMPTY[key]



def copy_overlap(dst, dst_start, dst_end, src, src_start, src_end):
    """Copies the part of src (the range [src_start, src_end) of a flat buffer) that overlaps
    dst (the range [dst_start, dst_end) of the same buffer) into dst."""
    lo, hi = max(dst_start, src_start), min(dst_end, src_end)
    if lo < hi:
        dst[lo - dst_start:hi - dst_start].copy_(src[lo - src_start:hi - src_start])



def pack_offsets(params):
    """(each parameter's offset in a flat buffer of ``params`` packed in order, its length)."""
    offsets, length = [], 0
    for p in params:
        offsets.append(length)
        length += p.numel()
    return offsets, length


class Bucket(object):
    """Parameters of one group, dtype and device, flattened into one buffer."""

    def __init__(self, index, group, params):
        self.index = index
        self.group = group
        self.params = params
        self.offsets, self.length = pack_offsets(params)
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



class FlatBuffer(object):
    """One unit's parameters of one dtype, device and requires_grad, as one flat buffer of
    which this rank stores the slice [start, end)."""

    def __init__(self, index, unit, params, names, size, rank, deferred=()):
        self.index = index
        self.unit = unit
        self.params = params
        self.names = names
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets, self.length = pack_offsets(params)
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.trainable = params[0].requires_grad
        self.start, self.end = shard_range(self.length, size, rank)
        # Each parameter's part of the slice, copied from it (a deferred one's, the ids in
        # ``deferred``, when it is initialised: fill).
        self.shard = torch.empty(self.end - self.start, dtype=self.dtype, device=self.device)
        for i, p in enumerate(params):
            if id(p) not in deferred:
                self.fill(i, p.detach())
        # The gathered parameters live in `full`; its storage is freed between uses (views of
        # it that autograd saved for backward are filled again before the backward runs).
        self.full = torch.empty(self.length, dtype=self.dtype, device=self.device)
        resize_storage(self.full, 0)
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

    def part(self, i):
        """(lo, hi): the elements of parameter i (flattened) in this rank's slice, which start
        at lo + offsets[i] - start there; lo >= hi when there are none."""
        begin = self.offsets[i]
        return (max(begin, self.start) - begin,
                min(begin + self.numels[i], self.end) - begin)

    def fill(self, i, whole):
        """Copies the part of parameter i (``whole``: all of it) that lies in this rank's
        slice into the slice."""
        lo, hi = self.part(i)
        if lo < hi:
            at = self.offsets[i] + lo - self.start
            with torch.no_grad():
                self.shard[at:at + hi - lo].copy_(whole.reshape(-1)[lo:hi])

    @property
    def label(self):
        return "%s.%d" % (self.unit.name or "root", self.index)
