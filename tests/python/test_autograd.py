"""Autograd through the collectives, checked numerically.

Each rank r computes y = op(x_r) and a loss L_r = sum(w_r * y) with its own weights. The
objective is the sum of every rank's loss, scaled as Horovod's gradient definitions imply
(allgather and broadcast average their incoming gradients, so for them it is the mean). The
analytic gradient comes from backward(); the numeric one from central differences in float64,
each rank perturbing one of its elements in turn while all ranks re-evaluate the objective.
"""
import pytest
import torch

import horovod_cpp.torch as hvd

EPS = 1e-6


def objective(op, x, weight, scale):
    """Every rank's loss, summed over ranks (plain allreduce, no autograd) and scaled."""
    with torch.no_grad():
        y = op(x)
        local = (weight * y).sum().reshape(1)
    return scale * hvd.allreduce(local, op=hvd.Sum).item()


def check(op, shape, out_shape, scale=1.0, probes=3):
    n, me = hvd.size(), hvd.rank()
    g = torch.Generator().manual_seed(100 + me)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    weight = torch.randn(out_shape, generator=g, dtype=torch.float64)
    xg = x.clone().requires_grad_()
    (weight * op(xg)).sum().backward()
    analytic = xg.grad
    numeric = torch.zeros(probes * n, dtype=torch.float64)
    wanted = torch.zeros(probes * n, dtype=torch.float64)
    for k in range(n):  # rank k perturbs its elements 0..probes-1
        for j in range(probes):
            flat = j * 7 % x.numel()
            values = []
            for sign in (1, -1):
                xp = x.clone()
                if me == k:
                    xp.view(-1)[flat] += sign * EPS
                values.append(objective(op, xp, weight, scale))
            if me == k:
                numeric[k * probes + j] = (values[0] - values[1]) / (2 * EPS)
                wanted[k * probes + j] = analytic.view(-1)[flat]
    assert torch.allclose(numeric, wanted, rtol=1e-5, atol=1e-6), (numeric, wanted)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_allreduce_gradient(op_name):
    op = {"Sum": hvd.Sum, "Average": hvd.Average}[op_name]
    check(lambda t: hvd.allreduce(t, op=op), (3, 4), (3, 4))


def test_allreduce_gradient_with_scale_factors():
    check(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
          (5,), (5,))


def test_grouped_allreduce_gradient():
    check(lambda t: torch.cat(hvd.grouped_allreduce([t[:2], t[2:] * 2], op=hvd.Sum)), (6,), (6,))


def test_allgather_gradient():
    # Rank r contributes r + 1 rows; every rank sees all rows. Horovod averages the gradient.
    n, me = hvd.size(), hvd.rank()
    rows = n * (n + 1) // 2
    check(lambda t: hvd.allgather(t), (me + 1, 2), (rows, 2), scale=1.0 / n)


def test_broadcast_gradient():
    n = hvd.size()
    check(lambda t: hvd.broadcast(t, root_rank=n - 1), (2, 3), (2, 3), scale=1.0 / n)


def test_alltoall_gradient():
    n, me = hvd.size(), hvd.rank()
    splits = [(me + d) % 2 + 1 for d in range(n)]
    rows_in = sum((r + me) % 2 + 1 for r in range(n))
    check(lambda t: hvd.alltoall(t, splits=splits)[0], (sum(splits), 2), (rows_in, 2))


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_reducescatter_gradient(op_name):
    op = {"Sum": hvd.Sum, "Average": hvd.Average}[op_name]
    n, me = hvd.size(), hvd.rank()
    rows = 2 * n + 1
    mine = rows // n + (1 if me < rows % n else 0)
    check(lambda t: hvd.reducescatter(t, op=op, prescale_factor=2.0), (rows, 3), (mine, 3))


def test_grouped_allgather_gradient():
    # Two members per rank (r + 1 rows each, the second scaled), gathered in one group.
    n, me = hvd.size(), hvd.rank()
    rows = n * (n + 1) // 2
    check(lambda t: torch.cat(hvd.grouped_allgather([t[:me + 1], t[me + 1:] * 2])),
          (2 * (me + 1), 2), (2 * rows, 2), scale=1.0 / n)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_grouped_reducescatter_gradient(op_name):
    op = {"Sum": hvd.Sum, "Average": hvd.Average}[op_name]
    n, me = hvd.size(), hvd.rank()
    rows = 2 * n + 1
    mine = rows // n + (1 if me < rows % n else 0)
    check(lambda t: torch.cat(hvd.grouped_reducescatter([t, t[:, :2] * 3], op=op,
                                                        prescale_factor=2.0), dim=1),
          (rows, 3), (mine, 5))
