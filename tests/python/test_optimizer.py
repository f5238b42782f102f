"""DistributedOptimizer: N ranks each on 1/N of the batch must match one process on the full
batch (the reference is computed here with plain torch), plus Horovod's checks and warnings."""
import warnings

import pytest
import torch

import horovod_cpp.torch as hvd

FEATURES, HIDDEN, CLASSES, PER_RANK = 6, 8, 3, 4


def make_model(seed=7):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, CLASSES)).double()


def batches(steps, micro):
    """The full batches every rank agrees on: steps x micro x (n * PER_RANK) samples."""
    g = torch.Generator().manual_seed(11)
    total = hvd.size() * PER_RANK
    return [[(torch.randn(total, FEATURES, generator=g, dtype=torch.float64),
              torch.randint(0, CLASSES, (total,), generator=g)) for _ in range(micro)]
            for _ in range(steps)]


def shard(x):
    return x[hvd.rank() * PER_RANK:(hvd.rank() + 1) * PER_RANK]


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def train_reference(kind, data):
    model = make_model()
    opt = make_optimizer(kind, model.parameters())
    for micro_batches in data:
        opt.zero_grad()
        for x, y in micro_batches:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_distributed(kind, data, groups=None):
    """`groups`: None, an int, or a function of the model returning lists of parameters."""
    model = make_model()
    opt = hvd.DistributedOptimizer(make_optimizer(kind, model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=len(data[0]),
                                   groups=groups(model) if callable(groups) else groups)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for micro_batches in data:
        opt.zero_grad()
        for x, y in micro_batches:
            torch.nn.functional.cross_entropy(model(shard(x)), shard(y)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], opt


def explicit_groups(model):
    params = list(model.parameters())
    return [params[:2], params[2:]]


@pytest.mark.parametrize("groups", [None, 2, explicit_groups], ids=["no-groups", "2-groups",
                                                                    "lists"])
@pytest.mark.parametrize("micro", [1, 2], ids=["bpps1", "bpps2"])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_matches_one_process_on_the_full_batch(kind, micro, groups):
    data = batches(steps=3, micro=micro)
    want = train_reference(kind, data)
    got, opt = train_distributed(kind, data, groups)
    assert isinstance(opt, torch.optim.SGD if kind == "sgd" else torch.optim.Adam)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-9, atol=1e-11), (g - w).abs().max()


def test_parameters_stay_identical_on_every_rank():
    data = batches(steps=2, micro=1)
    got, _ = train_distributed("adam", data)
    for p in got:
        gathered = hvd.allgather(p.reshape(1, -1))
        assert torch.equal(gathered, p.reshape(1, -1).expand(hvd.size(), -1))


def test_a_gradient_computed_on_some_ranks_only_is_still_averaged():
    # Rank 0 uses the second layer twice, the others not at all (a dynamic graph): every rank
    # must still submit that gradient, and it is averaged with zeros.
    torch.manual_seed(3)
    a, b = torch.nn.Linear(2, 2).double(), torch.nn.Linear(2, 2).double()
    hvd.broadcast_parameters(list(a.state_dict().values()) + list(b.state_dict().values()), 0)
    params = [("a." + k, v) for k, v in a.named_parameters()] + \
             [("b." + k, v) for k, v in b.named_parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([v for _, v in params], lr=1.0),
                                   named_parameters=params, op=hvd.Sum)
    x = torch.ones(1, 2, dtype=torch.float64)
    out = a(x)
    if hvd.rank() == 0:
        out = b(out)
    out.sum().backward()
    opt.synchronize()
    rank0_grad = torch.zeros(2, dtype=torch.float64)
    if hvd.rank() == 0:
        rank0_grad = b.bias.grad.clone()
    expected = hvd.broadcast(rank0_grad, 0)
    assert torch.equal(b.bias.grad, expected)  # Sum over ranks: rank 0's, plus zeros
    with opt.skip_synchronize():
        opt.step()


def test_step_after_synchronize_warns_unless_skipped():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(2, FEATURES, dtype=torch.float64)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match=r"optimizer.step\(\) called without "
                                         r"optimizer.skip_synchronize\(\) context after "
                                         r"optimizer.synchronize\(\)"):
        opt.step()
    opt.zero_grad()
    model(torch.ones(2, FEATURES, dtype=torch.float64)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()


def test_zero_grad_with_allreduces_outstanding_raises():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(2, FEATURES, dtype=torch.float64)).sum().backward()
    with pytest.raises(AssertionError, match=r"optimizer.zero_grad\(\) was called after "
                                             r"loss.backward\(\) but before optimizer.step\(\)"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()


def test_too_many_backward_passes_raise():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(2, FEATURES, dtype=torch.float64)).sum().backward()
    with pytest.raises(AssertionError, match="Gradients were computed more than "
                                             "backward_passes_per_step times"):
        model(torch.ones(2, FEATURES, dtype=torch.float64)).sum().backward()
    opt.synchronize()  # the first pass's allreduces are still owed to the other ranks


def test_bad_arguments():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="named_parameters should be a sequence of tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[p for p in model.parameters()])
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="must be unique. Found duplicates: 0.weight"):
        hvd.DistributedOptimizer(sgd, named_parameters=named + [named[0]])
    with pytest.raises(ValueError, match="one or more model parameters were not named"):
        hvd.DistributedOptimizer(sgd, named_parameters=named[:1])
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != "
                                         "Average"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)


def test_predivide_factor_and_fp16_compression_keep_the_average():
    data = batches(steps=2, micro=1)
    want = train_reference("sgd", data)
    model = make_model()
    opt = hvd.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   gradient_predivide_factor=4.0)
    for (x, y), in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(shard(x)), shard(y)).backward()
        opt.step()
    for g, w in zip(model.parameters(), want):
        assert torch.allclose(g, w, rtol=1e-9, atol=1e-11)
    model = make_model()
    model.float()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    model(torch.ones(2, FEATURES)).sum().backward()
    opt.synchronize()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    with opt.skip_synchronize():
        opt.step()


# ---- sparse gradients (nn.Embedding(sparse=True)) -----------------------------------------

ROWS, DIM = 12, 3


def sparse_batches(steps):
    """Per step, every rank's lookups and weights; rank r looks up r + 2 rows (uneven), drawn
    so that ranks share some rows and some rows are never looked up."""
    g = torch.Generator().manual_seed(5)
    return [[(torch.randint(0, ROWS - 2, (r + 2,), generator=g),
              torch.randn(r + 2, DIM, generator=g, dtype=torch.float64))
             for r in range(hvd.size())] for _ in range(steps)]


def make_embedding():
    torch.manual_seed(3)
    return torch.nn.Embedding(ROWS, DIM, sparse=True).double()


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["sparse", "as-dense"])
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_sparse_gradients_match_one_process_on_the_full_batch(op, sparse_as_dense):
    op_code = {"Sum": hvd.Sum, "Average": hvd.Average}[op]
    data = sparse_batches(steps=3)
    n = hvd.size()

    ref = make_embedding()
    ref_opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.05)
    for per_rank in data:
        ref_opt.zero_grad()
        loss = sum((ref(idx) * w).sum() for idx, w in per_rank)
        (loss / n if op == "Average" else loss).backward()
        assert ref.weight.grad.is_sparse
        ref_opt.step()

    emb = make_embedding()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.05),
                                   named_parameters=emb.named_parameters(), op=op_code,
                                   sparse_as_dense=sparse_as_dense)
    hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
    for per_rank in data:
        opt.zero_grad()
        idx, w = per_rank[hvd.rank()]
        (emb(idx) * w).sum().backward()
        opt.synchronize()
        assert emb.weight.grad.is_sparse  # SparseAdam takes only sparse gradients
        with opt.skip_synchronize():
            opt.step()
    assert torch.allclose(emb.weight.detach(), ref.weight.detach(), rtol=1e-9, atol=1e-12), \
        (emb.weight.detach() - ref.weight.detach()).abs().max()
    untouched = sorted(set(range(ROWS)) - {int(i) for step in data for idx, _ in step
                                           for i in idx})
    assert untouched and torch.equal(emb.weight.detach()[untouched], make_embedding().weight
                                     .detach()[untouched])


def test_sparse_allreduce_of_uneven_nonzeros_sums_and_averages():
    n, me = hvd.size(), hvd.rank()
    dense = torch.zeros(5, 2, dtype=torch.float64)
    for k in range(me + 1):  # rank r has r + 1 nonzero rows, row 0 on every rank
        dense[k % 5] += torch.tensor([me + 1.0, k + 0.5], dtype=torch.float64)
    want = torch.zeros(5, 2, dtype=torch.float64)
    for r in range(n):
        for k in range(r + 1):
            want[k % 5] += torch.tensor([r + 1.0, k + 0.5], dtype=torch.float64)
    total = hvd.sparse_allreduce_async(dense.to_sparse(), name="uneven.sum", op=hvd.Sum)()
    assert total.is_sparse and torch.equal(total.to_dense(), want)
    mean = hvd.sparse_allreduce_async(dense.to_sparse(), name="uneven.avg", op=hvd.Average)()
    assert torch.allclose(mean.to_dense(), want / n)
