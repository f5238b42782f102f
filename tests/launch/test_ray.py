"""horovod_cpp.ray.RayExecutor on a real local Ray cluster (ray from PyPI, 4 CPUs): every
worker's value in rank order, collectives between the workers, execute/execute_single with an
executable class, several runs in one executor, a worker's exception with its traceback, a
worker that dies, too few CPUs, resources that stay busy, and nothing left after shutdown.
Elastic (ElasticRayExecutor, RayExecutor(min_workers=...)): the last round's values, a worker
that dies mid-run dropped while the others go on, a raising worker's node blacklisted, too few
slots. Across the test bed's hosts (a node killed and restarted: the job shrinks and grows
back): tests/multihost/ray."""
import os
import socket
import sys
import time

import cloudpickle
import pytest
import ray

from horovod_cpp import _import_core
from horovod_cpp.job.service import HorovodRunnerError, RankError
from horovod_cpp.ray import ElasticRayExecutor, RayExecutor

import elastic_counter
from elastic_counter import count_steps

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(elastic_counter)

pytestmark = [pytest.mark.deadline(240),
              pytest.mark.skipif(not _import_core().gloo_built(), reason="built without Gloo")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Ray's session files under pytest's temporary directory, not /tmp/ray.
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR",
             _temp_dir=str(tmp_path_factory.mktemp("ray")),
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    yield
    ray.shutdown()


@pytest.fixture
def executor(cluster):
    made = []

    def make(**kw):
        e = RayExecutor(RayExecutor.create_settings(timeout_s=20, placement_group_timeout_s=20),
                        **kw)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown()


def rank_sum(scale):
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    out = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), total * scale, os.getpid())
    hvd.shutdown()
    return out


def test_run_returns_every_workers_value_in_rank_order(executor):
    e = executor(num_workers=3)
    e.start()
    results = e.run(rank_sum, args=[10])
    assert [r[:5] for r in results] == [(r, 3, r, 3, 30.0) for r in range(3)]
    assert len({r[5] for r in results}) == 3 and os.getpid() not in {r[5] for r in results}
    # A second run in the same workers: a fresh rendezvous, the same answer.
    assert [r[:5] for r in e.run(rank_sum, kwargs={"scale": 1})] == [
        (r, 3, r, 3, 3.0) for r in range(3)]


class Counter(object):
    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += 1 + int(os.environ["HOROVOD_RANK"])
        return self.value


def test_execute_on_every_worker_and_on_rank_0(executor):
    e = executor(num_workers=2)
    e.start(executable_cls=Counter, executable_args=[100], extra_env_vars={"HVD_RAY_MARK": "x"})
    assert e.execute(lambda c: c.bump()) == [101, 102]
    assert e.execute(lambda c: (c.bump(), os.environ["HVD_RAY_MARK"])) == [(102, "x"), (104, "x")]
    assert e.execute_single(lambda c: c.bump()) == 103
    refs = e.run_remote(lambda: socket.gethostname())
    assert [v for _, v in ray.get(refs)] == [socket.gethostname()] * 2


def fail_on_rank_1():
    if int(os.environ["HOROVOD_RANK"]) == 1:
        raise KeyError("missing shard")
    return "fine"


def test_a_workers_exception_is_raised_with_its_rank_and_traceback(executor):
    e = executor(num_workers=2)
    e.start()
    with pytest.raises(RankError) as info:
        e.run(fail_on_rank_1)
    assert info.value.rank == 1 and info.value.exc_type == "KeyError"
    assert "in fail_on_rank_1" in info.value.remote_traceback
    assert isinstance(info.value.__cause__, KeyError)


def die_on_rank_1():
    if int(os.environ["HOROVOD_RANK"]) == 1:
        os._exit(7)
    return "fine"


def test_a_worker_that_dies_is_named(executor):
    e = executor(num_workers=2)
    e.start()
    with pytest.raises(HorovodRunnerError, match=r"rank 1 \(process \d+ on node .*\) died"):
        e.run(die_on_rank_1)


def test_too_few_cpus_and_busy_resources_are_clear_errors(executor):
    with pytest.raises(ValueError, match=r"5 workers x 1 CPUs need 5 CPUs; the Ray cluster has 4"):
        executor(num_workers=5).start()
    holder = executor(num_workers=3)
    holder.start()  # 3 of the 4 CPUs held: 2 more workers cannot start
    e = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=3), num_workers=2)
    with pytest.raises(TimeoutError, match="did not give the 2 workers their resources"):
        e.start()
    holder.shutdown()
    e.start()  # now they fit (their processes may take longer than 3 s to start: timeout_s)
    assert [r[1] for r in e.run(rank_sum, args=[1])] == [2, 2]
    e.shutdown()
    # Placed, but given no time to start their processes: a clear error, every CPU freed.
    late = RayExecutor(RayExecutor.create_settings(timeout_s=0), num_workers=2)
    with pytest.raises(TimeoutError, match=r"2 of the 2 workers had their resources but their "
                                           r"processes did not start within timeout_s=0 s"):
        late.start()
    assert not late.workers
    wait_for_free_cpus()


def test_arguments_and_elastic_are_refused_clearly():
    settings = RayExecutor.create_settings()
    with pytest.raises(ValueError, match="one of num_workers and num_hosts"):
        RayExecutor(settings)
    with pytest.raises(ValueError, match="only one of num_workers and num_hosts"):
        RayExecutor(settings, num_workers=2, num_hosts=2)
    with pytest.raises(ValueError, match="gpus_per_worker is set but use_gpu is False"):
        RayExecutor(settings, num_workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="num_workers/num_hosts and min_workers"):
        RayExecutor(settings, num_workers=2, min_workers=1)
    with pytest.raises(ValueError, match="need min_np <= max_np"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=3, max_np=2))
    with pytest.raises(ValueError, match="gpus_per_slot is set but use_gpu is False"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(), gpus_per_slot=1)
    with pytest.raises(RuntimeError, match="start"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings()).run(count_steps)
    with pytest.raises(RuntimeError, match="start"):
        RayExecutor(settings, num_workers=1).run(rank_sum, args=[1])


def test_shutdown_leaves_no_worker(executor):
    e = executor(num_workers=2)
    e.start()
    pids = [r[5] for r in e.run(rank_sum, args=[1])]
    e.shutdown()
    deadline = time.monotonic() + 20
    while any(os.path.exists("/proc/%d" % p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if os.path.exists("/proc/%d" % p)]
    wait_for_free_cpus(deadline)  # (the same 20 s for both)


def wait_for_free_cpus(deadline=None):
    """Every CPU of the local cluster free again by ``deadline`` (default: within 20 s)."""
    deadline = deadline or time.monotonic() + 20
    while ray.available_resources().get("CPU") != 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 4


# ---- elastic ---------------------------------------------------------------------------------

def elastic(**kw):
    e = ElasticRayExecutor(ElasticRayExecutor.create_settings(timeout_s=20, verbose=0, **kw))
    e.start()
    return e


def test_elastic_every_rank_of_the_last_round_reports(cluster):
    # 4 slots of 1 CPU on the one node; max_np 3 of them.
    e = elastic(min_np=2, max_np=3)
    results = e.run(count_steps)
    assert [r[:4] for r in results] == [(r, 3, 25, 3.0) for r in range(3)]
    assert all(r[4] == [3] for r in results) and len(e.history) == 1
    # RayExecutor's elastic mode is the same job, with arguments.
    r = RayExecutor(RayExecutor.create_settings(timeout_s=20), min_workers=1, max_workers=2)
    r.start()
    assert [x[:4] for x in r.run(count_steps, kwargs={"steps": 5})] == [(0, 2, 5, 2.0),
                                                                        (1, 2, 5, 2.0)]
    with pytest.raises(NotImplementedError, match="elastic mode"):
        r.execute(lambda _: 0)
    r.shutdown()


def test_elastic_a_worker_that_dies_is_dropped_and_the_job_goes_on(cluster):
    e = elastic(min_np=2, max_np=3, elastic_timeout=60)
    results = e.run(count_steps, kwargs={"fail": ":2$"})
    assert [r[:4] for r in results] == [(0, 2, 25, 2.0), (1, 2, 25, 2.0)]
    assert all(r[4] == [3, 2] for r in results)  # three ranks, then two: no restart from 0
    assert [len(ids) for _, ids, _ in e.history] == [3, 2]
    assert e.history[1][2].endswith(":2's host %s is gone" % e.history[1][1][0].rpartition(":")[0])


def test_elastic_a_raising_worker_fails_the_job_with_its_error(cluster):
    # The worker's node is blacklisted (for good), with the other workers on it: the one node
    # here, so every member has failed (its own error, or stopped with its failed node) and
    # the job ends at once, not after elastic_timeout (which also bounds the actors' start:
    # they import torch).
    e = elastic(min_np=2, max_np=2, elastic_timeout=60)
    with pytest.raises(HorovodRunnerError, match=r"first failure: worker .*:1 raised KeyError: "
                                                 r"'bad batch in worker .*:1'") as info:
        e.run(count_steps, kwargs={"fail": ":1$", "how": "raise"})
    assert isinstance(info.value.__cause__, RankError)
    assert "in train" in info.value.__cause__.remote_traceback
    # (The driver's reason, not a time: under load the actors' start alone took 50 s once.)
    assert "ended with a failure of its own, so the job fails without waiting" in str(info.value)
    with pytest.raises(ValueError, match="4 slots of 1 CPUs, fewer than min_np 5"):
        elastic(min_np=5).run(count_steps)
    # Nothing left: every actor stopped, the CPUs free again.
    wait_for_free_cpus()


def test_a_removed_worker_in_a_launchers_process_raises_instead_of_exiting(monkeypatch):
    # The driver's "stop" for a worker (more live workers than max_np): a worker in a process
    # of its own exits (0); one in a Ray actor raises WorkerRemoved, which the actor reports as
    # a clean end. No Ray needed: the rendezvous store as the driver writes it.
    from horovod_cpp import elastic
    from horovod_cpp.job.rendezvous import RendezvousServer, new_secret
    secret = new_secret()
    server = RendezvousServer(secret, bind="127.0.0.1")
    try:
        server.put("elastic/0/assign/n@1.2.3.4:3", b"stop")
        server.put("elastic/round", b"0")
        for name, value in (("HOROVOD_ELASTIC_WORKER_ID", "n@1.2.3.4:3"),
                            ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"),
                            ("HOROVOD_GLOO_RENDEZVOUS_PORT", str(server.port)),
                            ("HOROVOD_GLOO_SECRET", secret), ("HOROVOD_ELASTIC_TIMEOUT", "10")):
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(elastic, "in_launcher_process", True)

        def no_exit(code):  # (an exit here would end pytest itself, with status 0)
            raise AssertionError("the worker exited (%d) instead of raising" % code)
        monkeypatch.setattr(os, "_exit", no_exit)
        with pytest.raises(elastic.WorkerRemoved, match="n@1.2.3.4:3 was removed"):
            elastic._Worker().join()
        from horovod_cpp.ray.elastic import _ElasticWorker
        assert _ElasticWorker().run({}, lambda: elastic._Worker().join(), None, None) == (
            "removed", None)
    finally:
        server.stop()
