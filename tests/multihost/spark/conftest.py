"""HorovodRunner and horovod_cpp.spark.run on a Spark standalone cluster made of test-bed hosts
(scripts/testbed.sh spark up): the master on hvd-h1, a worker with 2 cores on hvd-h2 and
hvd-h3. These tests run on hvd-h1, the driver's host, as a notebook on a cluster's driver
node would; tests/multihost/run.sh starts them there.

After every test no launcher process (mpirun, orted, a rank, the rsh agent) may be left on any
test host, and the application may have no stage running.
"""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pytest_deadline import deadline  # noqa: E402,F401

MASTER = os.environ.get("HVD_SPARK_MASTER", "")
TESTBED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts",
                       "testbed.sh")
HOSTS = ("hvd-h1", "hvd-h2", "hvd-h3")
WORKERS = ("hvd-h2", "hvd-h3")
_LAUNCHER = ("orted", "mpirun", "orterun", "horovod_cpp.job.rank_main",
             "horovod_cpp.spark.rsh_agent")


def run_testbed(*args, check=True):
    return subprocess.run([TESTBED] + list(args), check=check, capture_output=True, text=True,
                          timeout=120)


def host_processes(host):
    """[(pid, command line)] of the live processes in a test host's network namespace."""
    out = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout
    procs = []
    for pid in out.split():
        try:
            with open("/proc/%s/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        procs.append((int(pid), cmd))
    return procs


def launcher_processes(hosts=HOSTS):
    """Launcher processes of ours still alive on ``hosts``: 'host: pid command'."""
    stray = []
    for host in hosts:
        for pid, cmd in host_processes(host):
            argv0 = os.path.basename(cmd.split(" ", 1)[0]) if cmd else ""
            if argv0 in _LAUNCHER or any(m in cmd for m in _LAUNCHER[3:]):
                stray.append("%s: %d %s" % (host, pid, cmd[:160]))
    return stray


def wait_until(predicate, limit, step=0.2):
    deadline_at = time.monotonic() + limit
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline_at:
            return value
        time.sleep(step)


def wait_no_launchers(hosts=HOSTS, limit=20):
    """[] once no launcher process is left on ``hosts`` (within ``limit`` s), else the list."""
    left = []

    def none_left():
        left[:] = launcher_processes(hosts)
        return not left
    wait_until(none_left, limit)
    return left


def start_session(name, **conf):
    """A SparkSession of the cluster, once both workers' executors have registered."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors need torch and horovod_cpp
    os.environ.pop("SPARK_LOCAL_IP", None)  # the driver binds to hvd-h1's address, not loopback
    builder = (SparkSession.builder.appName(name).master(MASTER)
               .config("spark.ui.enabled", "false")
               .config("spark.executor.memory", "768m")
               .config("spark.driver.memory", "768m"))
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    wait_executors(session.sparkContext, 2)
    return session


def wait_executors(sc, n, limit=120):
    def registered():
        return sc._jsc.sc().getExecutorMemoryStatus().size() - 1 >= n  # less the driver
    assert wait_until(registered, limit, 0.5), "the cluster's %d executors did not register" % n


@pytest.fixture(autouse=True)
def nothing_left_behind(request):
    yield
    left = wait_no_launchers()
    assert not left, "launcher processes left on the test hosts:\n" + "\n".join(left)
    session = request.node.funcargs.get("cluster")
    if session is not None:
        tracker = session.sparkContext.statusTracker()
        assert wait_until(lambda: not tracker.getActiveStageIds(), 30), \
            "Spark stages still running after the test: %s" % tracker.getActiveStageIds()
