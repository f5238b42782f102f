"""PyTorch 2.x idioms with DistributedOptimizer, each against one process on the full batch
(computed here with plain torch): torch.compile, bf16 autocast, GradScaler (Horovod's documented
pattern and a plain ``scaler.step``), ``zero_grad(set_to_none=True)``, clipping after
``synchronize()``, and ``backward_passes_per_step``. Both PyTorch lanes run this file; an idiom
that the lane's PyTorch lacks (torch.compile and CPU GradScaler before 2.x) is skipped, saying so.
"""
import os
import warnings

import pytest
import torch

import horovod_cpp.torch as hvd

FEATURES, HIDDEN, CLASSES, PER_RANK = 16, 32, 4, 8


class Net(torch.nn.Module):
    """Two layers plus a branch applied to some rows only (`extra_rows`, a bool mask): a rank
    none of whose rows take it computes no gradient for its parameters."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, CLASSES)
        self.extra = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, extra_rows=None):
        h = torch.relu(self.fc1(x))
        out = self.fc2(h)
        if extra_rows is None or not bool(extra_rows.any()):
            return out
        branch = torch.zeros_like(out)
        branch[extra_rows] = self.extra(h[extra_rows])
        return out + branch


def make_model():
    torch.manual_seed(3)
    return Net()


def batches(steps, micro=1, inf_at=None):
    """Full batches every rank agrees on. inf_at=(step, rank): one input of that rank's shard
    is inf at that step, so the step's gradients are not finite."""
    g = torch.Generator().manual_seed(17)
    total = hvd.size() * PER_RANK
    data = [[(torch.randn(total, FEATURES, generator=g), torch.randint(0, CLASSES, (total,),
                                                                      generator=g))
             for _ in range(micro)] for _ in range(steps)]
    if inf_at is not None:
        step, rank = inf_at
        data[step][0][0][rank * PER_RANK, 0] = float("inf")
    return data


def shard(t):
    return t[hvd.rank() * PER_RANK:(hvd.rank() + 1) * PER_RANK]


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_close(got, want, rtol, atol):
    for (name, g), w in zip(got, want):
        assert torch.allclose(g, w, rtol=rtol, atol=atol), (name, (g - w).abs().max().item())


def named(model, tensors):
    return list(zip([n for n, _ in model.named_parameters()], tensors))


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def distributed(model, make_opt=sgd, **kwargs):
    opt = hvd.DistributedOptimizer(make_opt(model), named_parameters=model.named_parameters(),
                                   **kwargs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return opt


def loss_fn(out, y):
    return torch.nn.functional.cross_entropy(out.float(), y)


# ---- torch.compile ---------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs PyTorch 2.x")
def test_torch_compile_with_distributed_optimizer():
    data = batches(steps=3)
    ref = make_model()
    ref_opt = sgd(ref)
    for ((x, y),) in data:
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()

    model = make_model()
    with torch.no_grad():  # broadcast_parameters must make every rank start from rank 0's
        for p in model.parameters():
            p.add_(hvd.rank())
    opt = distributed(model)
    # (AOTAutograd's eager backend unless HVD_TEST_COMPILE_BACKEND says: tests/CMakeLists.txt
    # keeps Inductor, ~18 s a cell, in one cell.)
    compiled = torch.compile(model,
                             backend=os.environ.get("HVD_TEST_COMPILE_BACKEND", "aot_eager"))
    for ((x, y),) in data:
        opt.zero_grad()
        loss_fn(compiled(shard(x)), shard(y)).backward()
        opt.step()
    assert_close(named(model, params(model)), params(ref), rtol=1e-5, atol=1e-6)


# ---- bf16 autocast ---------------------------------------------------------------------------

def test_autocast_bf16_matches_one_process():
    data = batches(steps=3)
    ref = make_model()
    ref_opt = sgd(ref)
    start = params(ref)
    for ((x, y),) in data:
        ref_opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ref(x)
        assert out.dtype == torch.bfloat16  # autocast really ran the layers in bf16
        loss_fn(out, y).backward()
        ref_opt.step()

    model = make_model()
    opt = distributed(model)
    for ((x, y),) in data:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(shard(x))
        loss_fn(out, y=shard(y)).backward()
        opt.step()
    # bf16 keeps 8 bits of mantissa: a matmul over a rank's 8 rows and over the full batch
    # may round differently. The steps moved the parameters by far more than the tolerance.
    moved = max((p - s).abs().max().item() for p, s in zip(params(ref), start))
    assert moved > 0.05
    assert_close(named(model, params(model)), params(ref), rtol=2e-2, atol=5e-3)


# ---- GradScaler --------------------------------------------------------------------------------

def cpu_grad_scaler(**kwargs):
    amp = getattr(torch, "amp", None)
    if amp is None or not hasattr(amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler for CPU tensors needs PyTorch 2.3 or later")
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2, **kwargs)


def scaled_reference(data, max_norm):
    model = make_model()
    opt = sgd(model)
    scaler = cpu_grad_scaler()
    scales = []
    for ((x, y),) in data:
        opt.zero_grad()
        scaler.scale(loss_fn(model(x), y)).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return params(model), scales


@pytest.mark.parametrize("pattern", ["documented", "plain_step"])
def test_grad_scaler_skips_the_same_steps_and_matches_one_process(pattern):
    """Step 2 has an inf in the last rank's shard only: every rank must skip that step (the
    scaler's inf check sees the averaged gradients), and the scale must back off the same way
    as in one process on the full batch. Clipping after unscale_ (documented pattern) or none
    (plain scaler.step: max_norm inf in the reference)."""
    data = batches(steps=5, inf_at=(2, hvd.size() - 1))
    max_norm = 0.5 if pattern == "documented" else float("inf")
    want, want_scales = scaled_reference(data, max_norm)

    model = make_model()
    opt = distributed(model)
    scaler = cpu_grad_scaler()
    scales = []
    for ((x, y),) in data:
        opt.zero_grad()
        scaler.scale(loss_fn(model(shard(x)), shard(y))).backward()
        if pattern == "documented":  # Horovod's documented AMP pattern
            opt.synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            with opt.skip_synchronize():
                scaler.step(opt)
        else:
            scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == want_scales
    assert scales[2] < scales[1]  # the inf step was skipped and backed off
    assert_close(named(model, params(model)), want, rtol=1e-5, atol=1e-6)


def test_plain_grad_scaler_step_reduces_once(monkeypatch):
    """A plain scaler.step reads param_groups (unscale_): the gradients are reduced there, and
    step() must not reduce them again (or warn)."""
    scaler = cpu_grad_scaler()
    model = make_model()
    opt = distributed(model)
    calls = []
    reduce_all = opt._reduce_all
    monkeypatch.setattr(opt, "_reduce_all", lambda: (calls.append(1), reduce_all())[1])
    (x, y), = batches(steps=1)[0]
    scaler.scale(loss_fn(model(shard(x)), shard(y))).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "step() after synchronize()" warning
        scaler.step(opt)
    assert len(calls) == 1


# ---- zero_grad(set_to_none=True), clipping after synchronize(), backward_passes_per_step -------

@pytest.mark.parametrize("micro", [1, 2], ids=["bpps1", "bpps2"])
@pytest.mark.parametrize("clip", [False, True], ids=["no-clip", "clip"])
def test_set_to_none_clipping_and_accumulation_match_one_process(micro, clip):
    """zero_grad(set_to_none=True) every step (PyTorch 2's default); a branch that every row
    takes on even steps and only rank 0's rows on odd steps (the other ranks have no gradient
    for it: None, reduced as zeros, so the average is the full batch's); clip_grad_norm_
    after synchronize(); local accumulation over `micro` passes."""
    steps, max_norm = 4, 0.3
    data = batches(steps=steps, micro=micro)
    total = hvd.size() * PER_RANK

    def extra_rows(step):
        rows = torch.zeros(total, dtype=torch.bool)
        rows[:total if step % 2 == 0 else PER_RANK] = True
        return rows

    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for step, micro_batches in enumerate(data):
        ref_opt.zero_grad(set_to_none=True)
        for x, y in micro_batches:
            (loss_fn(ref(x, extra_rows(step)), y) / micro).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
        ref_opt.step()

    model = make_model()
    opt = distributed(model, lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
                      backward_passes_per_step=micro)
    for step, micro_batches in enumerate(data):
        opt.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in model.parameters())
        for x, y in micro_batches:
            (loss_fn(model(shard(x), shard(extra_rows(step))), shard(y)) / micro).backward()
        if clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    assert_close(named(model, params(model)), params(ref), rtol=1e-5, atol=1e-6)


def test_gradient_hook_kind():
    """PyTorch 2.1+ signals gradient readiness with post-accumulate-grad hooks on the
    parameters; 1.13 with hooks on their gradient accumulators."""
    from horovod_cpp.torch import grad_hooks
    model = make_model()
    opt = distributed(model)
    if hvd.size() == 1:
        pytest.skip("no hooks at one rank")
    post = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
    assert grad_hooks.POST_ACCUMULATE_GRAD_HOOK == post
    kinds = {type(h).__name__ for h in opt._grad_accs}
    assert kinds == ({"RemovableHandle"} if post else {"AccumulateGrad"}), kinds
