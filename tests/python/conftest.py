"""pytest under mpirun (or hvdrun --gloo): every rank runs the same tests; horovod_cpp is
initialized once.

mpi4py initializes MPI first, so MPI belongs to this process and tests may shut horovod_cpp
down and initialize it again (e.g. with static process sets).

Every test has a deadline (tests/pytest_deadline.py, HVD_TEST_TIMEOUT seconds, default 90): a
test that hangs (a rank waiting in a collective that another rank skipped) prints every
thread's stack and ends the process, so mpirun takes the whole job down instead of waiting.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_channel  # noqa: E402,F401  (under mpirun: mpi4py initializes MPI first)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytest_deadline import deadline  # noqa: E402,F401  (a per-test deadline)

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
# A short deadlock grace: the deadlock tests are quick, and every other test runs under it too
# (a false deadlock would fail them).
os.environ.setdefault("HOROVOD_DEADLOCK_GRACE_SECONDS", "2")

import horovod_cpp.torch as hvd  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def horovod():
    hvd.init()
    yield hvd
    hvd.shutdown()


def same_on_every_rank(value):
    """The list of every rank's `value` (for asserting that all ranks saw the same thing)."""
    return hvd.allgather_object(value)
