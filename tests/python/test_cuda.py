"""CUDA tensors through the NCCL backend, one GPU per rank (device = local rank). Skipped, with
the reason, where torch has no usable CUDA device (this machine: a CPU-only torch, no GPU)."""
import pytest
import torch

import horovod_cpp.torch as hvd


def test_nccl_built_is_the_version_code_or_zero():
    code = hvd.nccl_built()
    assert isinstance(code, int)
    assert code == 0 or code >= 20000  # e.g. 22809 for NCCL 2.28.9


def _gpu_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    if torch.cuda.device_count() < hvd.local_size():
        pytest.skip("needs one GPU per rank: %d GPUs for %d ranks on this host"
                    % (torch.cuda.device_count(), hvd.local_size()))
    device = torch.device("cuda", hvd.local_rank())
    torch.cuda.set_device(device)
    return device


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int32, torch.int64, torch.uint8, torch.int8])
def test_allreduce_sum_matches_cpu(dtype):
    device = _gpu_or_skip()
    n = hvd.size()
    base = (torch.arange(60) % 5 + 1).to(dtype)
    got = hvd.allreduce(base.to(device) * 1, op=hvd.Sum, name="cuda.sum.%s" % dtype)
    assert got.device == device
    assert torch.equal(got.cpu(), base * n)


def test_average_scaling_inplace_and_grouped():
    device = _gpu_or_skip()
    n, r = hvd.size(), hvd.rank()
    x = torch.full((5, 3), float(r), device=device)
    hvd.allreduce_(x, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5, name="cuda.avg")
    assert torch.allclose(x.cpu(), torch.full((5, 3), (n - 1) / 2.0))
    outs = hvd.grouped_allreduce([torch.ones(k + 1, device=device) for k in range(4)],
                                 op=hvd.Sum, name="cuda.group")
    assert [o.cpu().tolist() for o in outs] == [[float(n)] * (k + 1) for k in range(4)]


def test_allgather_broadcast_alltoall_reducescatter():
    device = _gpu_or_skip()
    n, r = hvd.size(), hvd.rank()
    g = hvd.allgather(torch.full((r + 1, 2), float(r), device=device), name="cuda.gather")
    assert g.device == device
    assert torch.equal(g.cpu(), torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)]))
    b = hvd.broadcast(torch.full((3,), float(r), device=device), root_rank=n - 1, name="cuda.b")
    assert b.cpu().tolist() == [float(n - 1)] * 3
    send = torch.cat([torch.full((d + 1,), 100.0 * r + d) for d in range(n)]).to(device)
    out, splits = hvd.alltoall(send, splits=torch.tensor([d + 1 for d in range(n)]),
                               name="cuda.a2a")
    assert splits.tolist() == [r + 1] * n
    assert torch.equal(out.cpu(), torch.cat([torch.full((r + 1,), 100.0 * q + r)
                                             for q in range(n)]))
    rs = hvd.reducescatter(torch.ones(2 * n + 1, 2, device=device), op=hvd.Sum, name="cuda.rs")
    assert rs.shape[0] == (3 if r == 0 else 2)
    assert torch.equal(rs.cpu(), torch.full(tuple(rs.shape), float(n)))


def test_cpu_on_one_rank_gpu_on_another_is_an_error_everywhere():
    device = _gpu_or_skip()
    if hvd.size() < 2:
        pytest.skip("needs 2 ranks")
    t = torch.ones(4, device=device) if hvd.rank() == 0 else torch.ones(4)
    with pytest.raises(hvd.HorovodInternalError, match="mismatched devices"):
        hvd.allreduce(t, name="cuda.mixed")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_average_with_scale_factors(dtype):
    device = _gpu_or_skip()
    n, r = hvd.size(), hvd.rank()
    x = torch.full((1000,), float(r + 1), dtype=dtype, device=device)
    got = hvd.allreduce(x, op=hvd.Average, prescale_factor=0.5, postscale_factor=4.0,
                        name="cuda.lowp.%s" % dtype)
    assert got.dtype == dtype and got.device == device
    want = 0.5 * 4.0 * sum(q + 1 for q in range(n)) / n
    assert torch.allclose(got.float().cpu(), torch.full((1000,), want), rtol=1e-2)


def test_result_is_ready_on_the_current_stream_after_synchronize():
    # A large tensor: the collective is still running on the core's stream when synchronize
    # returns; the caller's current stream must wait for it before the next kernel reads it.
    device = _gpu_or_skip()
    n = hvd.size()
    x = torch.arange(1 << 24, dtype=torch.float32, device=device) % 7
    handle = hvd.allreduce_async(x, op=hvd.Sum, prescale_factor=3.0, name="cuda.ready")
    out = hvd.synchronize(handle)
    total = out.sum()  # queued on the current stream right away
    want = 3.0 * n * float((torch.arange(1 << 24, dtype=torch.float64) % 7).sum())
    assert abs(total.item() - want) / want < 1e-5


def test_sync_batch_norm_on_cuda_matches_batch_norm_on_the_full_batch():
    device = _gpu_or_skip()
    if hvd.size() < 2:
        pytest.skip("needs 2 ranks (one rank runs plain batch norm)")
    n, r = hvd.size(), hvd.rank()
    g = torch.Generator().manual_seed(3)
    full = torch.randn(4 * n, 3, 5, generator=g, dtype=torch.float64)
    sync = hvd.SyncBatchNorm(3).double().to(device)
    ref = torch.nn.BatchNorm1d(3).double()
    out = sync(full[4 * r:4 * (r + 1)].to(device))
    want = ref(full)[4 * r:4 * (r + 1)]
    assert torch.allclose(out.detach().cpu(), want.detach(), atol=1e-9)
    assert torch.allclose(sync.running_mean.cpu(), ref.running_mean, atol=1e-9)
    assert torch.allclose(sync.running_var.cpu(), ref.running_var, atol=1e-9)


@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_optimizer_on_cuda_matches_one_process_on_the_full_batch(stage):
    """ShardedOptimizer with CUDA parameters: 5 Adam steps on each rank's part of the batch
    equal 5 steps of one process on the full batch (computed here on the same GPU); a
    consolidated state loads into the unsharded optimizer."""
    device = _gpu_or_skip()
    n, r = hvd.size(), hvd.rank()

    def build():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 3)).double().to(device)

    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(4 * n, 6, generator=g).double().to(device),
             torch.randint(0, 3, (4 * n,), generator=g).to(device)) for _ in range(5)]
    ref, model = build(), build()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.Adam, stage=stage,
                               lr=0.01, bucket_cap_mb=200 / 2 ** 20)
    for x, y in data:
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[4 * r:4 * r + 4]), y[4 * r:4 * r + 4]).backward()
        opt.clip_grad_norm_(1e9)
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.device == device
        assert torch.allclose(p, q, rtol=1e-9, atol=1e-11)
    opt.consolidate_state_dict(to=None)
    plain = torch.optim.Adam(build().parameters(), lr=0.5)
    plain.load_state_dict(opt.state_dict())
    for a, b in zip(plain.state_dict()["state"].values(), ref_opt.state_dict()["state"].values()):
        assert torch.allclose(a["exp_avg"], b["exp_avg"], rtol=1e-9, atol=1e-12)
