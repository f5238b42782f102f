"""Launcher tests (hvdrun and HorovodRunner on a real local SparkSession). They run in one
ordinary process, not under mpirun: the code under test starts mpirun itself.

This process becomes a child subreaper, so a rank, daemon or mpirun that a test orphans is
re-parented here, and ``no_stray_processes`` (after every test) finds it.
"""
import ctypes
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytest_deadline import deadline, descendants  # noqa: E402,F401

_PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

_OURS = ("horovod_cpp.job.rank_main", "horovod_cpp.spark.rsh_agent",
         "horovod_cpp.job.task_exec", "gloo_worker.py")
_LAUNCHERS = ("mpirun", "orted", "mpiexec", "orterun")


def _describe(pid):
    """The command line of a live (not zombie) process, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return None
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        return None


def stray_processes():
    """Our launcher processes still alive below this process."""
    stray = []
    for pid in descendants(os.getpid()):
        cmd = _describe(pid)
        if not cmd:
            continue
        argv0 = os.path.basename(cmd.split(" ", 1)[0])
        if argv0 in _LAUNCHERS or any(marker in cmd for marker in _OURS):
            stray.append("%d: %s" % (pid, cmd[:200]))
    return stray


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    deadline_at = time.monotonic() + 10
    stray = stray_processes()
    while stray and time.monotonic() < deadline_at:
        time.sleep(0.2)
        stray = stray_processes()
    assert not stray, "processes left running after the test:\n" + "\n".join(stray)


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession with 4 task slots (barrier mode needs a slot per rank)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need torch and horovod_cpp
    # A local session on loopback: Spark then never resolves this machine's hostname (which a
    # minimal machine or container may not be able to).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.appName("horovod_cpp tests").master("local[4]")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.python.worker.reuse", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
