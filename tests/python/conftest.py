"""pytest under mpirun: every rank runs the same tests; horovod_cpp is initialized once.

mpi4py initializes MPI first, so MPI belongs to this process and tests may shut horovod_cpp
down and initialize it again (e.g. with static process sets).
"""
import os

import pytest
from mpi4py import MPI  # noqa: F401  (initializes MPI with MPI_THREAD_MULTIPLE)

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")

import horovod_cpp.torch as hvd  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def horovod():
    hvd.init()
    yield hvd
    hvd.shutdown()


def same_on_every_rank(value):
    """The list of every rank's `value` (for asserting that all ranks saw the same thing)."""
    return hvd.allgather_object(value)
