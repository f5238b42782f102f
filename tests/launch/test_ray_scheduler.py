"""The goodput scheduler (horovod_cpp.ray.scheduler) on a real local Ray cluster (4 CPUs): a job
alone grows into the free slots as its goodput hints arrive and shrinks for a newcomer at a
commit, with no step lost and no slot used twice; queueing, cancelling, a failing job and bad
submissions; the CLI (submit, status, wait, cancel) against the same scheduler actor. Across
the test bed's hosts (Poisson arrivals, a host killed): tests/multihost/ray."""
import json
import os
import statistics
import subprocess
import sys
import time

import cloudpickle
import pytest
import ray

from horovod_cpp import _import_core
from horovod_cpp.ray.scheduler import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Scheduler, \
    SchedulerError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "scheduling"))
import jobs  # noqa: E402

cloudpickle.register_pickle_by_value(jobs)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.deadline(300),
              pytest.mark.skipif(not _import_core().gloo_built(), reason="built without Gloo")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR",
             namespace="horovod_cpp", _temp_dir=str(tmp_path_factory.mktemp("ray")),
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def sched(cluster):
    made = []

    def make(**options):
        options.setdefault("name", "sched-%d" % len(made))
        s = Scheduler(**options)
        made.append(s)
        return s
    yield make
    for s in made:
        s.shutdown()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("not within %g s: %s" % (timeout, what))


@pytest.mark.deadline(900)  # (under load, 4 ranks on this machine's 2 cores start slowly)
def test_a_job_grows_alone_and_shrinks_for_a_newcomer_without_losing_a_step(sched, tmp_path):
    # (No timed re-plans in the test: the job must grow when its hints arrive, young as it is.)
    s = sched(interval=600, drain_seconds=60, timeout_s=30)
    stop = str(tmp_path / "stop-a")  # (job a runs until b is done: its length is not a guess)
    a = s.submit(jobs.train_job, kwargs=dict(target=10 ** 9, seed=1, sample_delay=5e-4,
                                             stop_file=stop), min_np=1, name="a")
    # Alone, it starts at 1 slot (no model yet), and grows (to at most twice what it has
    # measured) as its hints arrive. (No max_np: the slots there are bound it, not the one it
    # started on.)
    wait_for(lambda: s.status(a)["ranks"] == 4, 400, "job a grows to the 4 slots")
    b = s.submit(jobs.train_job, kwargs=dict(target=500, seed=2, sample_delay=5e-4),
                 min_np=1, max_np=4, name="b")
    rb = s.wait(b, timeout=400)
    open(stop, "w").close()
    ra = s.wait(a, timeout=300)
    for result in (ra, rb):
        assert len({(r["steps"], r["progress"]) for r in result}) == 1, result
    a_sizes = ra[0]["sizes"]
    assert 4 in a_sizes and a_sizes.index(4) < len(a_sizes) - 1, a_sizes  # grew, then shrank
    assert ra[0]["lost_steps"] == 0 and rb[0]["lost_steps"] == 0, (ra[0], rb[0])
    assert rb[0]["progress"] >= 500 and ra[0]["progress"] > 0
    status = {j["name"]: j for j in s.status()}
    assert status["a"]["restarts"] >= 2 and status["b"]["state"] == "SUCCEEDED"
    info = s.cluster()
    slots = info["nodes"]
    for _, live in info["trace"]:  # never more live workers on a node than it has slots
        for node in slots:
            assert sum(c.get(node, 0) for c in live.values()) <= slots[node], live
    for _, plan, took in info["plans"]:
        for node in slots:
            assert sum(c.get(node, 0) for c in plan.values()) <= slots[node], plan
        assert took < 1.0
    # The restart cost: how long the changes took to come into effect, measured (job a's
    # growth and shrink at least: plan to round, > 0).
    settled = info["settle_seconds"]
    assert len(settled) >= 2 and all(t > 0 for t in settled), settled
    assert info["restart_cost"] == statistics.median(settled[-20:])


def boom():
    import horovod_cpp.torch as hvd
    hvd.init()
    raise ValueError("bad batch on rank %d" % hvd.rank())


@pytest.mark.deadline(600)  # (under load a worker's process takes long to start)
def test_queue_cancel_failure_and_bad_submissions(sched):
    s = sched(interval=60, drain_seconds=10, timeout_s=30, elastic_timeout=120)
    long_job = dict(target=10 ** 6, seed=3, sample_delay=1e-3)
    x = s.submit(jobs.train_job, kwargs=long_job, min_np=3, max_np=3, name="x")
    wait_for(lambda: s.status(x)["state"] == RUNNING, 120, "x runs")
    y = s.submit(jobs.train_job, kwargs=long_job, min_np=3, max_np=3, name="y")
    time.sleep(3)
    assert s.status(y)["state"] == QUEUED and s.status(y)["np"] == 0  # 3 + 3 > 4 slots
    assert s.cancel(y) == CANCELLED and s.status(y)["state"] == CANCELLED
    assert s.cancel(x) == CANCELLED
    with pytest.raises(SchedulerError, match="cancelled"):
        s.wait(x, timeout=120)
    f = s.submit(boom, min_np=1, max_np=2, name="f")
    with pytest.raises(SchedulerError, match="bad batch on rank"):
        s.wait(f, timeout=240)
    assert s.status(f)["state"] == FAILED
    # A job's exception is not its node's fault: the node stays in every other job's plan
    # (only a node where a worker died sits out).
    time.sleep(2)
    assert sum(s.cluster()["nodes"].values()) == 4, s.cluster()["nodes"]
    with pytest.raises(ValueError, match="min_np"):
        s.submit(boom, min_np=0)
    with pytest.raises(ValueError, match="min_np <= max_np"):
        s.submit(boom, min_np=3, max_np=2)
    with pytest.raises(KeyError, match="no job"):
        s.status("nosuchjob")
    wait_for(lambda: not any(j["np"] for j in s.status()), 120, "every slot is released")


SCRIPT = """
import sys
sys.path.insert(0, %r)
import jobs
result = jobs.train_job(float(sys.argv[1]), seed=4)
"""


@pytest.mark.deadline(600)
def test_the_cli_submits_waits_and_reports_status(sched, cluster, tmp_path):
    sched(name="horovod_cpp_scheduler", interval=60)  # (the CLI's default name)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT % os.path.join(ROOT, "examples", "scheduling"))
    cli = [sys.executable, "-m", "horovod_cpp.ray.scheduler", "--address", cluster]
    out = subprocess.run(cli + ["submit", "--min-np", "1", "--max-np", "2", str(script), "200"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().splitlines()[-1]
    out = subprocess.run(cli + ["wait", job, "--timeout", "300"], capture_output=True, text=True,
                         timeout=360)
    assert out.returncode == 0 and "SUCCEEDED" in out.stdout, out.stdout + out.stderr
    out = subprocess.run(cli + ["status", job], capture_output=True, text=True, timeout=120)
    status = json.loads(out.stdout[out.stdout.index("{"):])
    assert status["state"] == "SUCCEEDED" and status["name"] == "job.py"
    out = subprocess.run(cli + ["cancel", "nosuchjob"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "no job" in out.stderr


def add_job(core, name, state, allocation, min_np=1, max_np=None, **fields):
    """A job in ``core``'s table as the loop would have it (no Ray: the Ray-free tests)."""
    from horovod_cpp.ray.scheduler import _Job
    j = _Job(name, name, None, (), {}, min_np, max_np, {})
    j.state, j.allocation = state, list(allocation)
    for k, v in fields.items():
        setattr(j, k, v)
    core.jobs[name] = j
    return j


def test_fcfs_gives_a_running_job_that_lost_a_node_the_next_free_slot_first():
    """The baseline's plan (no Ray needed): a running job whose node died keeps its live
    slots and takes the next free one before any queued job (it is ahead of them), and a
    queued job that does not fit holds back the ones behind it."""
    from horovod_cpp.ray.scheduler import SchedulerCore
    core = SchedulerCore(policy="fcfs", verbose=0)
    core.nodes = {"a": 2, "b": 2, "c": 2}
    j1 = add_job(core, "j1", RUNNING, ["a", "c"], 2, 2)
    j2 = add_job(core, "j2", RUNNING, ["b", "b"], 2, 2)
    j3 = add_job(core, "j3", QUEUED, [], 1, 1)
    j4 = add_job(core, "j4", QUEUED, [], 2, 2)
    del core.nodes["c"]  # c died: j1 has 1 of its 2, and a has 1 free slot
    core._plan()
    assert j1.allocation == ["a", "a"] and j2.allocation == ["b", "b"]
    assert j3.allocation == [] and j4.allocation == []
    core.nodes["c"] = 2  # c back: j3 (1 slot) starts; j4 (2) does not fit in what is left
    core._plan()
    assert j3.allocation == ["c"] and j4.allocation == []
    j3.state = RUNNING  # (what _start_queued does after a plan)
    j2.state, j2.allocation = SUCCEEDED, []  # b free: j4 starts there
    core._plan()
    assert j4.allocation == ["b", "b"] and j1.allocation == ["a", "a"]


def test_a_job_that_lost_every_slot_does_not_take_one_from_a_job_still_training():
    """The goodput plan (no Ray needed) when the running jobs' minimums do not fit after a
    node died: a job whose every slot was on it has no state left and waits, as a queued job
    does; it does not take the slot of a job that still trains (which would lose its state),
    whatever their attained service. When a slot frees, it gets it."""
    from horovod_cpp.ray.scheduler import SchedulerCore
    core = SchedulerCore(verbose=0)
    for attained in (0.0, 500.0):  # (the one left without slots has less service, or more)
        core.jobs.clear()
        core.nodes = {"a": 1, "b": 1}
        trains = add_job(core, "trains", RUNNING, ["a"], 1, 1, attained=100.0,
                         submitted=time.time() - 100)
        lost = add_job(core, "lost", RUNNING, ["b"], 1, 1, attained=attained,
                       submitted=time.time() - 100)
        del core.nodes["b"]
        core._plan()
        assert trains.allocation == ["a"] and lost.allocation == [], attained
        core._plan()  # (and again, from where it is now)
        assert trains.allocation == ["a"] and lost.allocation == [], attained
        trains.state, trains.allocation = SUCCEEDED, []
        core._plan()
        assert lost.allocation == ["a"]


def test_a_job_is_not_replanned_while_its_last_change_comes_into_effect():
    """The goodput plan (no Ray needed): a job whose last change is still coming into effect
    (its workers starting or draining) keeps its slots when a newcomer arrives; once the change
    is in effect (or SETTLE_LIMIT passed), the next plan shares the slots."""
    from horovod_cpp.ray import scheduler
    core = scheduler.SchedulerCore(verbose=0)
    core.nodes = {"a": 2}
    old = add_job(core, "old", RUNNING, ["a", "a"], submitted=time.time() - 100,
                  settling=(time.monotonic(), 2, 0))  # (grew to 2 a moment ago: not in effect)
    new = add_job(core, "new", QUEUED, [])
    core._plan()
    assert old.allocation == ["a", "a"] and new.allocation == []
    old.settling = (time.monotonic() - scheduler.SETTLE_LIMIT - 1, 2, 0)  # (too long: moves)
    core._plan()
    assert old.allocation == ["a"] and new.allocation == ["a"]
