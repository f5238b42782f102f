"""hvd.elastic's state objects and sampler on every rank (MPI and Gloo matrices): commit and
restore compared exactly, sync from rank 0, the sampler's re-partitioning by hand."""
import torch

import horovod_cpp.torch as hvd


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def train_steps(model, optimizer, n):
    for i in range(n):
        optimizer.zero_grad()
        model(torch.full((2, 4), float(i + 1))).sum().backward()
        optimizer.step()


def snapshot(model, optimizer):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {pid: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
             for pid, s in optimizer.state_dict()["state"].items()})


def assert_same(a, b):
    (ma, oa), (mb, ob) = a, b
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    assert oa.keys() == ob.keys()
    for pid in oa:
        for k in oa[pid]:
            x, y = oa[pid][k], ob[pid][k]
            assert torch.equal(x, y) if torch.is_tensor(x) else x == y


def test_torch_state_restore_is_the_last_commit_exactly():
    model = make_model(hvd.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=3, batch=7)
    train_steps(model, optimizer, 2)
    state.epoch, state.batch = 4, 0
    state.save()
    committed = snapshot(model, optimizer)
    train_steps(model, optimizer, 3)  # work after the commit: lost on restore
    state.epoch, state.batch = 5, 9
    assert not torch.equal(model[0].weight, committed[0]["0.weight"])
    state.restore()
    assert_same(snapshot(model, optimizer), committed)
    assert (state.epoch, state.batch) == (4, 0)
    # A second failure before the next commit rolls back to the same commit: the steps after
    # the first restore must not have changed what was committed (PyTorch 2's load_state_dict
    # keeps the tensors it is given).
    train_steps(model, optimizer, 2)
    state.restore()
    assert_same(snapshot(model, optimizer), committed)


def test_sharded_state_restored_twice_is_the_last_commit_exactly():
    model = make_model(0)
    optimizer = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.SGD, lr=0.1,
                                     momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=3)
    state.sync()
    train_steps(model, optimizer, 2)
    state.commit()
    optimizer.consolidate_state_dict(to=None)
    committed = ({k: v.clone() for k, v in model.state_dict().items()},
                 {i: {k: v.clone() for k, v in s.items()}
                  for i, s in optimizer.state_dict()["state"].items()})
    for _ in range(2):
        train_steps(model, optimizer, 3)
        state.restore()
        optimizer.consolidate_state_dict(to=None)
        now = (model.state_dict(), optimizer.state_dict()["state"])
        assert_same(now, committed)


def test_sync_gives_every_rank_rank0s_state():
    model = make_model(100 + hvd.rank())  # different on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(model, optimizer, 1 + hvd.rank())
    state = hvd.elastic.TorchState(model, optimizer, epoch=hvd.rank(), note="r%d" % hvd.rank())
    state.sync()
    reference = make_model(100)  # rank 0's model, trained as rank 0 trained it
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    train_steps(reference, ref_opt, 1)
    assert_same(snapshot(model, optimizer), snapshot(reference, ref_opt))
    assert (state.epoch, state.note) == (0, "r0")
    state.restore()  # what was synced is the new commit
    assert_same(snapshot(model, optimizer), snapshot(reference, ref_opt))


def test_object_state_and_callbacks():
    state = hvd.elastic.ObjectState(values=[hvd.rank()], step=hvd.rank() * 10)
    calls = []
    state.register_reset_callbacks([lambda: calls.append(hvd.size())])
    state.values.append(99)
    state.restore()
    assert state.values == [hvd.rank()]
    state.sync()
    assert (state.values, state.step) == ([0], 0)
    state.on_reset()
    assert calls == [hvd.size()]
    state.check_host_updates()  # not an elastic job: never raises


def test_elastic_sampler_repartitions_what_is_left():
    n, size, rank = 10, hvd.size(), hvd.rank()
    sampler = hvd.elastic.ElasticSampler(list(range(n)), shuffle=False)
    per_rank = -(-n // size)
    # Round-robin over 0..9, padded from the start so every rank has per_rank samples.
    padded = (list(range(n)) + list(range(n)))[:per_rank * size]
    assert list(sampler) == padded[rank::size] and len(sampler) == per_rank
    sampler.record_indices([0, 1, 2, 3])  # say these are done
    state = sampler.state_dict()
    other = hvd.elastic.ElasticSampler(list(range(n)), shuffle=False)
    other.load_state_dict(state)
    left = [4, 5, 6, 7, 8, 9]
    per_rank = -(-len(left) // size)
    padded = (left + left)[:per_rank * size]
    assert list(other) == padded[rank::size]
    everything = hvd.allgather_object(list(other))
    assert sorted(set(i for part in everything for i in part)) == left
    other.set_epoch(1)
    assert len(other.processed_indices) == 0 and len(other) == -(-n // size)
