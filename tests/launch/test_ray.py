"""horovod_cpp.ray.RayExecutor on a real local Ray cluster (ray from PyPI, 4 CPUs): every
worker's value in rank order, collectives between the workers, execute/execute_single with an
executable class, several runs in one executor, a worker's exception with its traceback, a
worker that dies, too few CPUs, resources that stay busy, and nothing left after shutdown.
Across the test bed's hosts: tests/multihost/ray."""
import os
import socket
import sys

import cloudpickle
import pytest
import ray

from horovod_cpp import _import_core
from horovod_cpp.job.service import HorovodRunnerError, RankError
from horovod_cpp.ray import RayExecutor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

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
    e.start()  # now they fit
    assert [r[1] for r in e.run(rank_sum, args=[1])] == [2, 2]
    e.shutdown()


def test_arguments_and_elastic_are_refused_clearly():
    settings = RayExecutor.create_settings()
    with pytest.raises(ValueError, match="one of num_workers and num_hosts"):
        RayExecutor(settings)
    with pytest.raises(ValueError, match="only one of num_workers and num_hosts"):
        RayExecutor(settings, num_workers=2, num_hosts=2)
    with pytest.raises(ValueError, match="gpus_per_worker is set but use_gpu is False"):
        RayExecutor(settings, num_workers=2, gpus_per_worker=1)
    with pytest.raises(NotImplementedError, match="elastic Ray jobs"):
        RayExecutor(settings, min_workers=1, max_workers=2)
    with pytest.raises(RuntimeError, match="start"):
        RayExecutor(settings, num_workers=1).run(rank_sum, args=[1])


def test_shutdown_leaves_no_worker(executor):
    e = executor(num_workers=2)
    e.start()
    pids = [r[5] for r in e.run(rank_sum, args=[1])]
    e.shutdown()
    import time
    deadline = time.monotonic() + 20
    while any(os.path.exists("/proc/%d" % p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if os.path.exists("/proc/%d" % p)]
    while ray.available_resources().get("CPU") != 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 4
