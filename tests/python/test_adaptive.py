"""Adaptive training (horovod_cpp.torch.adaptive) on real ranks: the gradient noise scale
measured from the core's norms against the exact value of a regression with known noise; a
step against one process on the full batch (accumulation included); every sample of an epoch
seen once while the configuration changes; the state's round trip through
torch.load(weights_only=True); the Accumulator's sums."""
import io
import json
import math
import time

import pytest
import torch

import horovod_cpp.torch as hvd
import horovod_cpp.torch.adaptive as adl

D, SIGMA2 = 10, 4.0


class Indexed(torch.utils.data.Dataset):
    """Sample i is (x_i, y_i, i), generated from a seed (the same on every rank)."""

    def __init__(self, n, delta_w=None, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, D, generator=g, dtype=torch.float64)
        w_star = torch.randn(D, generator=g, dtype=torch.float64)
        self.y = self.x @ w_star + math.sqrt(SIGMA2) * torch.randn(n, generator=g,
                                                                  dtype=torch.float64)
        self.w_star = w_star

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def regression(w, bias=False):
    model = torch.nn.Linear(D, 1, bias=bias).to(torch.float64)
    with torch.no_grad():
        model.weight.copy_(w.reshape(1, D))
        if bias:
            model.bias.zero_()
    return model


KINDS = ["distributed", "sharded1", "sharded2", "sharded3"]


def optimizer_for(kind, model, make):
    """(model, optimizer) for AdaptiveDataParallel: ``make(params)`` builds a torch optimizer;
    the sharded kinds wrap it as ShardedOptimizer stage 1, 2 or 3 (3: over hvd.shard_model)."""
    if kind == "distributed":
        return model, make(model.parameters())
    stage = int(kind[-1])
    if stage == 3:
        hvd.shard_model(model)
    probe = make([torch.zeros(1, requires_grad=True)])  # the class and hyperparameters
    defaults = {k: v for k, v in probe.defaults.items() if k in ("lr", "momentum")}
    return model, hvd.ShardedOptimizer(model.named_parameters(), type(probe), stage=stage,
                                       **defaults)


def weights(model, kind):
    """The full parameters (gathered for stage 3)."""
    if kind == "sharded3":
        return {k: v for k, v in hvd.sharding_of(model).state_dict(to=None).items()}
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def loss_of(model, x, y):
    return 0.5 * ((model(x).reshape(-1) - y) ** 2).mean()


class Targets(torch.utils.data.Dataset):
    """y_i = mu + s * xi_i, xi_i Rademacher in DIM dimensions: a regression on a constant
    feature whose per-sample gradient w - y_i has tr(Sigma) = s^2 * DIM exactly."""

    def __init__(self, n, s, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.mu = torch.zeros(DIM, dtype=torch.float64)
        xi = torch.randint(0, 2, (n, DIM), generator=g).to(torch.float64) * 2 - 1
        self.y = self.mu + s * xi

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.y[i]


DIM = 64


def frozen_regression(kind, make, s, steps, b0, wrapped=None, **adaptive):
    """Trains the Targets regression (noise s, DIM outputs on a constant feature) for
    ``steps`` steps of ``b0`` with weights frozen by lr 0 at w = mu + 1/sqrt(DIM), bias 0,
    under AdaptiveDataParallel with every step weighing the same; returns it with the last
    step's averaged norms taken in. ``wrapped(opt)`` runs once the optimizer is wrapped."""
    data = Targets(steps * b0, s)
    model = torch.nn.Linear(1, DIM).to(torch.float64)
    with torch.no_grad():
        model.weight.copy_((data.mu + DIM ** -0.5).reshape(DIM, 1))
        model.bias.zero_()
    model, opt = optimizer_for(kind, model, make)
    model = adl.AdaptiveDataParallel(model, opt, horizon_samples=10 ** 9, **adaptive)
    if wrapped is not None:
        wrapped(opt)
    loader = adl.AdaptiveDataLoader(data, batch_size=b0, shuffle=True)
    for y in loader:
        opt.zero_grad()
        pred = model(torch.ones(len(y), 1, dtype=torch.float64))
        (0.5 * ((pred - y) ** 2).sum(1).mean()).backward()
        opt.step()
    model._receive()  # the last step's averaged norms
    return model


@pytest.mark.parametrize("kind", KINDS)
def test_noise_scale_of_a_regression_with_known_noise_within_ten_percent(kind):
    # Frozen weights (lr 0) at w = mu + 1/sqrt(DIM) in every coordinate, bias 0: the weight's
    # and the bias's gradients are both w + b - y_i, so |G|^2 = 2 and tr(Sigma) = 2 s^2 DIM,
    # and phi = s^2 DIM = 4 samples. 200 steps of 32 samples per rank. (Weight and bias share
    # a bucket: the sharded stages divide it by the ranks before reducing it.)
    s, steps = 0.25, 200
    b0 = 32 * hvd.size()
    model = frozen_regression(kind, lambda ps: torch.optim.SGD(ps, lr=0.0), s, steps, b0)
    exact = s * s * DIM / 1.0
    phi = adl.gradient_noise_scale()
    assert phi == pytest.approx(exact, rel=0.10), (phi, exact, adl.stats())
    assert model.noise.sqr == pytest.approx(2.0, rel=0.10)
    assert model.noise.var == pytest.approx(2 * exact, rel=0.10)
    st = adl.stats()
    assert st["steps"] == steps and st["batch_size"] == b0 and st["accumulation_steps"] == 0
    assert st["noise_scale"] == phi


@pytest.mark.parametrize("kind,broadcast", [(k, False) for k in KINDS] + [("distributed", True)])
def test_adam_preconditioned_norms_are_weighed_by_adams_update_scale(kind, broadcast):
    # The regression above with Adam at lr 0 (frozen weights; the moments still update) and
    # AdamScale. Every element's averaged gradient is g_j = 1/sqrt(DIM) - s * mean(xi_j) over a
    # global batch B, so its bias-corrected second moment tends to E g_j^2 = 1/DIM + s^2/B for
    # the weight and the bias alike: each measured squared norm is weighed by
    # w^2 = 1 / (1/DIM + s^2/B) (per parameter, per bucket or per flat: the same here), so
    # |G|^2 reads 2 w^2 while the noise scale, a ratio, stays s^2 DIM. Without the weights
    # |G|^2 would read 2. ``broadcast``: the optimizer's state made first by
    # broadcast_optimizer_state's zero-gradient step (as an elastic job's sync does), second
    # moments of 0 that must not weigh anything by 1 / eps.
    s, steps = 0.25, 200
    b0 = 32 * hvd.size()
    model = frozen_regression(kind, lambda ps: torch.optim.Adam(ps, lr=0.0), s, steps, b0,
                              wrapped=(lambda opt: hvd.broadcast_optimizer_state(opt, 0))
                              if broadcast else None, scaling_rule=adl.AdamScale())
    w2 = 1.0 / (1.0 / DIM + s * s / b0)
    assert model.noise.sqr == pytest.approx(2.0 * w2, rel=0.10), (model.noise.sqr, w2)
    assert adl.gradient_noise_scale() == pytest.approx(s * s * DIM, rel=0.10)


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_matches_one_process_on_the_full_batch_with_accumulation(kind):
    # Linear LR scaling, a forced configuration of 2 micro-batches of 3 per rank: each step
    # must equal plain SGD on the step's whole global batch at lr x B / B0.
    n, b0, lr = 97, 2 * hvd.size(), 0.05
    data = Indexed(n)
    w0 = torch.zeros(D, dtype=torch.float64)
    model, opt = optimizer_for(kind, regression(w0, bias=True),
                               lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.5))
    ref = regression(w0, bias=True)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.5)
    model = adl.AdaptiveDataParallel(model, opt, scaling_rule=adl.LinearScale(),
                                     decide_every=10 ** 6)
    loader = adl.AdaptiveDataLoader(data, batch_size=b0, shuffle=True, seed=5)
    loader.autoscale_batch_size(64 * b0, gradient_accumulation=True)
    model._setup(loader)
    model.atomic_bsz, model.accumulation_steps = 3, 1
    order = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    seen = []
    position = step = 0
    for x, y, idx in loader:
        seen.extend(idx.tolist())
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        if loader.is_optim_step():
            step += 1
            local, take, full = loader._step_sizes
            batch = order[position:position + take]
            position += take
            ref_opt.zero_grad()
            if full:
                loss_of(ref, data.x[batch], data.y[batch]).backward()
                for g in ref_opt.param_groups:
                    g["lr"] = lr * take / b0
                ref_opt.step()
                got = weights(model.module, kind)
                for name, want in ref.named_parameters():
                    assert torch.allclose(got[name], want, rtol=1e-9, atol=1e-12), (name, step)
            else:  # a short last step: the reference takes the trained parameters
                got = weights(model.module, kind)
                with torch.no_grad():
                    for name, p in ref.named_parameters():
                        p.copy_(got[name])
    gathered = sorted(i for part in hvd.allgather_object(seen) for i in part)
    assert gathered == sorted(order[:len(gathered)].tolist())
    assert len(gathered) == len(set(gathered)) and n - len(gathered) < hvd.size()


def test_every_sample_once_while_the_configuration_changes():
    n = 211
    data = Indexed(n)
    model = regression(torch.zeros(D, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model = adl.AdaptiveDataParallel(model, opt, decide_every=10 ** 6)
    loader = adl.AdaptiveDataLoader(data, batch_size=hvd.size(), shuffle=True)
    loader.autoscale_batch_size(100 * hvd.size(), gradient_accumulation=True)
    plans = [(1, 0), (3, 2), (2, 0), (5, 1)]
    seen, steps = [], 0
    for epoch in adl.remaining_epochs_until(2):
        mine = []
        for x, y, idx in loader:
            if loader._micro == 0:
                model.atomic_bsz, model.accumulation_steps = plans[steps % len(plans)]
            mine.extend(idx.tolist())
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
            if loader.is_optim_step():
                steps += 1
        everyone = sorted(i for part in hvd.allgather_object(mine) for i in part)
        assert len(everyone) == len(set(everyone)), "a sample was seen twice"
        assert n - len(everyone) < hvd.size(), "samples were skipped"
        seen.append(everyone)
    assert adl.current_epoch() is None


def test_a_loader_outside_epochs_takes_up_the_synced_epoch_and_position():
    """A rank that joins an elastic job (or rolls back) gets the adaptive state synced; a loader
    iterated without remaining_epochs_until must then draw what the others draw next (the
    same epoch's shuffle, from the same position), not start its own epoch 0."""
    b = 4 * hvd.size()
    n = 10 * b

    def run(steps, state=None):
        data = Indexed(n)
        model = regression(torch.zeros(D, dtype=torch.float64))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        model = adl.AdaptiveDataParallel(model, opt)
        if state is not None:
            model.adaptive_state.load_state_dict(state)
        loader = adl.AdaptiveDataLoader(data, batch_size=b, shuffle=True)
        drawn, saved = [], None
        while len(drawn) < steps:
            for x, y, idx in loader:
                opt.zero_grad()
                loss_of(model, x, y).backward()
                opt.step()
                drawn.append(idx.tolist())
                if len(drawn) == 13:  # (in the second epoch: 10 steps an epoch)
                    saved = model.adaptive_state.state_dict()
                if len(drawn) == steps:
                    break
        return drawn, saved

    whole, saved = run(25)
    assert saved["progress"]["positions"]["adaptdl-dataloader"][0] == 1
    resumed, _ = run(12, saved)
    assert resumed == whole[13:]


def test_state_loads_with_weights_only_and_round_trips():
    data = Indexed(40)
    model = regression(torch.zeros(D, dtype=torch.float64))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model = adl.AdaptiveDataParallel(model, opt)
    assert isinstance(model.scaling_rule, adl.AdamScale)
    loader = adl.AdaptiveDataLoader(data, batch_size=2 * hvd.size())
    for step, (x, y, _) in enumerate(loader):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        if step == 3:
            break
    buf = io.BytesIO()
    torch.save({"adaptive": model.adaptive_state.state_dict(), "optimizer": opt.state_dict()},
               buf)
    buf.seek(0)
    # torch 1.13's weights-only unpickler has no floats at all (no optimizer state loads
    # through it either); from torch 2 on it is the check that matters (the default from 2.6).
    weights_only = int(torch.__version__.split(".")[0]) >= 2
    loaded = torch.load(buf, weights_only=weights_only)
    fresh = regression(torch.zeros(D, dtype=torch.float64))
    again = adl.AdaptiveDataParallel(fresh, torch.optim.Adam(fresh.parameters(), lr=0.01))
    again.adaptive_state.load_state_dict(loaded["adaptive"])
    assert again.adaptive_state.state_dict() == model.adaptive_state.state_dict()
    assert again.steps == 4


@pytest.mark.parametrize("built", ["before", "after"])
def test_an_lr_scheduler_built_before_or_after_the_wrap_steps_the_base_rate(built):
    # (AdaptDL's scripts build it before and pass it in; built after, torch wraps the
    # patched step's __func__; either way no warning, and the factor stays inside step())
    import warnings
    data = Indexed(16 * hvd.size())
    model = regression(torch.zeros(D, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def scheduler():
        return torch.optim.lr_scheduler.MultiStepLR(opt, [1, 2], 0.5)
    sched = scheduler() if built == "before" else None
    model = adl.AdaptiveDataParallel(model, opt, sched, scaling_rule=adl.LinearScale())
    sched = sched or scheduler()
    loader = adl.AdaptiveDataLoader(data, batch_size=2 * hvd.size())
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "optimizer.step() has been overridden"
        for epoch in adl.remaining_epochs_until(3):
            for x, y, _ in loader:
                opt.zero_grad()
                loss_of(model, x, y).backward()
                opt.step()
            rates.append(opt.param_groups[0]["lr"])
            sched.step()
    assert rates == [0.1, 0.05, 0.025]
    assert model.steps == 3 * len(data) // (2 * hvd.size())


def test_accumulator_sums_over_the_ranks():
    acc = adl.Accumulator()
    acc["loss"] += hvd.rank() + 1.0
    acc["n"] += 2
    with acc.synchronized():
        assert acc["loss"] == sum(range(1, hvd.size() + 1))
        assert acc["n"] == 2 * hvd.size()
    acc["n"] += 1
    assert acc["n"] == 2 * hvd.size() + 1  # the sum plus this rank's update
    with acc.synchronized():
        assert acc["n"] == 3 * hvd.size()
    acc.reset()
    assert acc["n"] == 0


def test_the_timeline_gets_the_adaptive_counters(tmp_path):
    path = str(tmp_path / "timeline.json")
    path = hvd.broadcast_object(path, 0, name="adaptive.timeline.path")  # rank 0's writes
    data = Indexed(40 * hvd.size())
    model = regression(torch.zeros(D, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model = adl.AdaptiveDataParallel(model, opt)
    loader = adl.AdaptiveDataLoader(data, batch_size=4 * hvd.size())
    hvd.start_timeline(path)
    steps = 0
    for x, y, _ in loader:
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        steps += 1
    hvd.stop_timeline()
    if hvd.rank() == 0:
        events = json.load(open(path))
        counters = [e for e in events if e.get("ph") == "C" and e["name"] == "adaptive"]
        assert len(counters) == steps, (len(counters), steps)
        assert all(e["args"]["batch_size"] == 4 * hvd.size() for e in counters)
        assert {"local_bsz", "accumulation_steps", "lr_factor", "noise_scale", "goodput"} <= \
            set(counters[-1]["args"])



class BigSamples(torch.utils.data.Dataset):
    """Samples of FEATURES floats (1 MiB each), generated from their index."""
    FEATURES = 1 << 18

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.FEATURES, generator=g), torch.tensor(float(i % 3))


def test_without_an_upper_bound_the_micro_batch_stays_within_the_memory_budget():
    # Each sample costs a few MiB (its input, the collated batch, the activations): a budget
    # of 96 MiB above the memory at the start caps the micro-batch far below max_batch_size,
    # which the job would otherwise grow to (a fixed 20 ms per step makes big batches pay).
    import resource
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(BigSamples.FEATURES, 2), torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    model = adl.AdaptiveDataParallel(model, opt, decide_every=3)
    base = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    budget = base + (96 << 20)
    loader = adl.AdaptiveDataLoader(BigSamples(400 * hvd.size()), batch_size=2 * hvd.size())
    loader.autoscale_batch_size(256 * hvd.size(), memory_budget=budget)
    chosen = []
    for x, y in loader:
        opt.zero_grad()
        ((model(x).reshape(-1) - y) ** 2).mean().backward()
        opt.step()
        time.sleep(0.02)
        chosen.append(loader.current_local_bsz)
        if len(chosen) == 60:
            break
    limit = model.memory.limit()
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    assert limit is not None and 2 < limit < 128, (limit, chosen)
    assert max(chosen) > 2, chosen  # it grew, and stayed within the budget:
    assert peak <= budget, ((peak - base) / 2 ** 20, chosen, model.memory.state_dict())


def out_of_memory_error(text):
    return (getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError)(text)


def test_out_of_memory_errors_are_told_from_others():
    from horovod_cpp.torch.adaptive.memory import is_out_of_memory
    try:  # the CPU allocator's own failure (a plain RuntimeError)
        torch.empty(1 << 50, dtype=torch.uint8)
    except RuntimeError as e:
        assert is_out_of_memory(e), e
    else:
        pytest.fail("allocating a petabyte succeeded")
    assert is_out_of_memory(out_of_memory_error("CUDA out of memory. Tried to allocate"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("DefaultCPUAllocator: can't allocate memory"))


class FitsUpTo(torch.nn.Module):
    """A regression that raises torch's out-of-memory error on a micro-batch of more than
    ``limit`` samples (as a GPU at its limit), counting the micro-batches it ran."""

    def __init__(self, limit):
        super().__init__()
        self.inner = regression(torch.zeros(D, dtype=torch.float64))
        self.limit = limit
        self.ran = []

    def forward(self, x):
        if len(x) > self.limit:
            raise out_of_memory_error("a micro-batch of %d does not fit" % len(x))
        self.ran.append(len(x))
        return self.inner(x)


def fits_up_to(limit, n, **autoscale):
    """(the FitsUpTo model, its optimizer, the controller, a loader of B0 = 4 per rank
    autoscaled up to 64 per rank with ``autoscale``)."""
    torch.manual_seed(0)
    net = FitsUpTo(limit)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    model = adl.AdaptiveDataParallel(net, opt, decide_every=10 ** 6)
    loader = adl.AdaptiveDataLoader(Indexed(n), batch_size=4 * hvd.size(), shuffle=True)
    loader.autoscale_batch_size(64 * hvd.size(), **autoscale)
    return net, opt, model, loader


def one_step(model, opt, loader):
    """Runs the loader's next step (its micro-batches and the optimizer step); returns the
    out-of-memory error it raised, or None."""
    try:
        for x, y, _ in loader:
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
            if loader.is_optim_step():
                return None
    except RuntimeError as e:  # (both torch's OutOfMemoryErrors are RuntimeErrors)
        return e


def test_a_micro_batch_that_ran_out_of_memory_is_forbidden_and_the_bound_bisects():
    # Every rank runs out above 12 samples (so no collective is left waiting, and the test
    # can go on in this process; hvd.elastic.run's reset is tests/launch/test_elastic.py's).
    # After a step of 4, forced to 16, the step fails; the back-off forbids 16 and above and
    # allows the middle of what fit and what failed: 10, in two micro-batches that keep the
    # global batch. Each step that fits, or back-off, halves the gap: 13 fails, 11 and 12 fit,
    # and 12, the largest that fits, is where the bound stays.
    net, opt, model, loader = fits_up_to(12, 4000, gradient_accumulation=True)
    assert one_step(model, opt, loader) is None  # the initial 4 per rank
    assert model.largest_fit == 4 and model.oom_limit() is None
    model.atomic_bsz, model.accumulation_steps = 16, 0
    error = one_step(model, opt, loader)
    assert error is not None and "16" in str(error)
    assert model.back_off(ValueError("not memory")) is None  # only out-of-memory errors
    why = model.back_off(error)
    assert why is not None and "out of memory at micro-batch 16" in why, why
    assert (model.oom_ceiling, model.oom_limit()) == (16, 10)
    del error
    model.release_memory()
    assert all(p.grad is None for p in net.parameters())
    assert one_step(model, opt, loader) is None
    assert (loader.current_local_bsz, loader.accumulation_steps) == (10, 1)
    assert net.ran[-2:] == [10, 10]  # (16 per rank before: now 2 micro-batches of 10)
    assert model.largest_fit == 10 and model.oom_limit() == 13
    stats = adl.stats()
    assert stats["oom_ceiling"] == 16 and stats["oom_limit"] == 13
    # Forced above the bound again, the next step is capped before it runs: at 13, it fails.
    model.atomic_bsz, model.accumulation_steps = 15, 0
    error = one_step(model, opt, loader)
    assert error is not None and model.back_off(error) is not None
    del error
    assert (model.oom_ceiling, model.oom_limit()) == (13, 11)
    for expect in (11, 12, 12):
        model.atomic_bsz, model.accumulation_steps = 64, 0
        assert one_step(model, opt, loader) is None and net.ran[-1] == expect
    assert (model.largest_fit, model.oom_limit()) == (12, 12)
    # A saved state keeps what was learned; a restore to an older one does not forget it.
    state = model.adaptive_state.state_dict()
    assert (state["oom_ceiling"], state["largest_fit"]) == (13, 12)
    model.adaptive_state.load_state_dict(dict(state, oom_ceiling=None, largest_fit=4))
    assert (model.oom_ceiling, model.largest_fit) == (13, 12)
    # Outside a step (say, in an evaluation) an out-of-memory error is not the micro-batch's.
    assert model.back_off(out_of_memory_error("evaluation")) is None


def test_running_out_of_memory_at_the_least_micro_batch_allowed_is_not_backed_off():
    net, opt, model, loader = fits_up_to(3, 400, local_bsz_bounds=(4, None))
    error = one_step(model, opt, loader)
    assert error is not None and model.back_off(error) is None and model.oom_ceiling is None
