"""A checkpoint leaves nothing behind: the bytes of every tensor reachable from the model and
the optimizer (walked here, each storage counted once), at every stage with AdamW, are the same
after ``consolidate_state_dict(to=0)`` + ``state_dict()`` (and after ``hvd.dcp.save``) as
before; what ``state_dict()`` returned is the caller's alone. Before, a rank holds what its
stage promises: with N ranks, per parameter byte, 2 + 2/N (stage 1: the whole gradient), 1 + 3/N
(stage 2) and 4/N (stage 3)."""
import types

import pytest
import torch

import horovod_cpp.torch as hvd
from test_sharded_model import Block, TinyLM, batches, loss_fn, mine

ADAMW = dict(lr=0.01, weight_decay=0.1)
SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
        types.MethodType)


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def reachable(*roots):
    """{storage address: bytes} of every tensor reachable from ``roots`` (through attributes,
    containers and gradients)."""
    seen, storages, stack = set(), {}, list(roots)
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if torch.is_tensor(o):
            if not getattr(o, "is_meta", False):
                s = _storage(o)
                nbytes = s.nbytes() if hasattr(s, "nbytes") else s.size() * o.element_size()
                if nbytes:
                    storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), nbytes)
            if o.grad is not None:
                stack.append(o.grad)
            stack.extend(getattr(o, "__dict__", {}).values())
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif hasattr(o, "__dict__") and not isinstance(o, SKIP):
            stack.append(vars(o))
    return storages


def trained(stage):
    torch.manual_seed(5)
    model = TinyLM(tied=False)
    if stage == 3:
        hvd.shard_model(model, auto_wrap={Block})
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=stage,
                               **ADAMW)
    for micro in batches(2, 1):
        opt.zero_grad()
        for ids, targets in micro:
            loss_fn(model, mine(ids), mine(targets)).backward()
        opt.step()
    return model, opt


BOUND = {1: lambda n: 2 + 2.0 / n, 2: lambda n: 1 + 3.0 / n, 3: lambda n: 4.0 / n}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_checkpoint_leaves_nothing_behind(stage):
    model, opt = trained(stage)
    param_bytes = sum(p.numel() * 4 for p in TinyLM(tied=False).parameters())
    before = reachable(model, opt)
    held = sum(before.values())
    # (+ the one-element finite flag and its gradient, and Adam's steps: 4 bytes each)
    assert held <= BOUND[stage](hvd.size()) * param_bytes + 512, \
        (held / float(param_bytes), BOUND[stage](hvd.size()))
    opt.consolidate_state_dict(to=0)
    full = opt.state_dict() if hvd.rank() == 0 else None
    after = reachable(model, opt)
    assert after == before
    if full is not None:
        ours = {_storage(v).data_ptr() for st in full["state"].values() for v in st.values()
                if torch.is_tensor(v)}
        assert not ours & set(after), "state_dict() returned tensors the optimizer holds"
        assert sum(v.numel() for st in full["state"].values() for v in st.values()
                   if torch.is_tensor(v) and v.dim()) == 2 * param_bytes // 4
        with pytest.raises(RuntimeError, match="returns it once"):
            opt.state_dict()


@pytest.mark.parametrize("stage", [2, 3])
def test_a_dcp_save_leaves_nothing_behind(stage, tmp_path_factory):
    pytest.importorskip("torch.distributed.checkpoint.default_planner")
    path = hvd.broadcast_object(str(tmp_path_factory.mktemp("dcp")) if hvd.rank() == 0
                                else None, root_rank=0, name="memory.dcp.dir")
    model, opt = trained(stage)
    before = reachable(model, opt)
    hvd.dcp.save({"model": model, "optim": opt}, path)
    assert reachable(model, opt) == before
