"""horovod_cpp as a ``torch.distributed`` backend.

    import horovod_cpp.torch  # registers the backend "horovod_cpp"
    torch.distributed.init_process_group("horovod_cpp")  # or "cpu:horovod_cpp,cuda:nccl"

Then DDP, FSDP2, DTensor, Hugging Face's Trainer and anything else written for
``torch.distributed`` run their CPU collectives on horovod_cpp's core: negotiated (a rank
that diverges gets an error naming the ranks and call sites, not a hang), fused, in the
timeline, under every ``HOROVOD_*`` knob. The runtime starts as ``rendezvous`` describes
(mpirun, hvdrun, or the store of an env:// launch such as torchrun or TorchDistributor); new
groups become process sets. Needs PyTorch 2.2 or later (a Python c10d ``Backend``).
"""
import torch.distributed as dist

from horovod_cpp.torch import basics

NAME = "horovod_cpp"
_unavailable = None
try:
    from torch._C._distributed_c10d import Backend as _C10dBackend  # noqa: F401
    from torch.distributed import distributed_c10d as _c10d
except ImportError as e:  # PyTorch < 2.2
    _unavailable = "this PyTorch (%s) has no Python c10d Backend: %s" % (
        __import__("torch").__version__, e)


def available():
    """Whether this PyTorch can run the backend (None) or why not (a string)."""
    return _unavailable


def _process_set_for(ranks):
    """The core's process set of these global ranks, added if there is none (a collective of
    every rank: members call it from the backend's creator, the others from the group
    helper)."""
    if ranks == list(range(basics.size())):
        return 0
    for ps in basics._core.process_set_ids():
        if ps and list(basics._core.process_set_info(ps)[0]) == ranks:
            return ps
    return basics._core.add_process_set(ranks)


def _create(opts, backend_options):
    from horovod_cpp.torch.distributed import backend, rendezvous
    rank, size = opts.group_rank, opts.group_size
    ranks = sorted(opts.global_ranks_in_group) or list(range(size))
    on_shutdown = None
    if not dist.is_initialized():  # the default group: start the runtime
        on_shutdown = rendezvous.start(opts.store, rank, size, opts.timeout).close
        ps = 0
    else:
        if not basics.is_initialized():
            raise RuntimeError("horovod_cpp backend: a group on horovod_cpp needs the default "
                               "group on it too (init_process_group(\"horovod_cpp\"))")
        ps = _process_set_for(ranks)
    return backend.HorovodBackend(rank, size, ranks, ps, opts.group_id, on_shutdown)


def _patch_group_helper():
    """Ranks outside a new group never reach the backend's creator, but the core adds a
    process set on every rank: they add it from here, in the same order as the members."""
    original = _c10d._new_process_group_helper
    if getattr(original, "_horovod_cpp", False):
        return

    def helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        result = original(group_size, group_rank, global_ranks_in_group, backend, *args,
                          **kwargs)
        pg = result[0] if isinstance(result, tuple) else result
        if (pg is dist.GroupMember.NON_GROUP_MEMBER and NAME in str(backend)
                and basics.is_initialized() and global_ranks_in_group):
            _process_set_for(sorted(global_ranks_in_group))
        return result

    helper._horovod_cpp = True
    _c10d._new_process_group_helper = helper


def register():
    """Registers the backend (idempotent; a no-op on a PyTorch without Python backends)."""
    if _unavailable is not None or NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    _patch_group_helper()


__all__ = ["NAME", "available", "register"]
