"""Spark's TorchDistributor with local_mode=False on the test bed's Spark cluster (2 workers x
2 cores, the driver on hvd-h1), running a DDP function on the horovod_cpp torch.distributed
backend against the same function on Gloo: one process on each worker host, the same
parameters. Needs PyPI's torch and pyspark (tests/multihost/run.sh starts the cluster from the
TensorFlow lane, whose Python sees the PyPI lane's packages, or from the PyPI lane)."""
import os
import socket
import sys

import cloudpickle
import pytest

from conftest import WORKERS, start_session
from pyspark import cloudpickle as spark_cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])
spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.deadline(300)
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "c10d",
                        "programs")


@pytest.fixture(scope="module")
def cluster():
    session = start_session("horovod_cpp TorchDistributor tests")
    yield session
    session.stop()


def ddp_on(backend, programs):
    import faulthandler
    import torch.distributed as dist
    # (Should a process hang: its stacks reach the driver's output before the test's deadline,
    # and a collective that cannot finish ends as an error naming the ranks.)
    faulthandler.dump_traceback_later(150, exit=False)
    os.environ.setdefault("HOROVOD_COLLECTIVE_TIMEOUT_SECONDS", "60")
    sys.path.insert(0, programs)
    import ddp_train
    # Every process returns the same (TorchDistributor keeps whichever value it gets).
    real_destroy = dist.destroy_process_group
    hosts = []

    def destroy(*args, **kwargs):  # gather the hosts while the group is still up
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, socket.gethostname())
        hosts.extend(everyone)
        real_destroy(*args, **kwargs)
    dist.destroy_process_group = destroy
    try:
        got = ddp_train.train(backend)
    finally:
        dist.destroy_process_group = real_destroy
    got.pop("rank")
    got["hosts"] = sorted(hosts)
    if backend == "gloo":  # (the reference: torch's Gloo can abort its process at exit)
        ddp_train.leave_without_finalizing()  # horovod_cpp's run finalizes normally
    return got


def test_torch_distributor_runs_ddp_on_the_backend_across_worker_hosts(cluster):
    import torch
    from pyspark.ml.torch.distributor import TorchDistributor
    programs = os.path.abspath(PROGRAMS)
    ours = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        ddp_on, "horovod_cpp", programs)
    ref = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        ddp_on, "gloo", programs)
    assert (ours["size"], ours["cpu_backend"], ref["cpu_backend"]) == (2, "horovod_cpp", "gloo")
    assert set(ours["hosts"]) <= set(WORKERS) and len(ours["hosts"]) == 2, ours["hosts"]
    for a, b in zip(ours["params"], ref["params"]):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), (a - b).abs().max()
