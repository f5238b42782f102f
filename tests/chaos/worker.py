"""One rank of a chaos scenario (tests/chaos/chaos.py launches it with hvdrun).

    worker.py SPEC_JSON            (or main(spec) from HorovodRunner: spark_driver.py)

SPEC: {"tag", "workload": "train"|"mix", "steps", "fault", "victim", "step", "step_delay"}. Every rank runs
`steps` steps of the workload and checks each result against values computed independently
(the mix: exact sums, gathers and scatters of known integers; train: the final parameters
against one process training on the full batch). At step `step` the rank `victim` injects
`fault` (the kinds the harness draws; those the harness makes from outside, such as a link
going down, need nothing here). Lines the harness reads:

    chaos: FAULT <kind> rank <r> pid <pid> host <host>     the injection, just before it
    chaos: rank <r> OK <digest>                            every check passed, at the end
"""
import json
import os
import signal
import socket
import sys
import time

import torch

import horovod_cpp.torch as hvd

SPEC, FAULT, VICTIM, AT = {}, None, None, None  # set by main(spec)
# The train workload's problem: y = X w + noise, a global batch of 12 rows (even shares at 2, 3
# and 4 ranks), SGD on the mean squared error.
ROWS, FEATURES, LR = 12, 8, 0.05


def say(text):
    print("chaos: " + text, flush=True)


def announce(rank):
    say("FAULT %s rank %d pid %d host %s" % (FAULT, rank, os.getpid(), socket.gethostname()))


def expect(what, got, want):
    if not torch.equal(got, want):
        raise AssertionError("chaos: %s is wrong on rank %d: %s, expected %s"
                             % (what, hvd.rank(), got.tolist(), want.tolist()))


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(ROWS, FEATURES, generator=g, dtype=torch.float64)
    w = torch.arange(FEATURES, dtype=torch.float64) / FEATURES
    return x, x @ w + 0.01 * torch.randn(ROWS, generator=g, dtype=torch.float64)


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def train_step(net, opt, step, rank, size):
    x, y = batch(step)
    share = ROWS // size
    opt.zero_grad()
    loss = ((net(x[rank * share:(rank + 1) * share]).squeeze(1)
             - y[rank * share:(rank + 1) * share]) ** 2).mean()
    loss.backward()
    opt.step()


def pace(step, rank):
    """With a step delay (faults the campaign makes from outside: it watches the victim's
    steps), the victim says where it is and every rank takes its time."""
    delay = SPEC.get("step_delay", 0)
    if delay:
        if rank == VICTIM:
            say("step %d rank %d host %s" % (step, rank, socket.gethostname()))
        time.sleep(delay)


def train(rank, size, steps):
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR),
                                   named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    for step in range(steps):
        pace(step, rank)
        if rank == VICTIM and step == AT:
            inject(rank)
        train_step(net, opt, step, rank, size)
    # One process on the full batch, the same steps.
    ref = model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(SPEC["steps"]):
        x, y = batch(step)
        ref_opt.zero_grad()
        ((ref(x).squeeze(1) - y) ** 2).mean().backward()
        ref_opt.step()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        if not torch.allclose(p, q, rtol=1e-9, atol=1e-12):
            raise AssertionError("chaos: parameter %s differs from one process on the full "
                                 "batch on rank %d: %s vs %s" % (name, rank, p.tolist(), q.tolist()))
    return float(sum(p.sum() for p in net.parameters()))


def mix_step(step, rank, size, pair, fault):
    """Every collective once, grouped ops and a process set; each result checked exactly.
    `fault`: the victim's deviation at this step, or None."""
    f64 = torch.float64
    ranks = torch.arange(size, dtype=f64)
    # allreduce (the victim's shape, dtype or op may differ)
    x = torch.full((3,), float(rank + step), dtype=f64)
    op = hvd.Sum
    if fault == "shape":
        x = torch.full((4,), float(rank + step), dtype=f64)
    elif fault == "dtype":
        x = x.float()
    elif fault == "op":
        op = hvd.Max
    if fault == "duplicate":
        first = hvd.allreduce_async(x, name="chaos.sum", op=op)
        hvd.allreduce_async(x, name="chaos.sum", op=op)  # the same name while in flight
        hvd.synchronize(first)
    expect("allreduce", hvd.allreduce(x, name="chaos.sum", op=op),
           torch.full((3,), float((ranks + step).sum()), dtype=f64))
    # allgather, a different first dimension on every rank
    rows = torch.full((rank + 1, 2), float(rank), dtype=f64)
    want = torch.cat([torch.full((r + 1, 2), float(r), dtype=f64) for r in range(size)])
    expect("allgather", hvd.allgather(rows, name="chaos.gather"), want)
    # broadcast from a root that moves every step (the victim's may differ)
    root = step % size
    if fault == "root":
        root = (root + 1) % size
    if fault != "skip":  # the victim skips this collective
        value = torch.full((2,), float(10 * rank + step), dtype=f64)
        expect("broadcast", hvd.broadcast(value, root_rank=root, name="chaos.bcast"),
               torch.full((2,), float(10 * (step % size) + step), dtype=f64))
    # alltoall: rank r sends (r + 1) rows of value 100 r + d to rank d
    send = torch.cat([torch.full((rank + 1,), float(100 * rank + d), dtype=f64)
                      for d in range(size)])
    got = hvd.alltoall(send, splits=[rank + 1] * size, name="chaos.a2a")
    if isinstance(got, tuple):  # (tensor, received splits), as horovod.torch returns with splits
        got = got[0]
    expect("alltoall", got, torch.cat([torch.full((r + 1,), float(100 * r + rank), dtype=f64)
                                       for r in range(size)]))
    # reducescatter: every rank sends 0 .. 2 size - 1; rank r gets its two, times size
    scattered = hvd.reducescatter(torch.arange(2 * size, dtype=f64), name="chaos.rs", op=hvd.Sum)
    expect("reducescatter", scattered, torch.arange(2 * rank, 2 * rank + 2, dtype=f64) * size)
    # grouped allreduce
    a, b = hvd.grouped_allreduce([torch.ones(2, dtype=f64) * rank, torch.ones(1, dtype=f64)],
                                 name="chaos.group", op=hvd.Sum)
    expect("grouped allreduce", a, torch.ones(2, dtype=f64) * ranks.sum())
    expect("grouped allreduce", b, torch.ones(1, dtype=f64) * size)
    # a process set of ranks 0 and 1 only
    if pair.included():
        expect("process-set allreduce",
               hvd.allreduce(torch.ones(1, dtype=f64) * (rank + 1), name="chaos.pair",
                             op=hvd.Sum, process_set=pair), torch.ones(1, dtype=f64) * 3)


def mix(rank, size, steps, pair):
    total = 0
    for step in range(steps):
        fault = None
        pace(step, rank)
        if rank == VICTIM and step == AT:
            fault = inject(rank)
        mix_step(step, rank, size, pair, fault)
        total += step
    return float(total)


def inject(rank):
    """Injects this rank's fault now; returns the kind when the workload itself deviates."""
    if FAULT in ("none", "timeline_full", "throttle", "link_down", "store_kill"):
        return None  # nothing to do here (the harness makes the fault, if any)
    announce(rank)
    if FAULT == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif FAULT in ("stop_resume", "stop_kill"):
        os.kill(os.getpid(), signal.SIGSTOP)  # the harness resumes or kills it later
    elif FAULT == "raise":
        raise RuntimeError("chaos: rank %d injected an exception" % rank)
    elif FAULT == "exit0":
        sys.exit(0)  # a script that returns early: atexit shuts horovod_cpp down
    elif FAULT == "shutdown":
        hvd.shutdown()  # on this rank only; its next collective fails
    return FAULT


def main(spec):
    """Runs this rank; returns its digest (HorovodRunner's return value per rank)."""
    global SPEC, FAULT, VICTIM, AT
    SPEC, FAULT, VICTIM, AT = spec, spec["fault"], spec["victim"], spec["step"]
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    pair = hvd.add_process_set([0, 1]) if size > 2 else hvd.global_process_set
    steps = SPEC["steps"]
    if FAULT == "uneven" and rank == VICTIM:
        announce(rank)
        steps -= 1  # one batch fewer, and no hvd.join()
    say("rank %d of %d up on %s" % (rank, size, socket.gethostname()))
    start = time.monotonic()
    if SPEC["workload"] == "train":
        digest = train(rank, size, steps)
    else:
        digest = mix(rank, size, steps, pair)
    # Every rank finishes together: a rank leaving first shuts horovod_cpp down (atexit) while
    # ranks 0 and 1 may still run their last process-set allreduce (the campaign's first runs
    # found this race in the worker).
    hvd.barrier()
    say("rank %d OK %.10g in %.2f s" % (rank, digest, time.monotonic() - start))
    return digest


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
