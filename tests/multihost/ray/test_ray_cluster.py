"""horovod_cpp.ray.RayExecutor on a Ray cluster spread over the test bed's hosts (scripts/
testbed.sh ray up: the head on hvd-h1, this driver's host, with no CPUs; a node with 2 CPUs on
hvd-h2 and hvd-h3). Run on hvd-h1 by tests/multihost/run.sh, with HVD_RAY_ADDRESS and
HVD_RAY_TOKEN_FILE set. Workers on both worker hosts with consecutive ranks per host, the
num_hosts placement, a worker's exception, too few CPUs, and (last: they damage the cluster) a
worker host's processes killed in the middle of a run, and in the middle of an elastic job
(ElasticRayExecutor), which shrinks to the other host and grows back when the node restarts."""
import os
import socket
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest

# Ray reads its authentication settings when it is imported. The token stays in this process's
# environment (never on a command line, where ps would show it).
if os.environ.get("HVD_RAY_TOKEN_FILE"):  # (the driver; not a worker unpickling a function)
    with open(os.environ["HVD_RAY_TOKEN_FILE"]) as _f:
        os.environ["RAY_AUTH_TOKEN"] = _f.read().strip()
    os.environ["RAY_AUTH_MODE"] = "token"
import ray  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pytest_deadline import deadline  # noqa: E402,F401
from horovod_cpp.job.service import HorovodRunnerError, RankError  # noqa: E402
from horovod_cpp.ray import ElasticRayExecutor, RayExecutor  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.deadline(240)
TESTBED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts",
                       "testbed.sh")


@pytest.fixture(scope="module")
def cluster():
    ray.init(address=os.environ["HVD_RAY_ADDRESS"], logging_level="ERROR")
    # (A node that was just restarted: its dead predecessor counts until the head's health
    # checks drop it, ~30 s.)
    deadline_at = time.monotonic() + 90
    while ray.cluster_resources().get("CPU", 0) != 4 and time.monotonic() < deadline_at:
        time.sleep(0.5)
    assert ray.cluster_resources().get("CPU", 0) == 4, ray.cluster_resources()
    yield
    ray.shutdown()


def started(**kw):
    e = RayExecutor(RayExecutor.create_settings(timeout_s=10, placement_group_timeout_s=30), **kw)
    e.start()
    return e


def where_and_sum():
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    out = (hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
           socket.gethostname(), total)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("placement", [{"num_workers": 4},
                                       {"num_hosts": 2, "num_workers_per_host": 2}])
def test_four_workers_two_on_each_worker_host(cluster, placement):
    e = started(**placement)
    try:
        results = e.run(where_and_sum)
    finally:
        e.shutdown()
    assert [r[:5] for r in results] == [(0, 0, 2, 0, 2), (1, 1, 2, 0, 2), (2, 0, 2, 1, 2),
                                        (3, 1, 2, 1, 2)]
    hosts = [r[5] for r in results]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2]
    assert sorted(set(hosts)) == ["hvd-h2", "hvd-h3"]
    assert all(r[6] == 10.0 for r in results)


def raise_on_rank_2():
    if int(os.environ["HOROVOD_RANK"]) == 2:
        raise ValueError("bad batch on %s" % socket.gethostname())
    return 0


def test_a_workers_exception_reaches_the_driver(cluster):
    e = started(num_workers=4)
    try:
        # Which worker host gets ranks 2 and 3 is Ray's choice (PACK): ask the same workers.
        hosts = [r[5] for r in e.run(where_and_sum)]
        with pytest.raises(RankError) as info:
            e.run(raise_on_rank_2)
    finally:
        e.shutdown()
    assert hosts[2] in ("hvd-h2", "hvd-h3")
    assert info.value.rank == 2 and "bad batch on %s" % hosts[2] in str(info.value)


def test_more_workers_than_the_cluster_has_cpus(cluster):
    with pytest.raises(ValueError, match="need 6 CPUs; the Ray cluster has 4"):
        RayExecutor(RayExecutor.create_settings(), num_workers=6).start()


def allreduce_for(seconds):
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        hvd.allreduce(torch.ones(1000), name="grad")
        steps += 1
        time.sleep(0.01)
    return steps


@pytest.mark.deadline(300)
def test_a_worker_host_killed_mid_run_is_named(cluster):
    # Every process of hvd-h3 killed (its Ray node and the 2 workers there) while the 4 ranks
    # allreduce: run() raises naming a rank on hvd-h3, well before the run would have ended.
    e = started(num_workers=4)
    outcome = {}

    def go():
        try:
            outcome["value"] = e.run(allreduce_for, args=[120])
        except BaseException as err:
            outcome["error"] = err
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    try:
        time.sleep(5)
        assert thread.is_alive(), outcome
        killed_at = time.monotonic()
        subprocess.run([TESTBED, "kill", "hvd-h3"], check=True, timeout=60)
        thread.join(90)
        assert not thread.is_alive(), "run() did not return after hvd-h3 was killed"
    finally:
        e.shutdown()
        subprocess.run([TESTBED, "ray", "node", "hvd-h3"], check=False, timeout=120)
    error = outcome.get("error")
    assert isinstance(error, HorovodRunnerError), outcome
    assert "on node hvd-h3" in str(error) and "died" in str(error), str(error)
    took = outcome["at"] - killed_at
    assert took < 60, took
    print("\nray: hvd-h3 killed mid-run: run() raised %.1f s later: %s" % (took, error))


def train_until(flag):
    """Elastic training until the driver's test creates ``flag``: each step allreduces every
    rank's 1 (it must come to the round's size) and whether the flag exists (so every rank
    stops at the same step), and commits; rank 0 writes "size step" to ``flag``.progress.
    Returns (rank, size, step, the sizes seen, host)."""
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(step=0, sizes=[])

    @hvd.elastic.run
    def train(state):
        while True:
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes = state.sizes + [hvd.size()]
            count = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="count").item()
            assert count == hvd.size(), (count, hvd.size())
            stop = hvd.allreduce(torch.tensor([float(os.path.exists(flag))]), op=hvd.Max,
                                 name="stop").item()
            if stop:
                return
            state.step += 1
            if hvd.rank() == 0:
                with open(flag + ".tmp", "w") as f:
                    f.write("%d %d" % (hvd.size(), state.step))
                os.replace(flag + ".tmp", flag + ".progress")
            time.sleep(0.05)
            state.commit()

    train(state)
    return hvd.rank(), hvd.size(), state.step, state.sizes, socket.gethostname()


def wait_for(what, test, seconds):
    deadline_at = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline_at, "not within %g s: %s" % (seconds, what)
        time.sleep(0.2)


@pytest.mark.deadline(400)
def test_an_elastic_job_shrinks_when_a_node_dies_and_grows_when_it_returns(cluster, tmp_path):
    # After the test above: hvd-h3's restarted node counts once its dead predecessor is gone.
    wait_for("4 CPUs in the cluster", lambda: ray.cluster_resources().get("CPU", 0) == 4, 90)
    e = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=2, max_np=4, timeout_s=10,
                                                               elastic_timeout=120))
    e.start()
    flag = str(tmp_path / "stop")  # (one file system: the test hosts share this machine's)
    outcome = {}

    def go():
        try:
            outcome["value"] = e.run(train_until, kwargs={"flag": flag})
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    def training(size, after=0):  # rank 0 reports steps past ``after`` at ``size`` ranks
        try:
            with open(flag + ".progress") as f:
                now_size, step = map(int, f.read().split())
        except (OSError, ValueError):
            return None
        return step if now_size == size and step > after else None

    try:
        wait_for("training at 4 ranks", lambda: training(4, 5), 120)
        killed_at = time.monotonic()
        subprocess.run([TESTBED, "kill", "hvd-h3"], check=True, timeout=60)
        wait_for("training at 2 ranks after hvd-h3 was killed", lambda: training(2), 60)
        shrunk = time.monotonic() - killed_at
        base = training(2)
        wait_for("training on at 2 ranks", lambda: training(2, base + 5), 30)
        restarted_at = time.monotonic()
        subprocess.run([TESTBED, "ray", "node", "hvd-h3"], check=True, timeout=120)
        wait_for("training at 4 ranks after hvd-h3's node restarted", lambda: training(4), 120)
        grew = time.monotonic() - restarted_at
        base = training(4)
        wait_for("training on at 4 ranks", lambda: training(4, base + 5), 30)
        open(flag, "w").close()
        thread.join(60)
        assert not thread.is_alive(), "run() did not return after the flag"
    finally:
        open(flag, "w").close()
        thread.join(30)
    assert "error" not in outcome, outcome["error"]
    results = outcome["value"]
    assert [r[:2] for r in results] == [(r, 4) for r in range(4)]
    assert len({r[2] for r in results}) == 1 and results[0][2] > 0  # the same step everywhere
    assert all(r[3] == [4, 2, 4] for r in results), results  # no restart from scratch
    assert sorted(r[4] for r in results) == ["hvd-h2", "hvd-h2", "hvd-h3", "hvd-h3"]
    # The rounds: 4 ranks, 2, 4. (The survivors may ask for a reset before Ray reports the
    # killed workers dead: then a round of 4 forms first, and fails to as the deaths arrive.)
    rounds = [len(ids) for _, ids, _ in e.history]
    assert [n for i, n in enumerate(rounds) if i == 0 or rounds[i - 1] != n] == [4, 2, 4], \
        e.history
    print("\nray elastic: hvd-h3 killed: 2 ranks %.1f s later; its node restarted: 4 ranks "
          "%.1f s after the restart began; %d steps" % (shrunk, grew, results[0][2]))
