"""PowerSGD (hvd.Compression.powersgd) and bf16 compression in DistributedOptimizer, against
independent references: a one-process simulation of PowerSGD over every rank's gradients
(written from the algorithm, orthonormalizing with torch.linalg.qr, not the product's
Gram-Schmidt), and for bf16 the full-precision average rounded as bf16 would."""
import copy

import pytest
import torch

import horovod_cpp.torch as hvd
from horovod_cpp.torch.compression.powersgd import low_rank_product, q_seed
from conftest import same_on_every_rank


class Net(torch.nn.Module):
    """Matrices worth compressing (conv 6x3x3x3, 12x24), one not worth it (2x12), vectors."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.fc1 = torch.nn.Linear(24, 12)
        self.fc2 = torch.nn.Linear(12, 2)

    def forward(self, x):
        h = torch.relu(self.conv(x))             # N x 6 x 4 x 4
        h = torch.nn.functional.avg_pool2d(h, 2).flatten(1)  # N x 24
        return self.fc2(torch.relu(self.fc1(h)))


def data(rank, step, n=4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 3, 6, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (n,), generator=g)
    return x, y


def make_model(dtype=torch.float64):
    torch.manual_seed(7)
    return Net().to(dtype)


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x.to(next(model.parameters()).dtype)), y)


def reference(size, steps, rank_r, start, error_feedback, warm_start, seed=0, lr=0.1,
              errors=None, qs=None, first_step=0, model=None, compress_at=None):
    """One process: every simulated rank's gradient on its own batch, then PowerSGD as the
    paper and PyTorch's hook define it. ``compress_at(step)`` False: that step averages
    every gradient exactly, each with its rank's error added (which is then dropped), as the
    adaptive policy's exact steps do. Returns (model, reduced gradients per step, errors,
    qs)."""
    model = model if model is not None else make_model()
    names = [n for n, _ in model.named_parameters()]
    errors = {} if errors is None else {k: [e.clone() for e in v] for k, v in errors.items()}
    qs = {} if qs is None else {k: v.clone() for k, v in qs.items()}
    history = []
    for step in range(first_step, first_step + steps):
        grads = []
        for r in range(size):
            model.zero_grad()
            loss_of(model, *data(r, step)).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        reduced = {}
        for name in names:
            g = [grads[r][name] for r in range(size)]
            shape = g[0].shape
            n = shape[0]
            m = g[0].numel() // n
            r_ = min(n, m, rank_r)
            if step < start or g[0].dim() < 2 or not n * m > (n + m) * r_ * 2:
                reduced[name] = sum(g) / size
                continue
            if compress_at is not None and not compress_at(step):
                kept = errors.pop(name, [0] * size)
                reduced[name] = sum(x + (e.reshape(x.shape) if torch.is_tensor(e) else e)
                                    for x, e in zip(g, kept)) / size
                continue
            mats = [x.reshape(n, m) + (errors[name][i] if error_feedback and name in errors
                                        else 0) for i, x in enumerate(g)]
            q = qs.get(name) if warm_start else None
            if q is None:
                gen = torch.Generator().manual_seed(q_seed(seed, name, step))
                q = torch.randn(m, r_, generator=gen, dtype=torch.float32).to(mats[0].dtype)
            q = torch.linalg.qr(q).Q
            p = torch.linalg.qr(sum(mat @ q for mat in mats)).Q
            q = sum(mat.t() @ p for mat in mats) / size
            approx = p @ q.t()
            if error_feedback:
                errors[name] = [mat - approx for mat in mats]
            if warm_start:
                qs[name] = q
            reduced[name] = approx.reshape(shape)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p -= lr * reduced[name]
        history.append(reduced)
    return model, history, errors, qs


def distributed(steps, rank_r, start, error_feedback, warm_start, seed=0, lr=0.1, model=None,
                compression=None, first_step=0):
    model = model if model is not None else make_model()
    comp = compression or hvd.Compression.powersgd(
        matrix_approximation_rank=rank_r, start_powerSGD_iter=start,
        use_error_feedback=error_feedback, warm_start=warm_start, random_seed=seed,
        adaptive=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), compression=comp)
    history = []
    for step in range(first_step, first_step + steps):
        opt.zero_grad()
        loss_of(model, *data(hvd.rank(), step)).backward()
        opt.synchronize()
        history.append({n: p.grad.clone() for n, p in model.named_parameters()})
        with opt.skip_synchronize():
            opt.step()
    return model, history, comp, opt


# float64 goes through torch's operations, float32 through the core's fused passes
# (hvd.LowRankStart/Finish); the reference computes in the model's dtype with torch alone.
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rank_r,start,error_feedback,warm_start", [
    (1, 0, True, True), (2, 2, True, True), (2, 0, False, True), (3, 1, True, False)])
def test_powersgd_agrees_with_a_one_process_reference(rank_r, start, error_feedback, warm_start,
                                                      dtype):
    steps = 5
    model, history, comp, _ = distributed(steps, rank_r, start, error_feedback, warm_start,
                                          model=make_model(dtype))
    ref_model, ref_history, _, _ = reference(hvd.size(), steps, rank_r, start, error_feedback,
                                             warm_start, model=make_model(dtype))
    for step, (got, want) in enumerate(zip(history, ref_history)):
        for name in want:
            assert got[name].dtype == dtype
            assert torch.allclose(got[name], want[name], atol=1e-5, rtol=1e-5), (step, name)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=1e-5), name
    # Every rank got the same gradients, and the compressed ones are low-rank.
    assert same_on_every_rank([h["fc1.weight"].sum().item() for h in history]) == \
        [[h["fc1.weight"].sum().item() for h in history]] * hvd.size()
    if start < steps:
        assert torch.linalg.matrix_rank(history[-1]["fc1.weight"]).item() <= rank_r
    # What a step sends: (n + m) r for a matrix that saves more than 2x (conv 6x27 up to
    # r = 2, fc1 12x24 up to r = 3, never fc2 2x12), the rest whole.
    whole = sum(p.numel() for p in model.parameters())
    sent = whole
    for n, m in ((6, 27), (12, 24)):
        if n * m > 2 * (n + m) * rank_r:
            sent += (n + m) * rank_r - n * m
    assert comp.compression_rate() == pytest.approx(whole / sent)
    assert comp.iter == steps


class Tall(torch.nn.Module):
    """A 600 x 108 weight: at r <= 4 its P Q^T is taken as outer products, not one product."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(108, 600)
        self.fc2 = torch.nn.Linear(600, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rank_r", [2, 4])
def test_powersgd_of_a_tall_matrix_agrees_with_the_reference(rank_r, dtype):
    def tall():
        torch.manual_seed(3)
        return Tall().to(dtype)
    steps = 3
    model, history, _, _ = distributed(steps, rank_r, 0, True, True, model=tall())
    _, ref_history, _, _ = reference(hvd.size(), steps, rank_r, 0, True, True, model=tall())
    for step, (got, want) in enumerate(zip(history, ref_history)):
        for name in want:
            assert torch.allclose(got[name], want[name], atol=1e-5, rtol=1e-5), (step, name)
    assert torch.linalg.matrix_rank(history[-1]["fc1.weight"]).item() <= rank_r


@pytest.mark.parametrize("r,n,m", [(1, 600, 200), (4, 512, 30), (2, 200, 400), (4, 200, 400),
                                   (5, 600, 50), (3, 7, 9)])
def test_low_rank_product_is_p_times_q_transposed(r, n, m):
    # Both forms (outer products for r <= 4 on >= 512 rows, or r <= 2 on >= 65536 elements;
    # one product otherwise) against the product in float64.
    g = torch.Generator().manual_seed(r * n + m)
    pt, qt = torch.randn(r, n, generator=g), torch.randn(r, m, generator=g)
    want = torch.mm(pt.double().t(), qt.double())
    got = low_rank_product(pt, qt)
    assert got.shape == (n, m) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)


def test_powersgd_before_start_is_the_exact_average():
    model, history, comp, _ = distributed(2, 1, 10, True, True)
    _, ref_history, _, _ = reference(hvd.size(), 2, 1, 10, True, True)
    for got, want in zip(history, ref_history):
        for name in want:
            assert torch.allclose(got[name], want[name], atol=1e-12), name
    assert comp.errors == {} and comp.qs == {}


def model_from(state):
    """A new model (an optimizer's hooks stay on the parameters it was given) with ``state``."""
    model = make_model()
    model.load_state_dict(state)
    return model


def test_powersgd_state_dict_round_trip_continues_the_same_trajectory():
    model, _, comp, _ = distributed(3, 2, 0, True, True)
    saved_model, saved = copy.deepcopy(model.state_dict()), comp.state_dict()
    after, _, _, _ = distributed(2, 2, 0, True, True, model=model_from(saved_model),
                                 compression=comp, first_step=3)
    comp2 = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=0,
                                     adaptive=False)
    comp2.load_state_dict(saved)
    again, _, _, _ = distributed(2, 2, 0, True, True, model=model_from(saved_model),
                                 compression=comp2, first_step=3)
    for p, q in zip(again.parameters(), after.parameters()):
        # (not bit-equal: a ring's order of summation follows a tensor's place in the fusion
        # buffer, which follows timing)
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12)


def adaptive_powersgd(step_cost, block=2, blocks=2, interval=5, rank_r=2):
    """An adaptive PowerSGD on a fake clock: a step costs ``step_cost(compressed)`` seconds."""
    comp = hvd.Compression.powersgd(matrix_approximation_rank=rank_r, start_powerSGD_iter=0)
    comp.PROBE_BLOCK, comp.PROBE_BLOCKS, comp.PROBE_INTERVAL = block, blocks, interval
    comp.probe_interval = interval
    now = [0.0]

    def clock():  # called once per step, when it ends
        now[0] += step_cost(comp._mode()[0])
        return now[0]
    comp.clock = clock
    return comp


def probe_modes(first_probe, decision, block=2, blocks=2, interval=5):
    """The steps the policy compresses: a probe of ``blocks`` exact and compressed blocks
    (exact first) from ``first_probe``, then ``decision`` until the next probe."""
    length = 2 * block * blocks

    def compress_at(step):
        k = step - first_probe
        if 0 <= k < length:
            return (k // block) % 2 == 1
        if k >= length + interval:
            return ((k - length - interval) // block) % 2 == 1
        return decision
    return compress_at


@pytest.mark.parametrize("compression_pays", [False, True])
def test_adaptive_powersgd_follows_its_probe_and_keeps_every_error(compression_pays):
    # Probe over steps 0-7 (blocks of 2: exact, compressed, exact, compressed), then the
    # decision: compressed steps cost 2 s and exact ones 1 s, or the reverse. Every reduced
    # gradient against the one-process reference run with the same steps compressed, where an
    # exact step after compressed ones sends each rank's error with its gradient.
    cost = (lambda c: 1.0 if c else 2.0) if compression_pays else (lambda c: 2.0 if c else 1.0)
    comp = adaptive_powersgd(cost)
    steps = 12
    _, history, _, _ = distributed(steps, 2, 0, True, True, compression=comp)
    interval = 10 if compression_pays else 5  # doubled when the decision stays, else reset
    _, ref_history, _, _ = reference(hvd.size(), steps, 2, 0, True, True,
                                     compress_at=probe_modes(0, compression_pays,
                                                             interval=interval))
    for step, (got, want) in enumerate(zip(history, ref_history)):
        for name in want:
            assert torch.allclose(got[name], want[name], atol=1e-5, rtol=1e-5), (step, name)
    assert comp.decisions == [(8, 1000.0 if compression_pays else 2000.0,
                               2000.0 if compression_pays else 1000.0, compression_pays)]
    assert comp.compressing is compression_pays
    assert comp.next_probe == 8 + interval
    ranks = [torch.linalg.matrix_rank(h["fc1.weight"]).item() for h in history]
    if compression_pays:
        assert all(r <= 2 for r in ranks[8:])
    else:
        assert all(r > 2 for r in ranks[8:]) and comp.errors == {}
    assert comp.state_dict()["adaptive"] == {"compressing": compression_pays,
                                             "next_probe": 8 + interval,
                                             "probe_interval": interval}


def test_adaptive_powersgd_ranks_take_one_decision_from_the_slowest():
    # Rank 0 finds compressed steps faster, every other rank slower: the job goes by its
    # slowest rank's times (compressed 3 s against exact 2 s), and every rank decides alike.
    fast = hvd.rank() == 0
    comp = adaptive_powersgd(lambda c: (1.0 if fast else 3.0) if c else 2.0)
    distributed(9, 2, 0, True, True, compression=comp)
    assert comp.decisions == [(8, 3000.0, 2000.0, False)]
    assert same_on_every_rank(comp.compressing) == [False] * hvd.size()


def test_adaptive_powersgd_state_restarts_a_probe_under_way():
    comp = adaptive_powersgd(lambda c: 1.0)
    distributed(3, 2, 0, True, True, compression=comp)  # steps 0-2: inside the first probe
    state = comp.state_dict()
    other = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=0)
    other.load_state_dict(state)
    assert (other.iter, other.next_probe, other.compressing) == (3, 3, True)
    del state["adaptive"]  # a state saved before the policy existed: its defaults
    other.load_state_dict(state)
    assert other.iter == 3 and other.next_probe == 3


def test_only_the_mean_error_matters():
    """What hvd.elastic keeps of the errors (their mean over the ranks) continues the job
    exactly as every rank's own error would."""
    model, _, comp, _ = distributed(3, 2, 0, True, True)
    committed = comp._elastic_commit(hvd.global_process_set)
    for name, mean in committed["errors"].items():
        gathered = hvd.allgather(comp.errors[name].unsqueeze(0), name="err." + name)
        assert torch.allclose(mean, gathered.mean(0), atol=1e-12)
    assert set(committed["errors"]) == {"conv.weight", "fc1.weight"}
    saved_model = copy.deepcopy(model.state_dict())
    own, _, _, _ = distributed(3, 2, 0, True, True, model=model_from(saved_model),
                               compression=comp, first_step=3)
    comp.load_state_dict(committed)  # every rank: the mean error
    mean, _, _, _ = distributed(3, 2, 0, True, True, model=model_from(saved_model),
                                compression=comp, first_step=3)
    for p, q in zip(mean.parameters(), own.parameters()):
        assert torch.allclose(p, q, atol=1e-10)
    # ... and differ from forgetting the errors.
    comp.load_state_dict(dict(committed, errors={}))
    forgot, _, _, _ = distributed(3, 2, 0, True, True, model=model_from(saved_model),
                                  compression=comp, first_step=3)
    assert not torch.allclose(forgot.fc1.weight, own.fc1.weight, atol=1e-6)


def test_powersgd_refuses_what_it_cannot_do():
    model = make_model()
    with pytest.raises(ValueError, match="op must be Average"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), op=hvd.Sum,
                                 compression=hvd.Compression.powersgd())
    with pytest.raises(TypeError, match="compresses an optimizer's gradients"):
        hvd.allreduce(torch.ones(4, 4), compression=hvd.Compression.powersgd())
    with pytest.raises(ValueError, match="matrix_approximation_rank"):
        hvd.Compression.powersgd(matrix_approximation_rank=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bf16_compression_is_the_average_at_bf16_precision(dtype):
    x = (torch.arange(64, dtype=dtype) / 7 + hvd.rank()).reshape(8, 8)
    got = hvd.allreduce(x, name="bf16.%s" % dtype, compression=hvd.Compression.bf16)
    assert got.dtype == dtype
    every = [(torch.arange(64, dtype=dtype) / 7 + r).reshape(8, 8) for r in range(hvd.size())]
    exact = sum(every) / hvd.size()
    # Each input rounded to bf16 (8 bits of mantissa), each partial sum and the average too.
    assert torch.allclose(got, exact, rtol=2 ** -6, atol=0)
    assert not torch.equal(got, exact)  # it did travel as bf16
    ints = torch.arange(6, dtype=torch.int64)  # not floating point: exact
    assert torch.equal(hvd.allreduce(ints, name="bf16.ints", op=hvd.Sum,
                                     compression=hvd.Compression.bf16), ints * hvd.size())


def test_bf16_distributed_optimizer_trains_like_full_precision():
    torch.manual_seed(3)
    model = torch.nn.Linear(6, 3)
    ref = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.bf16)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        xs = [torch.randn(5, 6, generator=torch.Generator().manual_seed(step * 10 + r))
              for r in range(hvd.size())]
        opt.zero_grad()
        model(xs[hvd.rank()]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(ref(x).pow(2).mean() for x in xs) / hvd.size()).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("groups", [None, 2])
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_cast_compression_in_distributed_optimizer_averages_each_steps_gradients(name, groups):
    """fp16 and bf16 through DistributedOptimizer (one wire buffer per gradient, reused): every
    step's gradient is that step's average over the ranks at the wire's precision (never a
    stale buffer), a float32 tensor, written into the gradient itself where it persists."""
    wire = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    eps = torch.finfo(wire).eps
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(),
                                   compression=getattr(hvd.Compression, name), groups=groups)

    def inputs(rank, step):
        return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + rank))

    def gradients(rank, step):  # lr 0: the parameters never change, so any rank can compute
        m = copy.deepcopy(model)
        m.zero_grad()
        m(inputs(rank, step)).pow(2).sum().backward()
        return [p.grad.clone() for p in m.parameters()]

    travelled = False
    for step in range(4):
        set_to_none = step % 2 == 1
        opt.zero_grad(set_to_none=set_to_none)
        model(inputs(hvd.rank(), step)).pow(2).sum().backward()
        kept = [p.grad.data_ptr() for p in model.parameters()]
        opt.synchronize()
        every = [gradients(r, step) for r in range(hvd.size())]
        for i, p in enumerate(model.parameters()):
            exact = sum(g[i] for g in every) / hvd.size()
            scale = max(float(g[i].abs().max()) for g in every)
            assert p.grad.dtype == torch.float32
            assert torch.allclose(p.grad, exact, rtol=4 * eps, atol=4 * eps * scale), (step, i)
            travelled = travelled or not torch.equal(p.grad, exact)
            if not set_to_none:
                assert kept[i] == p.grad.data_ptr()  # decompressed into the gradient itself
        with opt.skip_synchronize():
            opt.step()
    assert travelled  # the gradients did travel at the wire's precision
