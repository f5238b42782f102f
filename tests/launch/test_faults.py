"""Fault injection under real mpirun jobs: whatever goes wrong on one rank, the job ends
(never hangs), its exit status is non-zero, and the output says which rank and why.

Each case runs the job with a hard timeout well under the test's own deadline; the 30 s bound
on how long survivors may linger after a fault is a hang bound, not a speed target.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fault_worker.py")
HVDRUN = [sys.executable, "-m", "horovod_cpp.runner"]
LINGER_S = 30  # survivors must be gone this long after the fault at the latest


def line_of(code):
    """The line of fault_worker.py that holds `code`."""
    with open(WORKER) as f:
        return next(i for i, line in enumerate(f, 1) if code in line)


def mpirun(np, args, env=None, timeout=90):
    cmd = [shutil.which("mpirun"), "-np", str(np), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    for name, value in (env or {}).items():
        cmd += ["-x", "%s=%s" % (name, value)]
    cmd += [sys.executable, WORKER] + args
    return run(cmd, timeout)


def run(cmd, timeout):
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       start_new_session=True)
    return r, time.monotonic() - start


@pytest.mark.parametrize("np,victim", [(2, 1), (3, 2), (4, 0)])
def test_rank_killed_mid_allreduces_ends_the_job_naming_it(np, victim):
    r, elapsed = mpirun(np, ["kill", str(victim), "200"])
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank %d: killing myself" % victim in out
    assert "step 150" in out  # the job was running collectives when the rank died
    assert ("process rank %d with PID" % victim in out and "exited on signal 9 (Killed)" in out), out
    # Startup (imports) takes a few seconds per rank here; the rest is how long survivors
    # lingered after the kill.
    assert elapsed < LINGER_S + 30, "job took %.1f s after a rank was killed" % elapsed


@pytest.mark.parametrize("np,victim", [(2, 1), (3, 0)])
def test_frozen_rank_ends_the_job_by_the_collective_timeout_naming_it(np, victim):
    # A stopped process keeps its sockets: MPI and the watchdog's probe connect but nothing
    # answers, as with a hung host. The others time out after 3 s, find it silent for the
    # 5 s probe, and MPI_Abort; mpirun then ends every rank, the frozen one included.
    r, elapsed = mpirun(np, ["stop", str(victim), "60"],
                        env={"HOROVOD_COLLECTIVE_TIMEOUT_SECONDS": "3"})
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank %d: stopping myself" % victim in out
    survivor = 1 if victim == 0 else 0
    assert "collective timeout: rank %d (%s) has waited" % (survivor, socket.gethostname()) in out
    assert "longer than HOROVOD_COLLECTIVE_TIMEOUT_SECONDS=3" in out, out
    assert "no answer within 5 s from rank %d on host %s" % (victim, socket.gethostname()) in out
    assert "this rank waits for allreduce 'allreduce.grad." in out, out
    # ... and the line of the worker's hvd.allreduce it is blocked in.
    assert re.search(r"waits for allreduce 'allreduce\.grad\.\d' on process set 0 called at %s:%d"
                     % (re.escape(WORKER), line_of("hvd.allreduce(x, name=\"grad.")), out), out
    # (Open MPI's own "MPI_ABORT was invoked" notice is not asserted: when two ranks abort at
    # once, mpirun sometimes fails to print it, "ORTE_ERROR_LOG: Data unpack would read past
    # end of buffer in show_help.c".)
    # Startup, 3 s of timeout, 5 s of probe; the rest is a hang bound.
    assert elapsed < LINGER_S + 30, "job took %.1f s after a rank froze" % elapsed


def _ccl_built():
    import horovod_cpp.torch as hvd
    return hvd.ccl_built()


@pytest.mark.skipif(not _ccl_built(), reason="this build has no oneCCL")
def test_rank_killed_mid_allreduces_on_oneccl_ends_the_job_naming_it():
    r, elapsed = mpirun(3, ["kill", "2", "200"], env={"HOROVOD_CPU_OPERATIONS": "ccl"})
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank 2: killing myself" in out and "step 150" in out, out
    assert "process rank 2 with PID" in out and "exited on signal 9 (Killed)" in out, out
    assert elapsed < LINGER_S + 30, "job took %.1f s after a rank was killed" % elapsed


@pytest.mark.skipif(not _ccl_built(), reason="this build has no oneCCL")
def test_oneccl_rank_killed_inside_a_collective_is_ended_by_the_collective_timeout():
    # A oneCCL collective cannot be interrupted and does not notice a dead peer: the survivors
    # wait inside it until the collective watchdog (3 s here) probes the peers, names the
    # silent one, and ends the job through the controller (Gloo: each survivor exits).
    env = dict(os.environ, HOROVOD_COLLECTIVE_TIMEOUT_SECONDS="3")
    start = time.monotonic()
    # (2 ranks: one survivor, and a rank per core.)
    r = subprocess.run(HVDRUN + ["--gloo", "--cpu-operations", "ccl", "-np", "2", sys.executable,
                                 WORKER, "killbig", "1", "3"], capture_output=True, text=True,
                       timeout=120, env=env, start_new_session=True)
    elapsed = time.monotonic() - start
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank 1: killing myself inside a collective" in out and "step 2" in out, out
    assert "hvdrun: rank 1 (on localhost) ended with signal 9 (SIGKILL)" in out, out
    assert "longer than HOROVOD_COLLECTIVE_TIMEOUT_SECONDS=3" in out, out
    assert "no answer within 5 s from rank 1 on host" in out, out
    assert "waited 3 s in allreduce of 'allreduce.big.3'" in out, out
    assert elapsed < LINGER_S + 30, "job took %.1f s after a rank was killed" % elapsed


def test_rank_killed_through_hvdrun_names_the_rank_and_exits_137():
    r, _ = run(HVDRUN + ["-np", "3", sys.executable, WORKER, "kill", "1", "100"], timeout=90)
    out = r.stdout + r.stderr
    assert r.returncode == 137, out
    assert "hvdrun: mpirun exited with exit code 137: rank 1 exited with signal 9 (Killed)" in out


@pytest.mark.parametrize("np,victim", [(2, 0), (3, 1)])
def test_python_exception_on_one_rank_ends_the_job_non_zero(np, victim):
    r, elapsed = mpirun(np, ["raise", str(victim), "120"])
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "RuntimeError: rank %d: injected failure at step 120" % victim in out, out
    assert "step 100" in out
    assert elapsed < LINGER_S + 30, "job took %.1f s after the exception" % elapsed


def test_rank_that_never_submits_is_reported_then_shuts_the_job_down():
    r, elapsed = mpirun(3, ["stall", "2"], env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                                                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "waiting for remainder of ranks for more than 1 seconds" in out, out
    assert "2: [allreduce.stalled.tensor]" in out, out  # names as horovod.torch forms them
    # Where the ranks that did submit it called from.
    assert "Submitted at:\nallreduce.stalled.tensor: ranks 0, 1 at %s:%d" % (
        WORKER, line_of("hvd.allreduce(torch.ones(4), name=\"stalled.tensor\")")) in out, out
    assert "is stalled for longer than 3 seconds. Will shutdown." in out, out
    # The survivors' allreduce fails with the reason rather than hanging.
    assert "HorovodInternalError" in out and "stall" in out, out
    assert elapsed < 60, "job took %.1f s" % elapsed
