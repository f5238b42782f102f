"""horovod_cpp.torch collectives against torch references, for every dtype and op, under mpirun.

Every rank rebuilds every other rank's input from its seed, so the expected result is computed
independently with plain torch.
"""
import re
import socket
import sys
import time

import pytest
import torch

import horovod_cpp.torch as hvd
from conftest import same_on_every_rank

REDUCE_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.bfloat16, torch.float32, torch.float64]
MOVE_DTYPES = REDUCE_DTYPES + [torch.bool]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}


def rank_input(rank, shape, dtype, seed=0):
    """What `rank` contributes: small exact values (unsigned 0..2, signed -2..2, floating
    multiples of 0.5), so sums and products fit every dtype."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 3, shape, generator=g).to(dtype)
    values = torch.randint(-2, 3, shape, generator=g)
    return (values * 0.5).to(dtype) if dtype.is_floating_point else values.to(dtype)


def reference(op, inputs):
    stacked = torch.stack([t.double() for t in inputs])
    if op == hvd.Sum:
        return stacked.sum(0)
    if op == hvd.Min:
        return stacked.min(0).values
    if op == hvd.Max:
        return stacked.max(0).values
    if op == hvd.Product:
        return stacked.prod(0)
    total = stacked.sum(0)  # Average
    if inputs[0].dtype.is_floating_point:
        return total / len(inputs)
    return torch.div(total, len(inputs), rounding_mode="trunc")  # integers truncate toward zero


def assert_close(got, want, dtype):
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-6,
           torch.float64: 1e-12}.get(dtype, 0.0)
    assert got.dtype == dtype
    assert torch.allclose(got.double(), want, rtol=tol, atol=tol), (got, want)


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=str)
def test_allreduce_every_dtype_and_op(dtype, op_name):
    op = OPS[op_name]
    shape = (3, 5)
    inputs = [rank_input(r, shape, dtype, seed=1) for r in range(hvd.size())]
    result = hvd.allreduce(inputs[hvd.rank()], op=op, name="every.%s.%s" % (dtype, op_name))
    assert_close(result, reference(op, inputs), dtype)
    assert torch.equal(inputs[hvd.rank()], rank_input(hvd.rank(), shape, dtype, seed=1))


def test_allreduce_in_place_async_and_scaling():
    n = hvd.size()
    x = torch.full((4,), float(hvd.rank() + 1))
    hvd.allreduce_(x, op=hvd.Sum, name="inplace")
    assert x.tolist() == [n * (n + 1) / 2] * 4
    y = torch.full((4,), float(hvd.rank() + 1))
    handle = hvd.allreduce_async_(y, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    assert hvd.synchronize(handle) is y
    assert y.tolist() == [2.0 * n * (n + 1) / 2] * 4
    z = hvd.synchronize(hvd.allreduce_async(torch.ones(3, dtype=torch.float64)))
    assert z.tolist() == [1.0, 1.0, 1.0]  # Average by default


def test_average_argument_compatibility():
    x = torch.full((2,), float(hvd.rank()))
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    with pytest.warns(DeprecationWarning, match="`average` has been replaced with `op`"):
        summed = hvd.allreduce(x, average=False, name="compat.sum")
    assert summed.tolist() == [sum(range(hvd.size()))] * 2


def test_grouped_allreduce_variants():
    n = hvd.size()
    tensors = [torch.full((k + 1,), float(hvd.rank() + k)) for k in range(4)]
    out = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="g")
    for k, t in enumerate(out):
        assert t.tolist() == [sum(r + k for r in range(n))] * (k + 1)
    handle = hvd.grouped_allreduce_async(tensors, op=hvd.Max)
    assert [t.tolist() for t in hvd.synchronize(handle)] == \
        [[float(n - 1 + k)] * (k + 1) for k in range(4)]
    hvd.grouped_allreduce_(tensors, op=hvd.Min)
    assert [t.tolist() for t in tensors] == [[float(k)] * (k + 1) for k in range(4)]
    handle = hvd.grouped_allreduce_async_(tensors)  # Average of equal values
    hvd.synchronize(handle)
    assert [t.tolist() for t in tensors] == [[float(k)] * (k + 1) for k in range(4)]


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=str)
def test_allgather_variable_first_dimension(dtype):
    # Rank r contributes r + 1 rows.
    inputs = [rank_input(r, (r + 1, 2, 3), dtype, seed=2) for r in range(hvd.size())]
    result = hvd.allgather(inputs[hvd.rank()], name="ag.%s" % dtype)
    assert result.dtype == dtype
    assert torch.equal(result, torch.cat(inputs))


def test_grouped_allgather_and_async():
    a = torch.full((hvd.rank() + 1,), hvd.rank())
    b = torch.full((2, 2), hvd.rank() * 10)
    out = hvd.grouped_allgather([a, b])
    assert torch.equal(out[0], torch.cat([torch.full((r + 1,), r) for r in range(hvd.size())]))
    assert torch.equal(out[1], torch.cat([torch.full((2, 2), r * 10) for r in range(hvd.size())]))
    handle = hvd.grouped_allgather_async([a])
    assert torch.equal(hvd.synchronize(handle)[0], out[0])
    assert torch.equal(hvd.synchronize(hvd.allgather_async(b)), out[1])


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=str)
def test_broadcast_from_every_root(dtype):
    for root in range(hvd.size()):
        inputs = [rank_input(r, (4, 3), dtype, seed=3) for r in range(hvd.size())]
        x = inputs[hvd.rank()].clone()
        out = hvd.broadcast(x, root, name="bc.%s.%d" % (dtype, root))
        assert torch.equal(out, inputs[root])
        assert torch.equal(x, inputs[hvd.rank()])  # out of place
        hvd.broadcast_(x, root, name="bc_.%s.%d" % (dtype, root))
        assert torch.equal(x, inputs[root])
    y = inputs[hvd.rank()].clone()
    assert torch.equal(hvd.synchronize(hvd.broadcast_async(y, 0)), inputs[0])
    hvd.synchronize(hvd.broadcast_async_(y, hvd.size() - 1))
    assert torch.equal(y, inputs[hvd.size() - 1])


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=str)
def test_alltoall_even_and_explicit_splits(dtype):
    n, me = hvd.size(), hvd.rank()
    # Even: 2 rows to every rank.
    inputs = [rank_input(r, (2 * n, 3), dtype, seed=4) for r in range(n)]
    out = hvd.alltoall(inputs[me], name="a2a.%s" % dtype)
    assert torch.equal(out, torch.cat([inputs[r][2 * me:2 * me + 2] for r in range(n)]))
    # Explicit: rank r sends (r + d) % 3 rows to rank d.
    splits = [[(r + d) % 3 for d in range(n)] for r in range(n)]
    inputs = [rank_input(r, (sum(splits[r]), 2), dtype, seed=5) for r in range(n)]
    out, received = hvd.alltoall(inputs[me], splits=torch.tensor(splits[me], dtype=torch.int32),
                                 name="a2a.splits.%s" % dtype)
    expected = []
    for r in range(n):
        start = sum(splits[r][:me])
        expected.append(inputs[r][start:start + splits[r][me]])
    assert torch.equal(out, torch.cat(expected))
    assert received.dtype == torch.int32
    assert received.tolist() == [splits[r][me] for r in range(n)]


def test_alltoall_async_and_bad_splits():
    n = hvd.size()
    x = torch.arange(n * 2, dtype=torch.float32)
    out, received = hvd.synchronize(hvd.alltoall_async(x, splits=[2] * n))
    assert received.tolist() == [2] * n
    with pytest.raises(ValueError, match="not divisible by the %d ranks" % n):
        hvd.alltoall(torch.zeros(n * 2 + 1))
    with pytest.raises(ValueError, match="1D splits tensor"):
        hvd.alltoall(x, splits=torch.ones(1, n, dtype=torch.int32))
    with pytest.raises(ValueError, match="splits sum to"):
        hvd.alltoall(x, splits=[1] * n)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=str)
def test_reducescatter_uneven_rows(dtype, op_name):
    op = OPS[op_name]
    n, me = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # the first rank gets one extra row
    inputs = [rank_input(r, (rows, 2), dtype, seed=6) for r in range(n)]
    result = hvd.reducescatter(inputs[me], op=op, name="rs.%s.%s" % (dtype, op_name))
    counts = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    start = sum(counts[:me])
    want = reference(op, [t[start:start + counts[me]] for t in inputs])
    assert result.shape == (counts[me], 2)
    assert_close(result, want, dtype)


def test_reducescatter_grouped_async_and_errors():
    n, me = hvd.size(), hvd.rank()
    tensors = [torch.full((n * 2, 3), float(me + 1)), torch.full((n,), float(me))]
    out = hvd.grouped_reducescatter(tensors, op=hvd.Sum)
    assert out[0].tolist() == [[n * (n + 1) / 2] * 3] * 2
    assert out[1].tolist() == [n * (n - 1) / 2]
    h = hvd.reducescatter_async(tensors[0], op=hvd.Sum, prescale_factor=2.0)
    assert hvd.synchronize(h).tolist() == [[n * (n + 1)] * 3] * 2
    h = hvd.grouped_reducescatter_async(tensors)
    assert hvd.synchronize(h)[1].tolist() == [(n - 1) / 2]
    with pytest.raises(ValueError, match="only supports AVERAGE and SUM"):
        hvd.reducescatter(tensors[0], op=hvd.Max)
    with pytest.raises(ValueError, match="a scalar cannot be scattered"):
        hvd.reducescatter(torch.tensor(1.0))


def test_operations_are_asynchronous():
    # Nothing can complete before rank 0 enqueues, and it waits first.
    if hvd.rank() == 0:
        time.sleep(0.3)
    handle = hvd.allreduce_async(torch.ones(2), name="async.poll")
    if hvd.rank() != 0:
        assert hvd.poll(handle) is False
    assert hvd.synchronize(handle).tolist() == [1.0, 1.0]
    assert hvd.synchronize(handle) is None  # unknown (already synchronized)
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.poll(handle)


def test_duplicate_name_in_flight_is_a_value_error():
    # The last rank enqueues only after the others tried the duplicate, so theirs is in flight.
    import side_channel
    last = hvd.rank() == hvd.size() - 1
    if last:
        side_channel.barrier()
    handle = hvd.allreduce_async(torch.ones(2), name="dup")
    if not last:
        with pytest.raises(ValueError, match="'allreduce.dup': a tensor with this name is already "
                                             "in flight"):
            hvd.allreduce_async(torch.ones(2), name="dup")
        side_channel.barrier()
    hvd.synchronize(handle)


DUPLICATE_SUBMITTERS = {
    "allreduce": lambda n: hvd.allreduce_async(torch.ones(2 * hvd.size()), name=n),
    "allreduce_": lambda n: hvd.allreduce_async_(torch.ones(2 * hvd.size()), name=n),
    "broadcast": lambda n: hvd.broadcast_async(torch.ones(2 * hvd.size()), 0, name=n),
    "allgather": lambda n: hvd.allgather_async(torch.ones(2 * hvd.size()), name=n),
    "alltoall": lambda n: hvd.alltoall_async(torch.ones(2 * hvd.size()), name=n),
    "reducescatter": lambda n: hvd.reducescatter_async(torch.ones(2 * hvd.size()), name=n),
    "grouped_allreduce": lambda n: hvd.grouped_allreduce_async(
        [torch.ones(2), torch.ones(3)], name=n),
    "grouped_allgather": lambda n: hvd.grouped_allgather_async(
        [torch.ones(2), torch.ones(3)], name=n),
    "grouped_reducescatter": lambda n: hvd.grouped_reducescatter_async(
        [torch.ones(2 * hvd.size()), torch.ones(hvd.size())], name=n),
}


@pytest.mark.parametrize("kind", sorted(DUPLICATE_SUBMITTERS))
def test_duplicate_name_before_synchronize_is_a_value_error_even_when_completed(kind):
    # Horovod's own duplicate-name tests: the first op has completed (poll says so), but its
    # handle is not synchronized yet, so the name is still taken, whatever the timing.
    submit = DUPLICATE_SUBMITTERS[kind]
    name = "dup_after_done." + kind
    handle = submit(name)
    deadline = time.monotonic() + 30
    while not hvd.poll(handle) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert hvd.poll(handle), "the first %s did not complete" % kind
    with pytest.raises(ValueError, match="a tensor with this name is already in flight"):
        submit(name)
    hvd.synchronize(handle)
    hvd.synchronize(submit(name))  # synchronized: the name is free again on every rank


def test_mismatches_raise_the_same_error_on_every_rank_and_the_job_goes_on():
    errors = []
    for make in (lambda: hvd.allreduce(torch.ones(hvd.rank() + 1), name="mm.shape"),
                 lambda: hvd.allreduce(torch.ones(2, dtype=torch.float32 if hvd.rank() == 0
                                                  else torch.float64), name="mm.dtype"),
                 lambda: hvd.broadcast(torch.ones(2), root_rank=hvd.rank() % 2, name="mm.root")):
        with pytest.raises(hvd.HorovodInternalError) as info:
            make()
        assert isinstance(info.value, RuntimeError)
        errors.append(str(info.value))
    assert errors[0].startswith("allreduce 'allreduce.mm.shape': mismatched shapes: rank 0 sent [1]")
    assert errors[1].startswith("allreduce 'allreduce.mm.dtype': mismatched data types")
    assert "mismatched root ranks" in errors[2] or hvd.size() == 1
    assert all(e == errors for e in same_on_every_rank(errors))
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="mm.after").tolist() == [hvd.size()] * 2


def test_bad_arguments_are_value_errors_that_say_what_is_supported():
    with pytest.raises(ValueError, match=r"Tensor type torch.complex64 is not supported by "
                                         r"allreduce; supported types: torch.uint8"):
        hvd.allreduce(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="torch.bool is not supported by allreduce"):
        hvd.allreduce(torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="not contiguous"):
        hvd.allreduce_(torch.zeros(3, 4).t())
    with pytest.raises(ValueError, match="root rank %d is out of range" % hvd.size()):
        hvd.broadcast(torch.zeros(2), root_rank=hvd.size())
    with pytest.raises(ValueError, match="Adasum"):  # 2^k ranks and floating point only
        hvd.allreduce(torch.zeros(2, dtype=torch.int32), op=hvd.Adasum)
    for op in (hvd.allreduce, hvd.allgather, hvd.allreduce_async, hvd.reducescatter,
               lambda t: hvd.broadcast(t, 0), lambda t: hvd.grouped_allreduce([t])):
        with pytest.raises(TypeError, match="expects a torch.Tensor, got NoneType"):
            op(None)
    # Non-contiguous input to an out-of-place op is fine.
    t = (torch.arange(12.0).reshape(3, 4) * (hvd.rank() + 1)).t()
    n = hvd.size()
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), torch.arange(12.0).reshape(3, 4).t() *
                       (n * (n + 1) / 2))


def test_empty_and_scalar_tensors():
    assert hvd.allreduce(torch.zeros(0, 3)).shape == (0, 3)
    assert hvd.allreduce(torch.tensor(float(hvd.rank())), op=hvd.Max).item() == hvd.size() - 1
    assert hvd.allgather(torch.zeros(0, 2)).shape == (0, 2)


def test_sparse_allreduce():
    n, me = hvd.size(), hvd.rank()
    dense = torch.zeros(4, 3)
    dense[me % 4, 1] = me + 1.0
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=hvd.Sum)
    result = handle().to_dense()
    want = torch.zeros(4, 3)
    for r in range(n):
        want[r % 4, 1] += r + 1.0
    assert torch.equal(result, want)


def test_fp16_compression_keeps_the_dtype():
    x = torch.full((5,), 0.25 * (hvd.rank() + 1), dtype=torch.float32)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32
    n = hvd.size()
    assert torch.allclose(out, torch.full((5,), 0.25 * n * (n + 1) / 2))
    ints = hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Sum,
                         compression=hvd.Compression.fp16)
    assert ints.dtype == torch.int32 and ints.tolist() == [n, n]


def test_join_with_uneven_batches():
    # Rank r has r + 1 batches; Average divides by the full size; the last rank joins last.
    n, me = hvd.size(), hvd.rank()
    for step in range(me + 1):
        out = hvd.allreduce(torch.full((3,), float(me + 1)), name="join.grad")
        active = sum(r + 1 for r in range(n) if r + 1 > step)
        assert out.tolist() == pytest.approx([active / n] * 3)
    assert hvd.join() == n - 1


def test_barrier_and_topology():
    hvd.barrier()
    import os
    import side_channel
    launcher = "HOROVOD_%s" if side_channel.GLOO else "OMPI_COMM_WORLD_%s"
    assert hvd.size() == int(os.environ[launcher % "SIZE"])
    assert hvd.rank() == int(os.environ[launcher % "RANK"])
    assert hvd.local_size() == int(os.environ[launcher % "LOCAL_SIZE"])
    assert hvd.local_rank() == int(os.environ[launcher % "LOCAL_RANK"])
    import socket  # one host, or the multi-host test bed: hosts in order of their first rank
    hosts = hvd.allgather_object(socket.gethostname())
    distinct = sorted(set(hosts), key=hosts.index)
    assert hvd.cross_size() == len(distinct)
    assert hvd.cross_rank() == distinct.index(socket.gethostname())
    assert hvd.is_initialized()
    hvd.init()  # idempotent
    if side_channel.GLOO:
        assert hvd.gloo_built() and hvd.gloo_enabled() and not hvd.mpi_enabled()
        assert not hvd.mpi_threads_supported()
    else:
        assert hvd.mpi_built() and hvd.mpi_enabled() and hvd.mpi_threads_supported()
        assert not hvd.gloo_enabled()
    assert isinstance(hvd.nccl_built(), int)
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def test_timeline_start_stop():
    import json
    path = "/tmp/hvd_py_timeline_%d.json" % hvd.size()
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(torch.ones(4), name="recorded")
    hvd.stop_timeline()
    if hvd.rank() == 0:
        events = json.load(open(path))
        names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert "allreduce.recorded" in names
    if hvd.rank() == 0:  # only rank 0 records, so only rank 0 can fail to open the file
        with pytest.raises(ValueError, match="cannot open timeline file '/nonexistent-dir/t.json'"):
            hvd.start_timeline("/nonexistent-dir/t.json")
    else:
        hvd.start_timeline("/nonexistent-dir/t.json")


def test_exports_match_horovod_torch():
    expected = """init shutdown is_initialized size rank local_size local_rank cross_size cross_rank
        mpi_built mpi_enabled mpi_threads_supported gloo_built gloo_enabled nccl_built cuda_built
        rocm_built ccl_built ddl_built Average Sum Adasum Min Max Product allreduce allreduce_
        allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
        grouped_allreduce_async grouped_allreduce_async_ sparse_allreduce_async allgather
        allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_
        broadcast_async broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
        grouped_reducescatter grouped_reducescatter_async poll synchronize join barrier ProcessSet
        global_process_set add_process_set remove_process_set start_timeline stop_timeline
        HorovodInternalError Compression broadcast_parameters broadcast_optimizer_state
        broadcast_object allgather_object DistributedOptimizer SyncBatchNorm""".split()
    missing = [name for name in expected if not hasattr(hvd, name)]
    assert not missing
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


def here():
    """The caller's file:line, as errors name the call site of a collective."""
    frame = sys._getframe(1)
    return "%s:%d" % (frame.f_code.co_filename, frame.f_lineno)


def ranks_at(sites):
    """"rank 0 at a.py:1; ranks 1, 2 at a.py:3": every rank's call site, grouped."""
    groups = {}
    for rank, site in enumerate(sites):
        groups.setdefault(site, []).append(rank)
    return "; ".join("%s %s at %s" % ("rank" if len(r) == 1 else "ranks",
                                       ", ".join(map(str, r)), site)
                     for site, r in sorted(groups.items(), key=lambda g: g[1][0]))


def test_a_deadlock_is_an_error_on_every_rank_not_a_hang():
    # Rank 0 waits in a barrier, the others in an allgather: neither can complete.
    start = time.monotonic()
    with pytest.raises(hvd.HorovodInternalError) as info:
        if hvd.rank() == 0:
            site = here(); hvd.barrier()  # noqa: E702
        else:
            site = here(); hvd.allgather(torch.ones(1, 2), name="deadlocked")  # noqa: E702
    message = str(info.value)
    sites = same_on_every_rank(site)
    hosts = same_on_every_rank(socket.gethostname())  # across hosts, each rank's own
    assert "deadlock: every rank is blocked waiting" in message, message
    # Each rank's host and the line of the collective it is blocked in.
    want = "rank 0 (%s) waits for barrier called at %s" % (hosts[0], sites[0]) + "".join(
        "; rank %d (%s) waits for allgather 'allgather.deadlocked' called at %s"
        % (r, hosts[r], sites[r]) for r in range(1, hvd.size()))
    assert want in message, message
    assert time.monotonic() - start >= 1.5  # the grace (conftest: 2 s)
    assert same_on_every_rank(message) == [message] * hvd.size()
    hvd.barrier()  # the job goes on, barriers realigned
    assert hvd.allgather(torch.ones(1, 2), name="deadlocked").shape == (hvd.size(), 2)


def test_a_mismatch_names_every_ranks_call_site():
    with pytest.raises(hvd.HorovodInternalError) as info:
        if hvd.rank() == 0:
            site = here(); hvd.allreduce(torch.ones(1), name="cs.shape")  # noqa: E702
        else:
            site = here(); hvd.allreduce(torch.ones(2), name="cs.shape")  # noqa: E702
    sites = same_on_every_rank(site)
    assert str(info.value).endswith(". Called from: " + ranks_at(sites)), str(info.value)
    assert sites[0] != sites[-1]


def test_a_gradients_call_site_is_the_users_backward_line():
    # The optimizer's hook submits the allreduce from inside autograd: the call site named is
    # the user's loss.backward(), not a line of horovod_cpp or torch.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    with pytest.raises(hvd.HorovodInternalError) as info:
        if hvd.rank() == 0:
            loss = model(torch.ones(1, 3)).sum()
            site = here(); loss.backward()  # noqa: E702
            opt.step()
        else:
            site = here(); hvd.barrier()  # noqa: E702
    message = str(info.value)
    sites = same_on_every_rank(site)
    hosts = same_on_every_rank(socket.gethostname())
    assert re.search(r"rank 0 \(%s\) waits for allreduce '[^']*(weight|bias)' called at %s"
                     % (re.escape(hosts[0]), re.escape(sites[0])), message), message
    assert "rank 1 (%s) waits for barrier called at %s" % (hosts[1], sites[1]) in message, message
    # The reductions step() did not wait for failed too: wait them out (each frees its name,
    # which later tests use again), then the job goes on.
    for handle, _ in opt._handles.values():
        if handle is not None:
            try:
                hvd.synchronize(handle)
            except (hvd.HorovodInternalError, ValueError):  # failed, or waited by step()
                pass
    opt._handles.clear()
    hvd.barrier()


def test_a_rank_computing_longer_than_the_grace_is_not_a_deadlock():
    if hvd.rank() == hvd.size() - 1:
        time.sleep(3)  # longer than the 2 s grace, but computing, not waiting
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="late").tolist() == [hvd.size()] * 2


def test_allgather_into_a_given_output():
    """The core writes the gathered result into a given output of its size (stage 3's
    gathers); of another size the result comes back in the core's buffer and synchronize
    raises on that rank alone (every rank took part: none waits)."""
    from horovod_cpp.torch.collectives import _allgather_into_async
    n, r = hvd.size(), hvd.rank()
    x = torch.full((r + 1, 3), float(r))
    rows = n * (n + 1) // 2
    want = torch.cat([torch.full((q + 1, 3), float(q)) for q in range(n)])
    out = torch.empty(rows, 3)
    assert hvd.synchronize(_allgather_into_async(x, out, name="into.fits")) is out
    assert torch.equal(out, want)
    flat = torch.empty(rows * 3)  # (the same size, another shape: the same bytes)
    assert torch.equal(hvd.synchronize(_allgather_into_async(x, flat, name="into.flat")),
                       want.reshape(-1))
    short = torch.zeros(rows - 1, 3)
    handle = _allgather_into_async(x, short, name="into.short")
    with pytest.raises(ValueError, match="the output has %d elements, the gathered result %d"
                       % (short.numel(), rows * 3)):
        hvd.synchronize(handle)
    assert not short.any()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n  # nothing stuck
