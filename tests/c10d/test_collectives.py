"""torch.distributed's collectives on the horovod_cpp backend: hand-computed results at 2-4
ranks, the same calls on the Gloo group where Gloo has them, subgroups, bad input and ranks
that diverge, and the timeline."""
import json
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

import horovod_cpp.torch as hvd

R = dist.ReduceOp


def rank():
    return dist.get_rank()


def size():
    return dist.get_world_size()


def values(dtype, shape=(5,), r=None):
    """Rank r's input: small integers, so that sums and products are exact in any dtype."""
    r = rank() if r is None else r
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n) % 3) + r + 1).reshape(shape).to(dtype)


def on_every_rank(fn):
    return [fn(r) for r in range(size())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bfloat16,
                                   torch.int64])
@pytest.mark.parametrize("op", [R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT])
def test_all_reduce_matches_a_hand_computed_reduction(dtype, op):
    if op == R.AVG and not dtype.is_floating_point:
        pytest.skip("AVG of integers: torch leaves it to the backend")
    t = values(dtype, (2, 3))
    dist.all_reduce(t, op=op)
    inputs = torch.stack(on_every_rank(lambda r: values(torch.float64, (2, 3), r)))
    want = {R.SUM: inputs.sum(0), R.AVG: inputs.mean(0), R.MIN: inputs.min(0).values,
            R.MAX: inputs.max(0).values, R.PRODUCT: inputs.prod(0)}[op]
    assert torch.allclose(t.double(), want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-12)


def test_all_reduce_of_a_non_contiguous_tensor_writes_back_into_it(groups):
    base = torch.zeros(4, 6)
    view = base[:, ::2]  # not contiguous
    view.copy_(values(torch.float32, (4, 3)))
    ref = values(torch.float32, (4, 3))
    dist.all_reduce(view)
    dist.all_reduce(ref, group=groups[1])  # Gloo
    assert torch.equal(view, ref)
    assert torch.equal(base[:, 1::2], torch.zeros(4, 3))  # the rest untouched


def test_async_work_and_future_complete_with_the_tensors():
    t = torch.ones(3) * (rank() + 1)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    work.wait()
    total = sum(r + 1 for r in range(size()))
    assert torch.equal(t, torch.full((3,), float(total)))
    # (PyTorch's wrapper of a Python Work forwards wait() and get_future(), not is_completed())
    assert fut.done()
    assert torch.equal(chained.wait(), torch.full((3,), 2.0 * total))


def test_the_completion_thread_stops_at_exit_and_starts_again_when_needed():
    # (it is stopped at exit: woken while the interpreter finalizes, it would abort the process)
    from horovod_cpp.torch.distributed import backend
    done = dist.all_reduce(torch.full((2,), float(rank())), async_op=True).get_future().wait()
    assert torch.equal(done[0], torch.full((2,), float(sum(range(size())))))  # by the thread
    thread = backend._COMPLETIONS._thread
    assert thread is not None and thread.is_alive()
    backend._COMPLETIONS.stop()
    assert not thread.is_alive()
    again = dist.all_reduce(torch.ones(2), async_op=True).get_future().wait()
    assert torch.equal(again[0], torch.full((2,), float(size())))
    assert backend._COMPLETIONS._thread is not thread
    assert backend._COMPLETIONS._thread.is_alive()


def test_many_async_all_reduces_in_flight_complete_in_any_wait_order():
    ts = [torch.full((i + 1,), float(rank())) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    want = float(sum(range(size())))
    assert all(torch.equal(t, torch.full_like(t, want)) for t in ts)


def test_all_reduce_coalesced_and_the_coalescing_manager(groups):
    a, b = values(torch.float64, (3,)), values(torch.float64, (2, 2))
    dist.all_reduce_coalesced([a, b])
    want_a = sum(on_every_rank(lambda r: values(torch.float64, (3,), r)))
    want_b = sum(on_every_rank(lambda r: values(torch.float64, (2, 2), r)))
    assert torch.equal(a, want_a) and torch.equal(b, want_b)
    xs = [values(torch.float32, (4,)) for _ in range(3)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    assert all(torch.equal(x, sum(on_every_rank(lambda r: values(torch.float32, (4,), r))))
               for x in xs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_all_gather_and_all_gather_into_tensor(dtype):
    mine = values(torch.int64, (2, 3)).remainder(2).to(dtype)
    outs = [torch.empty(2, 3, dtype=dtype) for _ in range(size())]
    dist.all_gather(outs, mine)
    want = on_every_rank(lambda r: values(torch.int64, (2, 3), r).remainder(2).to(dtype))
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
    flat = torch.empty(size() * 2, 3, dtype=dtype)
    dist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat, torch.cat(want))


def test_all_gather_object_and_broadcast_object_list():
    objs = [None] * size()
    dist.all_gather_object(objs, {"rank": rank(), "text": "x" * rank()})
    assert objs == [{"rank": r, "text": "x" * r} for r in range(size())]
    box = [{"from": rank()}, rank()]
    dist.broadcast_object_list(box, src=size() - 1)
    assert box == [{"from": size() - 1}, size() - 1]


@pytest.mark.parametrize("op", [R.SUM, R.AVG])
def test_reduce_scatter_tensor_and_reduce_scatter(groups, op):
    n = 3
    inp = values(torch.float64, (size() * n,))
    out = torch.empty(n, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, inp, op=op)
    total = torch.stack(on_every_rank(lambda r: values(torch.float64, (size() * n,), r)))
    total = total.sum(0) / (size() if op == R.AVG else 1)
    assert torch.allclose(out, total[rank() * n:(rank() + 1) * n], rtol=1e-12)
    if op == R.SUM:  # Gloo has no AVG here
        parts = list(inp.view(size(), n))
        out2 = torch.empty(n, dtype=torch.float64)
        dist.reduce_scatter(out2, [p.clone() for p in parts], op=op)
        ref = torch.empty(n, dtype=torch.float64)
        dist.reduce_scatter_tensor(ref, inp, op=op, group=groups[1])
        assert torch.equal(out2, ref) and torch.equal(out, ref)


def test_broadcast_reduce_gather_scatter_from_every_root():
    for root in range(size()):
        b = values(torch.float32, (2, 2))
        dist.broadcast(b, src=root)
        assert torch.equal(b, values(torch.float32, (2, 2), root))
        t = values(torch.float32, (3,))
        dist.reduce(t, dst=root)
        if rank() == root:
            assert torch.equal(t, sum(on_every_rank(lambda r: values(torch.float32, (3,), r))))
        else:
            assert torch.equal(t, values(torch.float32, (3,)))
        got = [torch.empty(3) for _ in range(size())] if rank() == root else None
        dist.gather(values(torch.float32, (3,)), got, dst=root)
        if rank() == root:
            assert all(torch.equal(g, values(torch.float32, (3,), r)) for r, g in enumerate(got))
        out = torch.empty(2)
        chunks = [torch.full((2,), 10.0 * r + root) for r in range(size())]
        dist.scatter(out, chunks if rank() == root else None, src=root)
        assert torch.equal(out, torch.full((2,), 10.0 * rank() + root))


def test_all_to_all_single_with_even_and_uneven_splits(groups):
    n = size()
    inp = torch.arange(n * 2, dtype=torch.float32) + 100 * rank()
    out = torch.empty(n * 2)
    dist.all_to_all_single(out, inp)
    ref = torch.empty(n * 2)
    dist.all_to_all_single(ref, inp, group=groups[1])
    assert torch.equal(out, ref)
    # Rank r sends r + 1 rows (of 2) to every rank; each receives r + 1 rows from rank r.
    rows = torch.arange((rank() + 1) * n * 2, dtype=torch.float64).reshape(-1, 2) + 1000 * rank()
    in_splits = [rank() + 1] * n
    out_splits = [r + 1 for r in range(n)]
    out = torch.empty(sum(out_splits), 2, dtype=torch.float64)
    dist.all_to_all_single(out, rows, out_splits, in_splits)
    ref = torch.empty_like(out)
    dist.all_to_all_single(ref, rows, out_splits, in_splits, group=groups[1])
    assert torch.equal(out, ref)
    outs = [torch.empty(r + 1) for r in range(n)]
    dist.all_to_all(outs, [torch.full((rank() + 1,), float(rank() * 10 + d)) for d in range(n)])
    assert all(torch.equal(o, torch.full((r + 1,), float(r * 10 + rank())))
               for r, o in enumerate(outs))


def test_barrier_waits_for_every_rank():
    if rank() == 0:
        time.sleep(0.3)
    start = time.time()
    dist.barrier()
    took = [None] * size()
    dist.all_gather_object(took, time.time() - start)
    assert all(t >= 0.2 for r, t in enumerate(took) if r != 0), took


def test_subgroups_are_process_sets_and_outsiders_skip_them():
    n = size()
    evens = dist.new_group([r for r in range(n) if r % 2 == 0])
    last_two = dist.new_group([n - 2, n - 1])
    everyone = dist.new_group(list(range(n)))
    if rank() % 2 == 0:
        t = torch.full((2,), float(rank()))
        dist.all_reduce(t, group=evens)
        assert torch.equal(t, torch.full((2,), float(sum(range(0, n, 2)))))
        b = torch.full((1,), float(rank()))
        dist.broadcast(b, src=n - 1 if (n - 1) % 2 == 0 else n - 2, group=evens)
        assert b.item() == float(n - 1 if (n - 1) % 2 == 0 else n - 2)
    if rank() >= n - 2:
        outs = [torch.empty(1) for _ in range(2)]
        dist.all_gather(outs, torch.full((1,), float(rank())), group=last_two)
        assert [o.item() for o in outs] == [float(n - 2), float(n - 1)]
    t = torch.ones(1)
    dist.all_reduce(t, group=everyone)
    assert t.item() == n
    for g in (evens, last_two, everyone):
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)


# ---- bad input: a clear error on the rank that made it, and the group goes on ----------------

def test_bad_input_is_a_clear_error_on_the_calling_rank():
    with pytest.raises(Exception, match="all_gather_into_tensor: the output has 3 elements"):
        dist.all_gather_into_tensor(torch.empty(3), torch.ones(2))
    with pytest.raises(Exception, match="does not support .*BAND"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=R.BAND)
    with pytest.raises(Exception, match="reduce_scatter_tensor does not support .*MAX"):
        dist.reduce_scatter_tensor(torch.empty(1), torch.ones(size()), op=R.MAX)
    with pytest.raises(Exception, match="Tensor type torch.uint32 is not supported"):
        dist.all_reduce(torch.ones(2, dtype=torch.uint32))
    c = torch.full((2,), 1 + 2j, dtype=torch.complex64)  # torch sends it as (real, imag) pairs
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((2,), size() * (1 + 2j), dtype=torch.complex64))
    if size() > 1:
        with pytest.raises(Exception, match="point-to-point send/recv is not supported"):
            dist.send(torch.ones(1), dst=(rank() + 1) % size())
    t = torch.ones(1)
    dist.all_reduce(t)  # the group goes on
    assert t.item() == size()


def test_ranks_that_disagree_get_the_same_error_naming_them():
    # Rank 0 passes 3 elements, the others 4: negotiated, not a hang or a wrong sum.
    t = torch.ones(3 if rank() == 0 else 4)
    with pytest.raises(Exception) as info:
        dist.all_reduce(t)
    msg = str(info.value)
    assert "c10d.0." in msg and "rank 0" in msg and "[3]" in msg and "[4]" in msg, msg
    t = torch.ones(2, dtype=torch.float32 if rank() == 0 else torch.float64)
    with pytest.raises(Exception, match="float32.*float64|float64.*float32"):
        dist.all_reduce(t)
    # One rank runs a different collective at the same point of the sequence.
    with pytest.raises(Exception, match="allreduce|allgather") as info:
        if rank() == size() - 1:
            dist.all_gather_into_tensor(torch.empty(2 * size()), torch.ones(2))
        else:
            dist.all_reduce(torch.ones(2))
    ok = torch.ones(1)
    dist.all_reduce(ok)  # and the group goes on
    assert ok.item() == size()


def test_a_rank_that_skips_a_collective_is_named_within_the_deadlock_grace():
    # The last rank skips the all_reduce and waits in the barrier: every rank is blocked. (A
    # group of its own: a rank that skipped one is a collective behind in that group for good.)
    group = dist.new_group(list(range(size())))
    with pytest.raises(Exception) as info:
        if rank() != size() - 1:
            dist.all_reduce(torch.ones(1), group=group)
        dist.barrier(group=group)
    msg = str(info.value)
    assert "deadlock" in msg.lower() and "rank %d" % (size() - 1) in msg, msg
    assert "test_collectives.py" in msg, msg  # the call sites
    assert "for 2 s, HOROVOD_DEADLOCK_GRACE_SECONDS" in msg, msg  # the conftest's setting
    dist.destroy_process_group(group)


def test_the_stall_inspector_names_a_rank_that_is_late(capfd):
    # HOROVOD_STALL_CHECK_TIME_SECONDS=1 (conftest): rank 0's coordinator warns while the last
    # rank computes, naming it and the collective; then the collective completes.
    late = size() - 1
    if rank() == late:
        time.sleep(2.5)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(size())))
    err = capfd.readouterr().err
    if rank() == 0:
        assert "Missing ranks:\n%d: [c10d.0." % late in err, err
        assert "test_collectives.py" in err, err  # where the others submitted it


def test_the_timeline_records_the_backends_collectives():
    path = os.path.join(tempfile.gettempdir(), "hvd-c10d-timeline-%d.json" % os.getpid())
    names = [None] * size()
    dist.all_gather_object(names, path)
    hvd.start_timeline(names[0])
    t = torch.ones(8)
    dist.all_reduce(t)
    outs = [torch.empty(8) for _ in range(size())]
    dist.all_gather(outs, t)
    hvd.stop_timeline()
    dist.barrier()
    if rank() == 0:
        events = json.load(open(names[0]))
        rows = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        spans = {e["name"] for e in events if e.get("ph") == "B"}
        os.unlink(names[0])
        assert any(r.startswith("c10d.0.") for r in rows), rows
        assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "NEGOTIATE_ALLGATHER", "ALLGATHER"} <= spans
