"""The torch.distributed backend's suite: every rank runs the same tests in one process group
on "horovod_cpp" (the default group) beside a group of the same ranks on Gloo, the reference.

Launched by torchrun (env://: the backend meets through torch's store and runs on Gloo's
transport) or by mpirun (the backend runs on MPI; the c10d store is a file in the job's
directory). Each test has a deadline (tests/pytest_deadline.py).
"""
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytest_deadline import deadline  # noqa: E402,F401  (a per-test deadline)

# HOROVOD_* knobs apply to the backend's collectives: the tests below see these two.
os.environ.setdefault("HOROVOD_DEADLOCK_GRACE_SECONDS", "2")
os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "1")
# The reference groups are torch's Gloo, which finds its address from the host name unless
# told: a new machine's may not resolve. All ranks of these suites are on this host.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch.distributed as dist  # noqa: E402

import horovod_cpp.torch as hvd  # noqa: E402,F401  (registers the backend)


def _init_method():
    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        return None, None  # torchrun's env://
    job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("OMPI_MCA_ess_base_jobid")
    path = os.path.join(tempfile.gettempdir(), "hvd-c10d-store-%s" % job)
    return "file://" + path, path


@pytest.fixture(scope="session", autouse=True)
def groups():
    method, path = _init_method()
    if method:
        rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
        dist.init_process_group("horovod_cpp", init_method=method, rank=rank, world_size=size)
    else:
        dist.init_process_group("horovod_cpp")
    gloo = dist.new_group(backend="gloo")
    yield dist.group.WORLD, gloo
    dist.destroy_process_group()
    if path and os.path.exists(path):
        try:
            os.unlink(path)
        except OSError:
            pass
