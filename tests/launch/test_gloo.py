"""The Gloo backend and hvdrun --gloo: placement, the rendezvous store's authentication, real
jobs on this host (results against hand-computed sums), a killed rank, and clear errors for a
rank started without a launcher or with contradicting backend settings."""
import os
import re
import subprocess
import sys

import pytest

from horovod_cpp import _core
from horovod_cpp.runner import gloo_run
from horovod_cpp.job.rendezvous import RendezvousClient, RendezvousServer

pytestmark = pytest.mark.skipif(not _core.gloo_built(), reason="built without Gloo")

HERE = os.path.dirname(os.path.abspath(__file__))
HVDRUN = [sys.executable, "-m", "horovod_cpp.runner"]


def run(args, env=None, timeout=120):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=HERE)


def lines_of(out, rank):
    tag = "[%d]<stdout>:" % rank
    return [l[len(tag):] for l in out.splitlines() if l.startswith(tag)]


def test_placement_fills_hosts_in_order():
    # (rank, host, local_rank, local_size, cross_rank, cross_size)
    assert gloo_run.assign([("a", 2), ("b", 2)], 3) == [
        (0, "a", 0, 2, 0, 2), (1, "a", 1, 2, 0, 1), (2, "b", 0, 1, 1, 2)]
    assert gloo_run.assign([("a", 1), ("b", 1)], 4) == [  # oversubscribed: round again
        (0, "a", 0, 2, 0, 2), (1, "a", 1, 2, 0, 2), (2, "b", 0, 2, 1, 2), (3, "b", 1, 2, 1, 2)]


def test_store_refuses_a_wrong_secret_and_serves_the_right_one():
    server = RendezvousServer("right", bind="127.0.0.1")
    try:
        with pytest.raises(ConnectionError):
            RendezvousClient("127.0.0.1", server.port, "wrong").set("k", b"v")
        assert server.get("k") is None and server.refused == 1
        client = RendezvousClient("127.0.0.1", server.port, "right")
        assert client.get("k") is None
        client.set("k", b"\x00value")
        assert client.get("k") == b"\x00value" and server.get("k") == b"\x00value"
        assert client.wait("absent", 0.05) is None
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("np", [2, 3, 4])
def test_hvdrun_gloo_runs_a_job(np):
    r = run(HVDRUN + ["--gloo", "-np", str(np), sys.executable, "gloo_worker.py", "sum"])
    assert r.returncode == 0, r.stdout + r.stderr
    total = float(sum(range(1, np + 1)))
    for rank in range(np):
        assert lines_of(r.stdout, rank) == [
            "rank %d size %d local %d/%d cross 0/1 gloo True sum %s"
            % (rank, np, rank, np, [total] * 3)], r.stdout
    assert "mpirun" not in r.stderr


def test_a_killed_rank_fails_the_others_at_once():
    r = run(HVDRUN + ["--gloo", "-np", "3", sys.executable, "gloo_worker.py", "die"])
    assert r.returncode == 137, r.stdout + r.stderr  # the first failure: rank 1's SIGKILL
    assert "hvdrun: rank 1 (on localhost) ended with signal 9 (SIGKILL)" in r.stderr
    for rank in (0, 2):
        (line,) = lines_of(r.stdout, rank)
        assert line.startswith("rank %d: HorovodInternalError after " % rank), line
        # The vote and small collectives go over the control mesh, larger ones over Gloo:
        # either names the lost peer's connection.
        assert re.search(r"control mesh .* with rank 1 failed: (the connection was closed|"
                         r"Connection reset by peer)|Gloo .* failed: .*Connection (closed|reset) "
                         r"by peer", line), line
        assert float(line.split(" after ")[1].split(" s")[0]) < 10, line


def test_dry_run_prints_each_rank():
    r = run(HVDRUN + ["--gloo", "--dry-run", "-np", "2", "-H", "localhost:2", "true"])
    assert r.returncode == 0, r.stderr
    assert "hvdrun: rank 0 on localhost: true" in r.stderr
    assert "hvdrun: rank 1 on localhost: true" in r.stderr


def test_rank_without_launcher_and_contradicting_settings_are_clear_errors():
    code = "import horovod_cpp.torch as hvd\ntry:\n    hvd.init()\nexcept Exception as e:\n" \
           "    print(type(e).__name__, e)\n"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_"))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(clean, HOROVOD_CONTROLLER="gloo"))
    assert "the Gloo backend needs HOROVOD_RANK" in r.stdout and "hvdrun --gloo" in r.stdout, \
        r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(clean, HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="mpi"))
    assert ("HOROVOD_CONTROLLER=gloo but HOROVOD_CPU_OPERATIONS=mpi: horovod_cpp runs the "
            "negotiation and the CPU collectives on one backend") in r.stdout, r.stdout + r.stderr


def test_wrong_secret_is_refused_by_the_store():
    server = RendezvousServer("the-secret", bind="127.0.0.1")
    try:
        code = "import horovod_cpp.torch as hvd\ntry:\n    hvd.init()\nexcept Exception as e:\n" \
               "    print(type(e).__name__, e)\n"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_"))}
        env.update(HOROVOD_CONTROLLER="gloo", HOROVOD_RANK="0", HOROVOD_SIZE="2",
                   HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
                   HOROVOD_GLOO_RENDEZVOUS_PORT=str(server.port), HOROVOD_GLOO_SECRET="guess",
                   HOROVOD_HOSTNAME="127.0.0.1")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, env=env)
        assert "HorovodInternalError" in r.stdout and "wrong HOROVOD_GLOO_SECRET" in r.stdout, \
            r.stdout + r.stderr
        assert server.refused >= 1 and server.keys() == []
    finally:
        server.stop()
