"""Checkpoints in PyTorch's distributed-checkpoint format (hvd.dcp.save / hvd.dcp.load), stages
1, 2 and 3: a checkpoint loaded at the size it was written at continues exactly as the job that
wrote it; loaded at another size (a process set of fewer ranks), like one process on the full
batch (plain torch, computed here). The files are DCP's: torch.distributed.checkpoint's own
reader gives the whole parameters and Adam's state back (compared with the one process).
Interop with FSDP2 itself: tests/dcp_interop.py (the PyPI lane)."""
import pytest
import torch

import horovod_cpp.torch as hvd
from test_sharded_model import Block, TinyLM, batches, loss_fn

dcp = pytest.importorskip("torch.distributed.checkpoint")
if not hasattr(dcp, "FileSystemWriter") or tuple(
        int(x) for x in torch.__version__.split(".")[:2]) < (2, 2):
    pytest.skip("hvd.dcp needs PyTorch >= 2.2", allow_module_level=True)

PER_RANK = 2
ADAMW = dict(lr=0.01, weight_decay=0.1)


def shared_dir(tmp_path_factory):
    """One directory for every rank (rank 0's, broadcast)."""
    mine = str(tmp_path_factory.mktemp("dcp")) if hvd.rank() == 0 else None
    return hvd.broadcast_object(mine, root_rank=0, name="dcp.test.dir")


def build(stage, ps):
    torch.manual_seed(5)
    model = TinyLM()
    if stage == 3:
        hvd.shard_model(model, auto_wrap={Block}, process_set=ps)
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=stage,
                               process_set=ps, **ADAMW)
    return model, opt


def train(model, opt, data, ps):
    rows = slice(ps.rank() * PER_RANK, (ps.rank() + 1) * PER_RANK)
    for ids, targets in data:
        opt.zero_grad()
        loss_fn(model, ids[rows], targets[rows]).backward()
        opt.step()


def data_for(ranks, steps, seed):
    return [micro[0] for micro in batches(steps, 1, seed=seed, ranks=ranks)]


def whole(model):
    sharding = getattr(model, "_hvd_sharded", None)
    if sharding is not None:
        return sharding.state_dict(to=None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference(first, then):
    """One process on the full batches: the first steps, then the others."""
    torch.manual_seed(5)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    for ids, targets in first + then:
        opt.zero_grad()
        loss_fn(model, ids, targets).backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_loaded_at_the_same_size_continues_exactly(stage, tmp_path_factory):
    path = shared_dir(tmp_path_factory)
    ps = hvd.global_process_set
    first, then = data_for(hvd.size(), 3, 1), data_for(hvd.size(), 2, 2)
    model, opt = build(stage, ps)
    train(model, opt, first, ps)
    hvd.dcp.save({"model": model, "optim": opt, "epoch": 7}, path)
    train(model, opt, then, ps)
    expected = whole(model)
    model, opt = build(stage, ps)
    state = {"model": model, "optim": opt, "epoch": 0}
    hvd.dcp.load(state, path)
    assert state["epoch"] == 7
    train(model, opt, then, ps)
    got = whole(model)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_loaded_at_another_size_continues_like_one_process(stage, tmp_path_factory):
    if hvd.size() < 3:
        pytest.skip("written at n ranks, loaded at n - 1 >= 2")
    path = shared_dir(tmp_path_factory)
    first = data_for(hvd.size(), 3, 1)
    model, opt = build(stage, hvd.global_process_set)
    train(model, opt, first, hvd.global_process_set)
    hvd.dcp.save({"model": model, "optim": opt}, path)
    fewer = hvd.add_process_set(list(range(hvd.size() - 1)))
    try:
        then = data_for(fewer.size(), 2, 2)
        if fewer.included():
            model, opt = build(stage, fewer)
            hvd.dcp.load({"model": model, "optim": opt}, path)
            train(model, opt, then, fewer)
            got = whole(model)
            ref, _ = reference(first, then)
            for k, v in ref.state_dict().items():
                torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=k)
    finally:
        hvd.remove_process_set(fewer)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_torchs_own_reader_sees_the_whole_parameters_and_adam_state(tmp_path_factory):
    """Stage 3's files read back by torch.distributed.checkpoint itself (one process, no
    process group) into whole tensors: the parameters and AdamW's moments and step of one
    process on the full batch."""
    path = shared_dir(tmp_path_factory)
    first = data_for(hvd.size(), 3, 1)
    model, opt = build(3, hvd.global_process_set)
    train(model, opt, first, hvd.global_process_set)
    hvd.dcp.save({"model": model, "optim": opt}, path)
    ref, ref_opt = reference(first, [])
    names = {p: n for n, p in ref.named_parameters()}
    wanted = {"model." + k: torch.zeros_like(v) for k, v in ref.state_dict().items()}
    for p, st in ref_opt.state.items():
        for k, v in st.items():
            wanted["optim.state.%s.%s" % (names[p], k)] = torch.zeros_like(v)
    dcp.load(wanted, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(wanted["model." + k], v, rtol=1e-5, atol=1e-6, msg=k)
    for p, st in ref_opt.state.items():
        for k, v in st.items():
            torch.testing.assert_close(wanted["optim.state.%s.%s" % (names[p], k)], v,
                                       rtol=1e-5, atol=1e-7, msg="%s %s" % (names[p], k))


def test_a_checkpoint_of_another_model_is_an_error_naming_the_entry(tmp_path_factory):
    path = shared_dir(tmp_path_factory)
    model, opt = build(3, hvd.global_process_set)
    hvd.dcp.save({"model": model}, path)
    torch.manual_seed(5)
    other = hvd.shard_model(TinyLM(blocks=4), auto_wrap={Block})
    with pytest.raises(Exception, match=r"blocks\.3\.(norm|up|down)\.(weight|bias)"):
        hvd.dcp.load({"model": other}, path)
