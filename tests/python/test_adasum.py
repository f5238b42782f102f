"""op=hvd.Adasum: allreduce (sync, async, in place, grouped) and DistributedOptimizer(op=Adasum)
against a reference written here from the formula of Maleki et al. (arXiv 2006.02924) in numpy
float64, with every rank's input known to every rank; at np 3 (not a power of two) the errors."""
import numpy as np
import pytest
import torch

import horovod_cpp.torch as hvd
from horovod_cpp.torch.adasum import adasum_pair



def power_of_two():
    return hvd.size() & (hvd.size() - 1) == 0


@pytest.fixture
def pow2():
    if not power_of_two():
        pytest.skip("Adasum needs a power-of-two number of ranks")


def reference_pair(a, b):
    dot, anormsq, bnormsq = np.dot(a, b), np.dot(a, a), np.dot(b, b)
    acoeff = 1.0 - dot / (2.0 * anormsq) if anormsq != 0 else 1.0
    bcoeff = 1.0 - dot / (2.0 * bnormsq) if bnormsq != 0 else 1.0
    return acoeff * a + bcoeff * b


def reference(vectors):
    """The binary tree over the rank order: (0, 1), (2, 3), ... then their results, ..."""
    level = [np.asarray(v, dtype=np.float64).ravel() for v in vectors]
    while len(level) > 1:
        level = [reference_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def rank_tensor(rank, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def test_the_pairwise_rule_on_hand_computed_cases():
    a = torch.tensor([1.0, 0.0])
    b = torch.tensor([0.0, 2.0])
    assert adasum_pair(a, b).tolist() == [1.0, 2.0]  # orthogonal: the sum
    assert adasum_pair(b, b).tolist() == [0.0, 2.0]  # equal: the average
    c = torch.tensor([3.0, 4.0])
    # a.c = 3, |a|^2 = 1, |c|^2 = 25: (1 - 3/2) a + (1 - 3/50) c
    assert torch.allclose(adasum_pair(a, c), -0.5 * a + 0.94 * c)
    assert adasum_pair(torch.zeros(2), c).tolist() == [3.0, 4.0]  # zero: coefficient 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_allreduce_matches_the_reference(pow2, dtype):
    n, me = hvd.size(), hvd.rank()
    shape = (5, 7)
    mine = rank_tensor(me, shape, dtype)
    want = reference([rank_tensor(r, shape, dtype).numpy() for r in range(n)]).reshape(shape)
    tol = TOLERANCE[dtype]
    got = hvd.allreduce(mine, op=hvd.Adasum, name="adasum.sync.%s" % dtype)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)
    assert torch.equal(mine, rank_tensor(me, shape, dtype))  # the input is untouched
    handle = hvd.allreduce_async(mine, op=hvd.Adasum, name="adasum.async.%s" % dtype)
    np.testing.assert_allclose(hvd.synchronize(handle).numpy(), want, rtol=tol, atol=tol)
    inplace = mine.clone()
    hvd.synchronize(hvd.allreduce_async_(inplace, op=hvd.Adasum, name="adasum.inplace.%s" % dtype))
    np.testing.assert_allclose(inplace.numpy(), want, rtol=tol, atol=tol)
    # Every rank holds the same bits (one tree, one order).
    every = hvd.allgather(got.reshape(1, -1), name="adasum.bits.%s" % dtype)
    assert all(torch.equal(every[0], row) for row in every)
    # Scale factors: before the combination and after it.
    scaled = hvd.allreduce(mine, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.5,
                           name="adasum.scaled.%s" % dtype)
    want_scaled = 0.5 * reference([2.0 * rank_tensor(r, shape, dtype).numpy()
                                   for r in range(n)]).reshape(shape)
    np.testing.assert_allclose(scaled.numpy(), want_scaled, rtol=tol, atol=tol)


def test_grouped_allreduce_combines_each_tensor_on_its_own(pow2):
    n, me = hvd.size(), hvd.rank()
    shapes = [(3,), (4, 2), ()]
    mine = [rank_tensor(me, s, torch.float64, seed=i + 1) for i, s in enumerate(shapes)]
    got = hvd.grouped_allreduce(mine, op=hvd.Adasum, name="adasum.group")
    for i, (s, g) in enumerate(zip(shapes, got)):
        want = reference([rank_tensor(r, s, torch.float64, seed=i + 1).numpy()
                          for r in range(n)]).reshape(s)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-12, atol=1e-12)
    # Not the tree of the concatenation: the coefficients are per tensor.
    joint = reference([torch.cat([rank_tensor(r, s, torch.float64, seed=i + 1).reshape(-1)
                                  for i, s in enumerate(shapes)]).numpy() for r in range(n)])
    assert not np.allclose(torch.cat([g.reshape(-1) for g in got]).numpy(), joint)
    handle = hvd.grouped_allreduce_async_([t.clone() for t in mine], op=hvd.Adasum,
                                          name="adasum.group_")
    for a, b in zip(hvd.synchronize(handle), got):
        assert torch.equal(a, b)


def test_half_precision_is_combined_in_float32(pow2):
    n, me = hvd.size(), hvd.rank()
    for dtype in (torch.float16, torch.bfloat16):
        got = hvd.allreduce(rank_tensor(me, (64,), dtype), op=hvd.Adasum, name="adasum.%s" % dtype)
        assert got.dtype == dtype
        want = reference([rank_tensor(r, (64,), dtype).float().numpy() for r in range(n)])
        np.testing.assert_allclose(got.float().numpy(), want, rtol=2e-2, atol=2e-2)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x)


def batch_of(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_distributed_optimizer_combines_the_ranks_deltas(pow2, momentum):
    """Each rank takes its own optimizer step; the parameters become start + Adasum of the
    ranks' deltas. The reference: every rank's model and optimizer simulated here."""
    n, me, lr, steps = hvd.size(), hvd.rank(), 0.1, 3
    model = Linear()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    sims = [Linear() for _ in range(n)]
    sim_opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum) for m in sims]
    for step in range(steps):
        x, y = batch_of(me, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        # The reference: each simulated rank steps from the common parameters ...
        deltas = []
        for r, (m, o) in enumerate(zip(sims, sim_opts)):
            start = [p.detach().clone() for p in m.parameters()]
            x, y = batch_of(r, step)
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
            deltas.append([p.detach() - s for p, s in zip(m.parameters(), start)])
            with torch.no_grad():
                for p, s in zip(m.parameters(), start):
                    p.copy_(s)
        # ... and all take start + the tree of the deltas, parameter by parameter.
        with torch.no_grad():
            for i, _ in enumerate(sims[0].parameters()):
                combined = torch.from_numpy(reference([d[i].numpy() for d in deltas]))
                for m in sims:
                    p = list(m.parameters())[i]
                    p.add_(combined.reshape(p.shape).to(p.dtype))
        for p, q in zip(model.parameters(), sims[0].parameters()):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (step, p, q)


def test_a_job_whose_size_is_not_a_power_of_two_gets_a_clear_error():
    if power_of_two():
        pytest.skip("a power-of-two job runs Adasum")
    with pytest.raises(ValueError, match="Adasum needs a power-of-two number of ranks "
                                         r"\(as in Horovod\); the job has %d" % hvd.size()):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(ValueError, match="op=Adasum needs a power-of-two number of ranks"):
        hvd.DistributedOptimizer(torch.optim.SGD(Linear().parameters(), lr=0.1), op=hvd.Adasum)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()  # the job goes on


def test_what_adasum_does_not_take():
    with pytest.raises(ValueError, match="Adasum"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(ValueError, match="only supports AVERAGE and SUM"):
        hvd.reducescatter(torch.ones(4), op=hvd.Adasum)
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.allreduce(torch.ones(2), op=17)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
