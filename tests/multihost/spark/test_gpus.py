"""GPUs from Spark's resources, without GPUs: the workers find 2 fake GPUs each (testbed.sh
spark up --gpus 2: addresses 20, 21 on hvd-h2 and 30, 31 on hvd-h3) and every task asks for
one. Each rank must see its host's task GPUs in local-rank order, its own task's GPU at
position local_rank."""
import os
import socket
import sys

import cloudpickle
import pytest

from conftest import WORKERS, start_session
from horovod_cpp.spark import HorovodRunner

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.deadline(240)


@pytest.fixture(scope="module")
def cluster():
    session = start_session("horovod_cpp GPU placement tests", **{
        "spark.executor.resource.gpu.amount": "2",
        "spark.task.resource.gpu.amount": "1"})
    yield session
    session.stop()


def what_each_rank_sees():
    import horovod_cpp.torch as hvd
    hvd.init()
    mine = (hvd.rank(), socket.gethostname(), hvd.local_rank(),
            os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("HVD_SPARK_TASK_GPUS"))
    everyone = hvd.allgather_object(mine)
    hvd.shutdown()
    return sorted(everyone)


def host_gpus(host):
    n = int(host[len("hvd-h"):])
    return {str(10 * n), str(10 * n + 1)}


@pytest.mark.parametrize("np_", [4, 2])
def test_each_rank_gets_its_own_tasks_gpu(cluster, np_):
    everyone = HorovodRunner(np=np_).run(what_each_rank_sees)
    assert [e[0] for e in everyone] == list(range(np_))
    by_host = {}
    for rank, host, local_rank, visible, own in everyone:
        assert host in WORKERS
        assert visible is not None and own is not None, (rank, visible, own)
        visible = visible.split(",")
        assert own in host_gpus(host), (rank, host, own)  # a GPU of its own host
        assert visible[local_rank] == own  # device local_rank is its task's GPU
        by_host.setdefault(host, []).append((local_rank, tuple(visible), own))
    for host, ranks in by_host.items():
        assert sorted(r[0] for r in ranks) == list(range(len(ranks)))
        assert len({r[1] for r in ranks}) == 1  # the same list on every rank of the host
        assert len({r[2] for r in ranks}) == len(ranks)  # no GPU given to two ranks
        assert set(ranks[0][1]) == {r[2] for r in ranks}  # only the host's tasks' GPUs
