"""Training written for torch.distributed, on the horovod_cpp backend against the same program
on the Gloo group (parameters within 1e-6 relative after the steps), and against one process
on the whole batch: DDP (several buckets, no_sync, find_unused_parameters) and FSDP2's
fully_shard. Programs that diverge across ranks end with an error on every rank."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4
PER_RANK = 6


def rank():
    return dist.get_rank()


def size():
    return dist.get_world_size()


class Branchy(nn.Module):
    """Head ``b`` on even steps, ``c`` on odd ones: a parameter unused in every step."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 24)
        self.b = nn.Linear(24, 3)
        self.c = nn.Linear(24, 3)

    def forward(self, x, step=0):
        h = F.relu(self.a(x))
        return self.b(h) if step % 2 == 0 else self.c(h)


def mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 3))


def data(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


def mine(x):
    return x[rank() * PER_RANK:(rank() + 1) * PER_RANK]


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_close(got, want, rtol=1e-6, atol=1e-7):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=rtol, atol=atol), (g - w).abs().max()


def train_ddp(group, make, accumulate=1, branchy=False, **kwargs):
    torch.manual_seed(0)
    model = make()
    ddp = DDP(model, process_group=group, **kwargs)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = data(step * accumulate + micro, PER_RANK * size())
            args = (mine(x), step) if branchy else (mine(x),)
            if micro < accumulate - 1:
                with ddp.no_sync():
                    (F.cross_entropy(ddp(*args), mine(y)) / accumulate).backward()
            else:
                (F.cross_entropy(ddp(*args), mine(y)) / accumulate).backward()
        opt.step()
    return params(model)


def train_one_process(make, accumulate=1, branchy=False):
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = data(step * accumulate + micro, PER_RANK * size())
            out = model(x, step) if branchy else model(x)
            (F.cross_entropy(out, y) / accumulate).backward()
        opt.step()
    return params(model)


@pytest.mark.parametrize("bucket_cap_mb", [25, 0.001])  # one bucket; one per parameter
@pytest.mark.parametrize("as_view", [False, True])
def test_ddp_matches_gloo_and_one_process(groups, bucket_cap_mb, as_view):
    kw = dict(bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=as_view)
    ours = train_ddp(groups[0], mlp, **kw)
    assert_close(ours, train_ddp(groups[1], mlp, **kw))
    assert_close(ours, train_one_process(mlp), rtol=1e-5, atol=1e-6)


def test_ddp_no_sync_accumulation_matches_gloo_and_one_process(groups):
    ours = train_ddp(groups[0], mlp, accumulate=3)
    assert_close(ours, train_ddp(groups[1], mlp, accumulate=3))
    assert_close(ours, train_one_process(mlp, accumulate=3), rtol=1e-5, atol=1e-6)


def test_ddp_find_unused_parameters_matches_gloo_and_one_process(groups):
    kw = dict(find_unused_parameters=True, bucket_cap_mb=0.001)
    ours = train_ddp(groups[0], Branchy, branchy=True, **kw)
    assert_close(ours, train_ddp(groups[1], Branchy, branchy=True, **kw))
    assert_close(ours, train_one_process(Branchy, branchy=True), rtol=1e-5, atol=1e-6)


def train_fsdp2(group, reshard=True):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group, "cpu")
    torch.manual_seed(0)
    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = data(step, PER_RANK * size())
        F.cross_entropy(model(mine(x)), mine(y)).backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_fully_shard_matches_gloo_and_one_process(groups, reshard):
    ours = train_fsdp2(groups[0], reshard)
    assert_close(ours, train_fsdp2(groups[1], reshard))
    assert_close(ours, train_one_process(mlp), rtol=1e-5, atol=1e-6)


# ---- programs that diverge ------------------------------------------------------------------

@pytest.mark.parametrize("differ", ["shape", "count"])
def test_ddp_of_different_models_is_an_error_on_every_rank(groups, differ):
    group = dist.new_group(list(range(size())))
    torch.manual_seed(0)
    last = rank() == size() - 1
    if differ == "shape":
        model = nn.Linear(12, 4 if last else 3)
    else:
        model = nn.Linear(12, 3, bias=not last)
    with pytest.raises(Exception) as info:
        DDP(model, process_group=group)
    msg = str(info.value)
    if differ == "count":
        # DDP gathers the parameter counts first: every rank raises, naming the others.
        assert "DDP expects same model across all ranks" in msg, msg
    elif last:
        # Same count: DDP's own check of the gathered shapes raises on this rank alone, while
        # the others go on to DDP's broadcast (on Gloo they would wait there for 30 minutes).
        # Waiting in a barrier as it stands for this rank's exit, it is named to them.
        assert "appears not to match sizes" in msg, msg
        with pytest.raises(Exception, match="deadlock"):
            dist.barrier(group=group)
    else:
        assert "deadlock" in msg and "rank %d" % (size() - 1) in msg, msg
    dist.destroy_process_group(group)


def test_ddp_where_a_rank_skips_a_step_is_an_error_naming_it(groups):
    group = dist.new_group(list(range(size())))
    torch.manual_seed(0)
    ddp = DDP(mlp(), process_group=group)
    with pytest.raises(Exception) as info:
        for step in range(2):
            if rank() == size() - 1 and step == 1:
                continue  # its data ran out a step early
            x, y = data(step, PER_RANK * size())
            F.cross_entropy(ddp(mine(x)), mine(y)).backward()
        dist.barrier(group=group)
    msg = str(info.value)
    assert "deadlock" in msg and "rank %d" % (size() - 1) in msg and "barrier" in msg, msg
    dist.destroy_process_group(group)


def test_fsdp2_of_different_models_is_an_error_naming_the_ranks(groups):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    group = dist.new_group(list(range(size())))
    mesh = DeviceMesh.from_group(group, "cpu")
    torch.manual_seed(0)
    model = nn.Linear(12, 6 * size() if rank() != 0 else 7 * size())
    fully_shard(model, mesh=mesh)
    with pytest.raises(Exception) as info:
        model(torch.randn(2, 12)).sum().backward()
    msg = str(info.value)
    assert "c10d." in msg and "rank 0" in msg, msg
    dist.destroy_process_group(group)
