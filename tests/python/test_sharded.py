"""ShardedOptimizer (stages 1 and 2): N ranks each on 1/N of the batch must match one process on
the full batch (the reference computed here with plain torch), and DistributedOptimizer; the
consolidated state must equal the unsharded optimizer's; a state saved at one world size must
load at another and continue identically."""
import math

import pytest
import torch

import horovod_cpp.torch as hvd

FEATURES, HIDDEN, CLASSES, PER_RANK = 6, 8, 3, 4
# 200 bytes: the small model's four tensors land in four buckets of 3, 24, 8 and 48 doubles, so
# at 4 ranks one bucket leaves a rank an empty slice and the others split unevenly.
SMALL_BUCKETS_MB = 200 / (1024 * 1024)


def make_model(seed=7, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, CLASSES)).to(dtype)


def batches(steps, micro, dtype=torch.float64, seed=11):
    """The full batches every rank agrees on: steps x micro x (size * PER_RANK) samples."""
    g = torch.Generator().manual_seed(seed)
    total = hvd.size() * PER_RANK
    return [[(torch.randn(total, FEATURES, generator=g).to(dtype),
              torch.randint(0, CLASSES, (total,), generator=g)) for _ in range(micro)]
            for _ in range(steps)]


def shard(x, process_set=hvd.global_process_set):
    r = process_set.rank()
    n = process_set.size()
    per = x.shape[0] // n
    return x[r * per:(r + 1) * per]


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}


def loss_fn(model, x, y):
    # The mean over equal parts: the gradient averaged over ranks is the full batch's.
    return torch.nn.functional.cross_entropy(model(x), y)


def train_reference(kind, data, max_norm=None, model=None):
    model = model or make_model()
    cls, kw = OPTIMIZERS[kind]
    opt = cls(model.parameters(), **kw)
    norms = []
    for micro_batches in data:
        opt.zero_grad()
        for x, y in micro_batches:
            loss_fn(model, x, y).backward()
        if max_norm is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
    return model, opt, norms


def train_sharded(kind, stage, data, max_norm=None, model=None, opt=None,
                  process_set=hvd.global_process_set, bucket_cap_mb=SMALL_BUCKETS_MB):
    model = model or make_model()
    cls, kw = OPTIMIZERS[kind]
    if opt is None:
        opt = hvd.ShardedOptimizer(model.named_parameters(), cls, stage=stage,
                                   backward_passes_per_step=len(data[0]),
                                   process_set=process_set, bucket_cap_mb=bucket_cap_mb, **kw)
    norms = []
    for micro_batches in data:
        opt.zero_grad()
        for x, y in micro_batches:
            loss_fn(model, shard(x, process_set), shard(y, process_set)).backward()
        if max_norm is not None:
            norms.append(float(opt.clip_grad_norm_(max_norm)))
        opt.step()
    return model, opt, norms


def assert_params_close(got, want, rtol=1e-9, atol=1e-11):
    for (name, g), w in zip(got.named_parameters(), want.parameters()):
        assert torch.allclose(g, w, rtol=rtol, atol=atol), (name, (g - w).abs().max())


def assert_state_equal(got, want, rtol=1e-9, atol=1e-11):
    assert set(got["state"]) == set(want["state"])
    for i, entry in want["state"].items():
        assert set(got["state"][i]) == set(entry), (i, set(got["state"][i]), set(entry))
        for k, v in entry.items():
            g = got["state"][i][k]
            if torch.is_tensor(v):
                assert g.shape == v.shape, (i, k)
                assert torch.allclose(g.to(v.dtype), v, rtol=rtol, atol=atol), \
                    (i, k, (g - v).abs().max())
            else:
                assert g == v, (i, k)
    assert [g["params"] for g in got["param_groups"]] == \
        [g["params"] for g in want["param_groups"]]
    for g, w in zip(got["param_groups"], want["param_groups"]):
        for k in w:
            assert k in g and (k == "params" or g[k] == w[k]), k


@pytest.mark.parametrize("clip", [False, True], ids=["noclip", "clip"])
@pytest.mark.parametrize("micro", [1, 2], ids=["bpps1", "bpps2"])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2])
def test_matches_one_process_on_the_full_batch(stage, kind, micro, clip):
    """20 steps; the parameters, the clip norms and the consolidated optimizer state equal
    those of the unsharded optimizer in one process on the full batch."""
    data = batches(steps=20, micro=micro)
    max_norm = 0.05 if clip else None
    want, want_opt, want_norms = train_reference(kind, data, max_norm)
    got, opt, norms = train_sharded(kind, stage, data, max_norm)
    assert_params_close(got, want)
    if clip:
        assert norms == pytest.approx(want_norms, rel=1e-9)
        assert sum(n > max_norm for n in norms) > 5  # the clipping did clip
    opt.consolidate_state_dict(to=0)
    if hvd.rank() == 0:
        assert_state_equal(opt.state_dict(), want_opt.state_dict())
    else:
        with pytest.raises(RuntimeError, match="consolidate_state_dict"):
            opt.state_dict()


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2])
def test_fp32_matches_distributed_optimizer(stage, kind):
    """fp32, default buckets: within 1e-6 relative of DistributedOptimizer after 20 steps."""
    data = batches(steps=20, micro=1, dtype=torch.float32)
    cls, kw = OPTIMIZERS[kind]
    ref = make_model(dtype=torch.float32)
    dopt = hvd.DistributedOptimizer(cls(ref.parameters(), **kw),
                                    named_parameters=ref.named_parameters())
    for ((x, y),) in data:
        dopt.zero_grad()
        loss_fn(ref, shard(x), shard(y)).backward()
        dopt.step()
    got, _, _ = train_sharded(kind, stage, data, model=make_model(dtype=torch.float32),
                              bucket_cap_mb=25)
    assert_params_close(got, ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
@pytest.mark.parametrize("stage", [1, 2])
def test_half_precision_reductions_stay_close_to_fp32(stage, compression):
    """Gradients reduced as fp16 / bf16 (half the bytes): within their precision of the same
    training reduced in fp32, and not equal to it (they did travel in half precision)."""
    data = batches(steps=5, micro=1, dtype=torch.float32)
    ref, _, _ = train_sharded("sgd", stage, data, model=make_model(dtype=torch.float32))
    model = make_model(dtype=torch.float32)
    cls, kw = OPTIMIZERS["sgd"]
    opt = hvd.ShardedOptimizer(model.named_parameters(), cls, stage=stage,
                               bucket_cap_mb=SMALL_BUCKETS_MB,
                               compression=getattr(hvd.Compression, compression), **kw)
    got, _, _ = train_sharded("sgd", stage, data, model=model, opt=opt)
    assert_params_close(got, ref, rtol=2e-2, atol=2e-3)
    assert any(not torch.equal(g, w) for g, w in zip(got.parameters(), ref.parameters()))
    with pytest.raises(ValueError, match="PowerSGD needs every gradient whole"):
        hvd.ShardedOptimizer(model.named_parameters(), cls, stage=stage,
                             compression=hvd.Compression.powersgd(), **kw)


@pytest.mark.parametrize("stage", [1, 2])
def test_consolidated_state_loads_into_the_unsharded_optimizer(stage):
    data = batches(steps=3, micro=1)
    got, opt, _ = train_sharded("adam", stage, data)
    opt.consolidate_state_dict(to=None)  # every rank
    plain = torch.optim.Adam(make_model().parameters(), lr=0.5)
    plain.load_state_dict(opt.state_dict())
    assert plain.param_groups[0]["lr"] == 0.01
    _, want_opt, _ = train_reference("adam", data)
    assert_state_equal(plain.state_dict(), want_opt.state_dict())


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("stage", [1, 2])
def test_save_then_load_at_one_rank_fewer_and_continue(stage, kind):
    """5 steps on every rank, consolidate, then continue on the first size-1 ranks (a process
    set; at 2 ranks, one rank alone) from the loaded state: equal to 10 steps of one process on
    the full batches (the first 5 split over size ranks, the last 5 over size-1)."""
    n = hvd.size()
    first = batches(steps=5, micro=1)
    model, opt, _ = train_sharded(kind, stage, first)
    opt.consolidate_state_dict(to=None)
    full_state = opt.state_dict()
    params = [p.detach().clone() for p in model.parameters()]

    fewer = hvd.add_process_set(list(range(n - 1)))
    try:
        if fewer.included():
            g = torch.Generator().manual_seed(5)
            second = [[(torch.randn((n - 1) * PER_RANK, FEATURES, generator=g).double(),
                        torch.randint(0, CLASSES, ((n - 1) * PER_RANK,), generator=g))]
                      for _ in range(5)]
            resumed = make_model(seed=99)
            with torch.no_grad():
                for p, q in zip(resumed.parameters(), params):
                    p.copy_(q)
            cls, kw = OPTIMIZERS[kind]
            opt2 = hvd.ShardedOptimizer(resumed.named_parameters(), cls, stage=stage,
                                        process_set=fewer, bucket_cap_mb=SMALL_BUCKETS_MB,
                                        lr=123.0)
            opt2.load_state_dict(full_state)
            train_sharded(kind, stage, second, model=resumed, opt=opt2, process_set=fewer)
            want, _, _ = train_reference(kind, first + second)
            assert_params_close(resumed, want)
    finally:
        hvd.remove_process_set(fewer)


@pytest.mark.parametrize("stage", [1, 2])
def test_a_gradient_on_some_ranks_only_and_parameters_without_gradients(stage):
    """A layer used by rank 0 only gets its gradient averaged (as DistributedOptimizer does);
    a frozen parameter and one no rank uses are left alone by SGD."""
    torch.manual_seed(3)
    used = torch.nn.Linear(4, 4).double()
    rank0_only = torch.nn.Linear(4, 4).double()
    unused = torch.nn.Linear(4, 4).double()
    frozen = torch.nn.Parameter(torch.randn(3).double(), requires_grad=False)
    params = list(used.parameters()) + list(rank0_only.parameters()) + \
        list(unused.parameters()) + [frozen]
    before = [p.detach().clone() for p in params]
    opt = hvd.ShardedOptimizer(params, torch.optim.SGD, stage=stage, lr=1.0,
                               bucket_cap_mb=SMALL_BUCKETS_MB)
    x = torch.randn(hvd.size(), 4, generator=torch.Generator().manual_seed(1)).double()
    out = used(x[hvd.rank():hvd.rank() + 1])
    if hvd.rank() == 0:
        out = rank0_only(out)
    out.sum().backward()
    opt.step()

    # Expected: the average over ranks of each rank's gradient (zero where a rank has none).
    ref_used = torch.nn.Linear(4, 4).double()
    ref_r0 = torch.nn.Linear(4, 4).double()
    with torch.no_grad():
        for r, p in zip(list(ref_used.parameters()) + list(ref_r0.parameters()), before):
            r.copy_(p)
    grads = [torch.zeros_like(p) for p in before[:4]]
    for r in range(hvd.size()):
        for p in list(ref_used.parameters()) + list(ref_r0.parameters()):
            p.grad = None
        o = ref_used(x[r:r + 1])
        if r == 0:
            o = ref_r0(o)
        o.sum().backward()
        for g, p in zip(grads, list(ref_used.parameters()) + list(ref_r0.parameters())):
            if p.grad is not None:
                g += p.grad
    for p, b, g in zip(params[:4], before[:4], grads):
        assert torch.allclose(p, b - g / hvd.size(), rtol=1e-12, atol=1e-12)
    for p, b in zip(params[4:], before[4:]):
        assert torch.equal(p, b)


@pytest.mark.parametrize("set_to_none", [False, True])
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_grad_and_gradients_held(stage, set_to_none):
    data = batches(steps=4, micro=1)
    want, _, _ = train_reference("adam", data)
    model = make_model()
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.Adam, stage=stage, lr=0.01)
    for ((x, y),) in data:
        opt.zero_grad(set_to_none=set_to_none)
        loss_fn(model, shard(x), shard(y)).backward()
        if stage == 2:  # the full gradients were dropped once copied into their bucket
            assert all(p.grad is None for p in model.parameters())
        opt.step()
    assert_params_close(model, want)
    held = opt.held_bytes()
    n = sum(p.numel() for p in model.parameters())
    assert held["parameters"] == 8 * n
    mine = sum(b.end - b.start for b in opt._buckets)
    # exp_avg and exp_avg_sq of the slice, and one 4-byte step per bucket
    assert held["optimizer_state"] == 2 * 8 * mine + 4 * len(opt._buckets)
    assert held["gradients"] == (8 * n if stage == 1 else 8 * mine)


@pytest.mark.parametrize("stage", [1, 2])
def test_mixed_dtypes_match_distributed_optimizer(stage):
    """fp32, bf16 and fp16 parameters (three buckets) against DistributedOptimizer. Not
    bit-equal: PyTorch's CPU kernels round half-precision elements differently in their
    vectorized body and their scalar tail, and a flat slice puts the tail elsewhere; the bf16 and
    fp16 layers' one-ulp differences then reach the fp32 layer's gradient (it is the first
    layer: its gradient comes back through the bf16 one, ~3 significant digits), so fp32 is
    held to 1e-3 here (1e-4 failed once, Gloo np 3: 1.4e-4 on 1 of 64 elements)."""
    try:  # PyTorch 1.13 has no fp16 matmul on the CPU: fp64 for the third dtype there
        torch.ones(1, 1).half() @ torch.ones(1, 1).half()
        third = torch.float16
    except RuntimeError:
        third = torch.float64

    def build():
        torch.manual_seed(5)
        return torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8).bfloat16(),
                                    torch.nn.Linear(8, 8).to(third)])

    def forward(m, x):
        h = m[0](x)
        h = m[1](h.bfloat16()).float()
        return m[2](h.to(third)).float().pow(2).mean()

    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(hvd.size() * 2, 8, generator=g) for _ in range(5)]
    ref = build()
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=ref.named_parameters())
    model = build()
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.SGD, stage=stage, lr=0.1,
                               momentum=0.9)
    assert len({b.dtype for b in opt._buckets}) == 3
    for x in xs:
        for m, o in ((ref, dopt), (model, opt)):
            o.zero_grad()
            forward(m, shard(x)).backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.dtype == q.dtype
        tol = {torch.float32: (1e-3, 1e-3), torch.bfloat16: (2e-2, 1e-3),
               torch.float16: (1e-2, 1e-3), torch.float64: (1e-4, 1e-4)}[p.dtype]
        torch.testing.assert_close(p, q, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("stage", [1, 2])
def test_process_set_of_two_ranks(stage):
    """Sharded over ranks {0, 1} only (rank 1 alone at 2 ranks); the others do not take part."""
    ranks = [0, 1] if hvd.size() > 2 else [1]
    ps = hvd.add_process_set(ranks)
    try:
        if ps.included():
            k = len(ranks) * PER_RANK
            data = [[(x[:k], y[:k]) for x, y in step]
                    for step in batches(steps=5, micro=1)]
            want, _, _ = train_reference("adam", data)
            got, opt, _ = train_sharded("adam", stage, data, process_set=ps)
            assert_params_close(got, want)
            assert all(b.end - b.start == len(range(ps.rank(), b.length, len(ranks)))
                       for b in opt._buckets)
    finally:
        hvd.remove_process_set(ps)


def cpu_grad_scaler():
    amp = getattr(torch, "amp", None)
    if amp is None or not hasattr(amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler for CPU tensors needs PyTorch 2.3 or later")
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("stage", [1, 2])
def test_grad_scaler_skips_the_same_steps_everywhere(stage, clip):
    """Step 2's batch has an inf in the last rank's part only: that rank's slice may not be
    the one holding the inf, yet every rank skips the step and backs the scale off, as one
    process on the full batch does."""
    data = batches(steps=5, micro=1, dtype=torch.float32)
    data[2][0][0][-1, 0] = math.inf
    max_norm = 0.05 if clip else math.inf

    def run(model, opt, part, clip_fn):
        scaler = cpu_grad_scaler()
        scales = []
        for ((x, y),) in data:
            opt.zero_grad()
            scaler.scale(loss_fn(model, part(x), part(y))).backward()
            scaler.unscale_(opt)
            clip_fn()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return scales

    want = make_model(dtype=torch.float32)
    ref_opt = torch.optim.Adam(want.parameters(), lr=0.01)
    want_scales = run(want, ref_opt, lambda t: t,
                      lambda: torch.nn.utils.clip_grad_norm_(want.parameters(), max_norm))
    model = make_model(dtype=torch.float32)
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.Adam, stage=stage,
                               lr=0.01, bucket_cap_mb=SMALL_BUCKETS_MB)
    scales = run(model, opt, shard, lambda: opt.clip_grad_norm_(max_norm))
    assert scales == want_scales
    assert scales[2] < scales[1]
    assert_params_close(model, want, rtol=1e-5, atol=1e-6)
    assert hvd.allgather_object(scales) == [scales] * hvd.size()


@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf])
def test_clip_grad_norm_returns_the_global_norm(norm_type):
    data = batches(steps=1, micro=1)
    model = make_model()
    ((x, y),) = data[0]
    loss_fn(model, x, y).backward()
    want = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9, norm_type=norm_type))
    sharded = make_model()
    opt = hvd.ShardedOptimizer(sharded.named_parameters(), torch.optim.SGD, lr=0.1,
                               bucket_cap_mb=SMALL_BUCKETS_MB)
    loss_fn(sharded, shard(x), shard(y)).backward()
    assert float(opt.clip_grad_norm_(1e9, norm_type=norm_type)) == pytest.approx(want, rel=1e-6)


def test_lr_scheduler_changes_the_sharded_step():
    data = batches(steps=4, micro=1)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    model = make_model()
    opt = hvd.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for ((x, y),) in data:
        for m, o, s, part in ((ref, ref_opt, ref_sched, lambda t: t), (model, opt, sched, shard)):
            o.zero_grad()
            loss_fn(m, part(x), part(y)).backward()
            o.step()
            s.step()
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    assert_params_close(model, ref)


def test_bad_arguments():
    model = make_model()
    with pytest.raises(ValueError, match="stage"):
        hvd.ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=3, lr=0.1)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.ShardedOptimizer(model.parameters(), torch.optim.SGD, backward_passes_per_step=0,
                             lr=0.1)
    with pytest.raises(hvd.HorovodNotSupportedError):
        hvd.ShardedOptimizer(model.parameters(), torch.optim.SGD, op=hvd.Adasum, lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        hvd.ShardedOptimizer([], torch.optim.SGD, lr=0.1)
    opt = hvd.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(hvd.HorovodNotSupportedError, match="add_param_group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    emb = torch.nn.Embedding(10, 3, sparse=True)
    sopt = hvd.ShardedOptimizer(emb.parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(hvd.HorovodNotSupportedError, match="sparse"):
        emb(torch.tensor([1, 2])).sum().backward()
    del sopt


# ---- elastic: commit keeps a replica of every slice; the state is resharded over any world ----

def full_state(opt):
    opt.consolidate_state_dict(to=None)
    return opt.state_dict()


def assert_state_identical(got, want):
    assert got["state"].keys() == want["state"].keys()
    for i, entry in want["state"].items():
        assert got["state"][i].keys() == entry.keys()
        for k, v in entry.items():
            g = got["state"][i][k]
            assert torch.equal(g, v) if torch.is_tensor(v) else g == v, (i, k)
    assert got["param_groups"] == want["param_groups"]


def continue_and_check(model, opt, ps, committed_params, first, kind):
    """Three more steps over the ranks of ps must equal one process that trained on the same
    full batches: first, then these."""
    g = torch.Generator().manual_seed(21)
    n = ps.size()
    more = [[(torch.randn(n * PER_RANK, FEATURES, generator=g).double(),
              torch.randint(0, CLASSES, (n * PER_RANK,), generator=g))] for _ in range(3)]
    train_sharded(kind, opt.stage, more, model=model, opt=opt, process_set=ps)
    want, _, _ = train_reference(kind, first + more)
    assert_params_close(model, want)


@pytest.mark.parametrize("lost", ["first", "last"])
@pytest.mark.parametrize("stage", [1, 2])
def test_a_lost_rank_loses_nothing_committed(stage, lost):
    """Commit at size ranks, go on two steps (not committed), lose one rank: the others roll
    back, reshard over size-1 ranks (the lost rank's slice comes from its replica), hold exactly
    the committed state, and continue as one process on the full batches would."""
    n = hvd.size()
    model = make_model()
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.Adam, stage=stage,
                               lr=0.01, bucket_cap_mb=SMALL_BUCKETS_MB)
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    state.sync()
    first = batches(steps=3, micro=1)
    train_sharded("adam", stage, first, model=model, opt=opt)
    state.epoch = 1
    state.commit()
    committed = full_state(opt)
    committed_params = [p.detach().clone() for p in model.parameters()]
    train_sharded("adam", stage, batches(steps=2, micro=1, seed=3), model=model, opt=opt)

    gone = 0 if lost == "first" else n - 1
    survivors = hvd.add_process_set([r for r in range(n) if r != gone])
    try:
        if survivors.included():
            state.restore()
            assert state.epoch == 1
            took = opt._elastic_reshard(process_set=survivors)
            assert took >= 0
            # Only this rank's new slices travelled to it (Adam's two moments over them, each
            # piece 8-byte aligned), not the buckets whole.
            mine = sum(2 * (b.end - b.start) * b.flat.element_size() for b in opt._buckets)
            assert mine <= opt.reshard_bytes <= mine + 2 * 8 * n * len(opt._buckets)
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), committed_params))
            assert_state_identical(full_state(opt), committed)
            continue_and_check(model, opt, survivors, committed_params, first, "adam")
    finally:
        hvd.remove_process_set(survivors)


@pytest.mark.parametrize("confirmed", [False, True], ids=["nowhere", "by_rank_0"])
def test_a_commit_interrupted_by_a_lost_rank(monkeypatch, confirmed):
    """A rank is lost in the middle of a commit, after the replicas travelled to some ranks.
    Confirmed nowhere (the CI case: rank 0's replica exchange failed, so it never held the new
    commit, and rank 1, its replica's holder, is the rank lost): the job agrees on the commit
    before, which every survivor holds, and goes on from it exactly. Confirmed by rank 0
    (every rank had the replicas): the job agrees on the new commit."""
    import horovod_cpp.torch.sharding.elastic as sharding_elastic
    n = hvd.size()
    if n < 3:
        pytest.skip("needs 3 ranks: one lost, two left")
    model = make_model()
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.Adam, stage=2, lr=0.01,
                               bucket_cap_mb=SMALL_BUCKETS_MB)
    state = hvd.elastic.TorchState(model, opt)
    state.sync()
    first = batches(steps=3, micro=1)
    train_sharded("adam", 2, first, model=model, opt=opt)
    state.commit()
    committed = full_state(opt)
    committed_params = [p.detach().clone() for p in model.parameters()]
    train_sharded("adam", 2, batches(steps=2, micro=1, seed=3), model=model, opt=opt)
    newer = full_state(opt)
    real = sharding_elastic.allreduce

    def lost_before_confirming(tensor, name=None, **kw):
        if name == "sharded.commit":
            raise hvd.HorovodInternalError("a rank was lost (simulated)")
        return real(tensor, name=name, **kw)
    monkeypatch.setattr(sharding_elastic, "allreduce", lost_before_confirming)
    with pytest.raises(hvd.HorovodInternalError):
        opt._elastic_save(replicate=True)  # pending on every rank
    monkeypatch.setattr(sharding_elastic, "allreduce", real)
    if hvd.rank() == 0:
        if confirmed:  # its confirmation came through before the loss
            opt._committed, opt._pending = opt._pending, None
            opt._commit_id = opt._committed["id"]
        else:  # its replica exchange failed: it holds nothing of the new commit
            opt._pending = None
    survivors = hvd.add_process_set([r for r in range(n) if r != 1])
    try:
        if survivors.included():
            if not confirmed:
                state.restore()
            opt._elastic_reshard(process_set=survivors)
            assert_state_identical(full_state(opt), newer if confirmed else committed)
            if not confirmed:
                assert all(torch.equal(p, q)
                           for p, q in zip(model.parameters(), committed_params))
                continue_and_check(model, opt, survivors, committed_params, first, "adam")
    finally:
        hvd.remove_process_set(survivors)


@pytest.mark.parametrize("stage", [1, 2])
def test_a_rank_added_gets_its_slice(stage):
    """Train and commit on the first size-1 ranks; then every rank (the last one new, with a
    fresh optimizer) reshards over all of them and continues as one process would."""
    n = hvd.size()
    fewer = hvd.add_process_set(list(range(n - 1)))
    try:
        model = make_model(seed=7 if fewer.included() else 99)
        opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=stage,
                                   lr=0.01, weight_decay=0.1, bucket_cap_mb=SMALL_BUCKETS_MB,
                                   process_set=fewer if fewer.included()
                                   else hvd.global_process_set)
        first = [[(x[:(n - 1) * PER_RANK], y[:(n - 1) * PER_RANK]) for x, y in step]
                 for step in batches(steps=3, micro=1)]
        if fewer.included():
            opt._elastic_save(replicate=False)
            opt._elastic_reshard()  # (what sync does first, at the smaller size)
            train_sharded("adamw", stage, first, model=model, opt=opt, process_set=fewer)
            opt._elastic_save(replicate=True)  # (commit's part; its host check is global)
            committed = full_state(opt)
    finally:
        hvd.remove_process_set(fewer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt._elastic_reshard(process_set=hvd.global_process_set)
    got = full_state(opt)
    if hvd.rank() == 0:
        assert_state_identical(got, committed)
    g = torch.Generator().manual_seed(21)
    more = [[(torch.randn(n * PER_RANK, FEATURES, generator=g).double(),
              torch.randint(0, CLASSES, (n * PER_RANK,), generator=g))] for _ in range(3)]
    train_sharded("adamw", stage, more, model=model, opt=opt)
    want, _, _ = train_reference("adamw", first + more)
    assert_params_close(model, want)


def test_losing_a_rank_and_its_replica_holder_is_a_clear_error():
    n = hvd.size()
    if n < 3:
        pytest.skip("needs 3 ranks: two lost and one left")
    model = make_model()
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.SGD, lr=0.1, momentum=0.9,
                               bucket_cap_mb=SMALL_BUCKETS_MB)
    state = hvd.elastic.TorchState(model, opt)
    state.sync()
    train_sharded("sgd", 2, batches(steps=1, micro=1), model=model, opt=opt)
    state.commit()
    left = hvd.add_process_set([0] + list(range(3, n)))  # 1 and its replica's holder 2 gone
    try:
        if left.included():
            with pytest.raises(RuntimeError, match="optimizer state of rank 1 of the last "
                                                   "commit .%d ranks. is lost" % n):
                opt._elastic_reshard(process_set=left)
    finally:
        hvd.remove_process_set(left)
