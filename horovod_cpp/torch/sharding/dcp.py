"""Checkpoints in the format of PyTorch's distributed checkpoint (``torch.distributed.checkpoint``,
DCP), each rank writing only its slices, loadable at any world size, and by FSDP2:

    hvd.dcp.save({"model": model, "optim": optimizer}, checkpoint_id="ckpt/step-100")
    hvd.dcp.load({"model": model, "optim": optimizer}, checkpoint_id="ckpt/step-100")

An entry that is a model stands for what ``get_model_state_dict`` gives an FSDP2 user (its
``state_dict()`` keys: every parameter at its full shape, the persistent buffers); a
``ShardedOptimizer`` (any stage) for what ``get_optimizer_state_dict`` gives (``{"state": {fqn:
{"exp_avg": ..., "step": ...}}, "param_groups": [{..., "params": [fqn, ...]}]}``); anything else
is saved as it is (tensors and objects that every rank holds alike: each is written once).
DCP flattens the nesting into its keys (``model.blocks.0.up.weight``,
``optim.state.blocks.0.up.weight.exp_avg``), so a checkpoint that FSDP2 wrote with
``dcp.save({"model": model_sd, "optim": optim_sd})`` loads here and the other way round.

A parameter's part in a rank's slice is a range of its elements in row-major order, which need
not be whole rows: it is written as the few boxes (DCP's chunks) that tile that range. Saving
runs DCP's planner and file writer, with the plans, the write results and any error exchanged
over horovod_cpp's collectives (so torch.distributed need not be initialised); loading runs
DCP's reader on each rank for the boxes of its own slices."""
import contextlib
import ctypes
import dataclasses
import io
import os

import torch

from horovod_cpp.torch.basics import HorovodNotSupportedError
from horovod_cpp.torch.functions import allgather_object
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.sharding.optimizer import ShardedOptimizer


def _boxes(shape, lo, hi):
    """The boxes [(offsets, sizes)] that tile the elements [lo, hi) of a tensor of ``shape``
    (row-major), in order: each covers a contiguous run of those elements."""
    if lo >= hi:
        return []
    if len(shape) == 0:
        return [((), ())]
    if len(shape) == 1:
        return [((lo,), (hi - lo,))]
    inner = 1
    for s in shape[1:]:
        inner *= s
    r0, c0 = divmod(lo, inner)
    r1, c1 = divmod(hi, inner)
    if r0 == r1:
        return [((r0,) + o, (1,) + s) for o, s in _boxes(shape[1:], c0, c1)]
    out = []
    if c0:
        out += [((r0,) + o, (1,) + s) for o, s in _boxes(shape[1:], c0, inner)]
        r0 += 1
    if r1 > r0:
        out.append(((r0,) + (0,) * (len(shape) - 1), (r1 - r0,) + tuple(shape[1:])))
    if c1:
        out += [((r1,) + o, (1,) + s) for o, s in _boxes(shape[1:], 0, c1)]
    return out


class Slices(object):
    """This rank's elements [lo, hi) (row-major) of a tensor of ``shape``: ``data``, a 1-D
    tensor of hi - lo elements (a view: loading writes into it)."""

    def __init__(self, shape, lo, hi, data):
        self.shape = torch.Size(shape)
        self.lo, self.hi = lo, hi
        self.data = data
        self.dtype = data.dtype
        self._boxes = {}
        start = 0
        for offsets, sizes in _boxes(self.shape, lo, hi):
            n = 1
            for s in sizes:
                n *= s
            self._boxes[tuple(offsets)] = (sizes, start)
            start += n

    def boxes(self):
        return [(offsets, sizes) for offsets, (sizes, _) in self._boxes.items()]

    def box(self, offsets):
        sizes, start = self._boxes[tuple(offsets)]
        n = 1
        for s in sizes:
            n *= s
        return self.data[start:start + n].view(sizes)


# ---- what each entry stands for -------------------------------------------------------------

def _names(state):
    """{id(parameter): its name in the first model of ``state``} (for the optimizers)."""
    for v in state.values():
        if isinstance(v, torch.nn.Module):
            return {id(p): n for n, p in v.named_parameters()}
    return {}


def _model_entries(model):
    """The model's state_dict with this rank's Slices for a stage-3 model's parameters."""
    sharding = getattr(model, "_hvd_sharded", None)
    flat_of = {id(p): fi for p, fi in sharding.flat_of.items()} if sharding else {}
    out = {}
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) in flat_of:
            f, i = flat_of[id(v)]
            lo, hi = f.part(i)
            hi = max(lo, hi)
            at = f.offsets[i] + lo - f.start
            out[k] = Slices(f.shapes[i], lo, hi, f.shard[at:at + hi - lo])
        else:
            out[k] = v.detach()
    return out


def _fqns(opt, names):
    """{parameter: its name}: the sharded model's (stage 3), else the model's in ``names``, else
    the one the optimizer was given."""
    if opt.stage == 3:
        return opt.sharding.names
    return {p: names.get(id(p), opt._names[p]) for ps in opt._groups_params for p in ps}


def _places(opt):
    """[(parameter, its shape, key, length, lo, hi, p_lo, the state, at)] for every parameter
    of ``opt`` with a part on this rank (stage 3) or in a bucket (stages 1-2): ``key`` the flat
    buffer or bucket, whose slice here has ``length`` elements, of which [lo, hi) are the
    parameter's elements [p_lo, p_lo + hi - lo) (lo == hi: none); ``state`` the wrapped
    optimizer's state of the tensor it steps (a stage-3 piece, a bucket's slice), in which the
    range starts at ``at``."""
    out = []
    if opt.stage == 3:
        for pieces in opt._pieces:
            for pc in pieces:
                if pc.tensor is not None:
                    f = pc.flat
                    out.append((pc.param, f.shapes[pc.i], f.index, f.end - f.start, pc.lo,
                                pc.hi, pc.p_lo, opt.optim.state.get(pc.tensor, {}), 0))
        return out
    for b in opt._buckets:
        st = opt.optim.state.get(b.shard, {})
        for i, p in enumerate(b.params):
            begin = b.offsets[i]
            lo, hi = max(begin, b.start), min(begin + p.numel(), b.end)
            out.append((p, p.shape, b.index, b.end - b.start, lo - b.start,
                        max(lo, hi) - b.start, lo - begin, st, lo - b.start))
    return out


def _optimizer_entries(opt, names):
    """The optimizer's entries as get_optimizer_state_dict gives them: per parameter, its
    per-element state as this rank's Slices of it, its other state (Adam's step) as it is."""
    state, fqn = {}, _fqns(opt, names)
    for p, shape, _, length, lo, hi, p_lo, st, at in _places(opt):
        steps = hi - lo if opt.stage == 3 else length  # (the stepped tensor's elements)
        for k, v in st.items():
            if not (torch.is_tensor(v) and v.dim() == 1 and v.shape[0] == steps):
                state.setdefault(fqn[p], {})[k] = v
            elif hi > lo:
                state.setdefault(fqn[p], {})[k] = Slices(shape, p_lo, p_lo + hi - lo,
                                                         v[at:at + hi - lo])
    return {"state": state, "param_groups": _param_groups(opt, names)}


def _param_groups(opt, names):
    fqn = _fqns(opt, names)
    return [dict(h, params=[fqn[p] for p in ps])
            for h, ps in zip(opt._hyperparameters(), opt._groups_params)]


# ---- DCP's planners, told about Slices ------------------------------------------------------

_CLASSES = {}


def _dcp():
    """(torch.distributed.checkpoint's modules, our planner classes), made once."""
    if not _CLASSES:
        try:
            from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
            from torch.distributed.checkpoint import metadata as md
            from torch.distributed.checkpoint import planner as pl
            from torch.distributed.checkpoint._nested_dict import (flatten_state_dict,
                                                                   unflatten_state_dict)
            from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner,
                                                                      DefaultSavePlanner)
            from torch.distributed.checkpoint.planner_helpers import \
                create_read_items_for_chunk_list
        except ImportError as e:
            raise HorovodNotSupportedError(
                "hvd.dcp needs torch.distributed.checkpoint as PyTorch >= 2.2 has it (this is "
                "PyTorch %s): %s" % (torch.__version__, e))

        class SavePlanner(DefaultSavePlanner):
            """DefaultSavePlanner over the entries that are not Slices, plus one SHARD write
            item per box of each Slices."""

            def __init__(self, slices, mappings):
                DefaultSavePlanner.__init__(self)
                self.slices, self.all_mappings = slices, mappings

            def create_local_plan(self):
                plan = DefaultSavePlanner.create_local_plan(self)
                items = list(plan.items)
                for fqn, s in self.slices.items():
                    for offsets, sizes in s.boxes():
                        box = s.box(offsets)
                        items.append(pl.WriteItem(
                            index=md.MetadataIndex(fqn, torch.Size(offsets)),
                            type=pl.WriteItemType.SHARD,
                            tensor_data=pl.TensorWriteData(
                                chunk=md.ChunkStorageMetadata(offsets=torch.Size(offsets),
                                                              sizes=torch.Size(sizes)),
                                properties=md.TensorProperties.create_from_tensor(box),
                                size=s.shape)))
                self.plan = dataclasses.replace(plan, items=items,
                                                planner_data=self.all_mappings)
                return self.plan

            def resolve_data(self, write_item):
                s = self.slices.get(write_item.index.fqn)
                if s is not None:
                    return _alias(s.box(write_item.index.offset))
                return DefaultSavePlanner.resolve_data(self, write_item)

        class LoadPlanner(DefaultLoadPlanner):
            """DefaultLoadPlanner over the entries that are not Slices, plus the read items of
            each Slices' boxes."""

            def __init__(self, slices):
                DefaultLoadPlanner.__init__(self)
                self.slices = slices

            def create_local_plan(self):
                plan = DefaultLoadPlanner.create_local_plan(self)
                items = list(plan.items)
                for fqn, s in self.slices.items():
                    saved = self.metadata.state_dict_metadata.get(fqn)
                    if saved is None:
                        raise RuntimeError("hvd.dcp.load: the checkpoint has no %s" % fqn)
                    if not isinstance(saved, md.TensorStorageMetadata) or \
                            tuple(saved.size) != tuple(s.shape):
                        raise RuntimeError("hvd.dcp.load: %s is %s in the checkpoint, %s here"
                                           % (fqn, tuple(getattr(saved, "size", ())) if
                                              isinstance(saved, md.TensorStorageMetadata)
                                              else "not a tensor", tuple(s.shape)))
                    chunks = [md.ChunkStorageMetadata(offsets=torch.Size(o),
                                                      sizes=torch.Size(z))
                              for o, z in s.boxes()]
                    items += create_read_items_for_chunk_list(fqn, saved, chunks)
                plan = dataclasses.replace(plan, items=items)
                return plan

            def lookup_tensor(self, index):
                s = self.slices.get(index.fqn)
                if s is not None:
                    return s.box(index.offset)
                return DefaultLoadPlanner.lookup_tensor(self, index)

        _CLASSES.update(FileSystemReader=FileSystemReader, FileSystemWriter=FileSystemWriter,
                        TensorStorageMetadata=md.TensorStorageMetadata,
                        flatten=flatten_state_dict, unflatten=unflatten_state_dict,
                        SavePlanner=SavePlanner, LoadPlanner=LoadPlanner)
    return _CLASSES


def _on_every_rank(what, fn, process_set):
    """Runs fn here and gathers every rank's result; an error on any rank is raised on every
    rank, naming the ranks and their errors."""
    try:
        mine = (True, fn())
    except Exception as e:  # (reported to every rank below)
        mine = (False, "%s: %s" % (type(e).__name__, e))
    everyone = allgather_object(mine, name="dcp.%s" % what, process_set=process_set)
    failed = ["rank %d: %s" % (r, out) for r, (ok, out) in enumerate(everyone) if not ok]
    if failed:
        raise RuntimeError("hvd.dcp.save: %s failed on %s" % (what, "; ".join(failed)))
    return [out for _, out in everyone]


def _process_set(state):
    for v in state.values():
        if isinstance(v, ShardedOptimizer):
            return v.process_set
        sharding = getattr(v, "_hvd_sharded", None)
        if sharding is not None:
            return sharding.process_set
    return global_process_set


def _entries(state):
    names = _names(state)
    out = {}
    for key, v in state.items():
        if isinstance(v, torch.nn.Module):
            out[key] = _model_entries(v)
        elif isinstance(v, ShardedOptimizer):
            out[key] = _optimizer_entries(v, names)
        else:
            out[key] = v
    return out


def _alias(t):
    """``t`` (contiguous, on the CPU) as a tensor over its own bytes alone: DCP's writer clones a
    tensor whose storage is larger than it (a box of a slice is a view of the whole flat buffer),
    and PyTorch 2.15's keeps every tensor of a file until the file is done, so each rank held
    its whole checkpoint twice while writing it. The alias shares the memory (nothing copied);
    ``t`` outlives it (the save holds the model and the optimizer)."""
    if t.numel() == 0 or t.device.type != "cpu":
        return t
    raw = (ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())
    return torch.frombuffer(raw, dtype=torch.uint8).view(t.dtype).view(t.shape)


class _Written(io.BufferedWriter):
    """A file whose written pages leave the page cache every _DROP_BYTES: a rank under a memory
    limit (a cgroup counts the page cache it dirties) writes its slices without holding them
    twice (measured: a 1.3 B-parameter stage-3 model's ranks, each 3.7 GiB resident under a
    4 GiB limit, were killed writing their 2 GB checkpoint files through the page cache)."""

    def __init__(self, raw):
        io.BufferedWriter.__init__(self, raw)
        self._pending = 0  # bytes written since the last drop

    def write(self, data):
        n = io.BufferedWriter.write(self, data)
        self._pending += n
        if self._pending >= _DROP_BYTES:
            self.flush()
            os.fdatasync(self.fileno())
            os.posix_fadvise(self.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            self._pending = 0
        return n


_DROP_BYTES = 64 << 20


def _page_dropping_file_system(base):
    """DCP's FileSystem whose files for writing are _Written."""

    class FileSystem(base):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            if mode != "wb":
                with base.create_stream(self, path, mode) as stream:
                    yield stream
                return
            with _Written(io.FileIO(str(path), "wb")) as stream:
                yield stream

    return FileSystem


def _split(flat):
    slices = {k: v for k, v in flat.items() if isinstance(v, Slices)}
    return slices, {k: v for k, v in flat.items() if k not in slices}


def save(state, checkpoint_id, process_set=None):
    """Collective: writes ``state`` ({key: model, ShardedOptimizer, or a value every rank holds
    alike}) to the directory ``checkpoint_id`` in DCP's format, each rank its own slices (one
    file per rank, ``.metadata`` from the process set's first rank). An error on any rank is
    raised on every rank."""
    c = _dcp()
    process_set = process_set or _process_set(state)
    rank = process_set.rank()
    flat, mappings = c["flatten"](_entries(state))
    slices, rest = _split(flat)
    planner = c["SavePlanner"](slices, mappings)
    writer = c["FileSystemWriter"](checkpoint_id)
    if hasattr(writer, "fs") and hasattr(os, "posix_fadvise"):
        writer.fs = _page_dropping_file_system(type(writer.fs))()

    def local():
        planner.set_up_planner(rest, storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        return writer.prepare_local_plan(planner.create_local_plan())

    plans = _on_every_rank("plan", local, process_set)
    # Every rank makes the global plan (deterministic: the same everywhere) and takes its own.
    made = {}

    def central():
        made["plans"], made["metadata"] = planner.create_global_plan(plans)
        made["plans"] = writer.prepare_global_plan(made["plans"])

    _on_every_rank("global plan", central, process_set)

    def write():
        written = writer.write_data(planner.finish_plan(made["plans"][rank]), planner)
        written.wait()
        return written.value()

    results = _on_every_rank("write", write, process_set)
    _on_every_rank("metadata", lambda: writer.finish(made["metadata"], results)
                   if rank == 0 else None, process_set)


def load(state, checkpoint_id):
    """Loads ``state`` ({key: model, ShardedOptimizer, or a value}) from a DCP checkpoint
    written at any world size (by ``save`` or by ``torch.distributed.checkpoint.save``): each
    rank reads the ranges of its own slices. Models' parameters and buffers and tensors are
    loaded in place; optimizers get their state and hyperparameters; other values are replaced
    in ``state``. Not collective."""
    c = _dcp()
    reader = c["FileSystemReader"](checkpoint_id)
    metadata = reader.read_metadata()
    names = _names(state)
    dest, installs = {}, []
    for key, v in state.items():
        if isinstance(v, torch.nn.Module):
            dest[key] = _model_entries(v)
        elif isinstance(v, ShardedOptimizer):
            dest[key], install = _optimizer_targets(v, names, key, metadata, c)
            installs.append((key, install))
        else:
            dest[key] = v
    flat, mappings = c["flatten"](dest)
    slices, rest = _split(flat)
    planner = c["LoadPlanner"](slices)
    planner.set_up_planner(rest, metadata, True)
    reader.set_up_storage_reader(metadata, True)
    plan = reader.prepare_local_plan(planner.create_local_plan())
    plan = reader.prepare_global_plan(planner.create_global_plan([plan]))[0]
    reader.read_data(planner.finish_plan(plan), planner).wait()
    loaded = c["unflatten"](dict(rest, **slices), mappings)
    for key, install in installs:
        install(loaded[key])
    for key, v in state.items():
        if not isinstance(v, (torch.nn.Module, ShardedOptimizer)):
            state[key] = loaded[key]


def _saved_keys(metadata, prefix):
    """{name: its metadata} of the checkpoint's entries ``prefix`` + name (name without dots)."""
    out = {}
    for k, v in metadata.state_dict_metadata.items():
        if k.startswith(prefix) and "." not in k[len(prefix):]:
            out[k[len(prefix):]] = v
    return out


def _optimizer_targets(opt, names, key, metadata, c):
    """(where DCP reads the optimizer's entries into, a function that installs them): each
    per-element state into a new tensor over this rank's slice (stage 3: per flat buffer;
    stages 1-2: per bucket), the rest as read."""
    tensor_md = c["TensorStorageMetadata"]
    groups = []
    i = 0
    while True:
        saved = _saved_keys(metadata, "%s.param_groups.%d." % (key, i))
        if not saved:
            break
        groups.append({h: None for h in saved})
        i += 1
    state, slices, scalars = {}, {}, []
    index, fqn_of = opt._param_index(), _fqns(opt, names)
    for p, shape, where, length, lo, hi, p_lo, _, _ in _places(opt):
        fqn = fqn_of[p]
        saved = _saved_keys(metadata, "%s.state.%s." % (key, fqn))
        if not saved:
            continue
        entry = state.setdefault(fqn, {})
        mine = slices.setdefault(where, {})
        for k, smd in saved.items():
            if isinstance(smd, tensor_md) and tuple(smd.size) == tuple(shape) and len(shape):
                if k not in mine:
                    mine[k] = torch.zeros(length, dtype=smd.properties.dtype)
                if hi > lo:
                    entry[k] = Slices(shape, p_lo, p_lo + hi - lo, mine[k][lo:hi])
            elif isinstance(smd, tensor_md):
                entry[k] = torch.zeros(smd.size, dtype=smd.properties.dtype)
                scalars.append((where, index[p], fqn, k))
            else:
                entry[k] = None
                scalars.append((where, index[p], fqn, k))
        scalars.append((where, index[p], fqn, None))  # (a parameter with state)

    def install(loaded):
        read = loaded.get("param_groups", [])
        mine = _param_groups(opt, names)
        if len(read) != len(mine) or any(set(g.get("params", ())) != set(m["params"])
                                         for g, m in zip(read, mine)):
            raise RuntimeError(
                "hvd.dcp.load: %s: the checkpoint's parameter groups (%s) are not this "
                "optimizer's (%s)" % (key, [sorted(g.get("params", ())) for g in read],
                                      [sorted(m["params"]) for m in mine]))
        hypers = [{h: v for h, v in g.items() if h != "params"} for g in read]
        if opt.stage == 3:
            out = {f.index: dict(slices.get(f.index, {}), scalars={})
                   for f in opt.sharding.flats}
            for where, pi, fqn, k in scalars:
                entry = out[where]["scalars"].setdefault(pi, {})
                if k is not None:
                    entry[k] = loaded["state"][fqn][k]
        else:
            out = {}
            for where, pi, fqn, k in scalars:  # (a bucket's scalars: its first parameter's)
                bucket = out.setdefault(where, dict(slices.get(where, {})))
                if k is not None and k not in bucket:
                    bucket[k] = loaded["state"][fqn][k]
        opt.zero_grad()
        opt._install(out, hypers)

    return {"state": state, "param_groups": groups}, install
