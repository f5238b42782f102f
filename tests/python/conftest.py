"""pytest under mpirun: every rank runs the same tests; horovod_cpp is initialized once.

mpi4py initializes MPI first, so MPI belongs to this process and tests may shut horovod_cpp
down and initialize it again (e.g. with static process sets).

Every test has a deadline (HVD_TEST_TIMEOUT seconds, default 90): a test that hangs (a rank
waiting in a collective that another rank skipped) prints every thread's stack and ends the
process, so mpirun takes the whole job down instead of waiting.
"""
import faulthandler
import os
import sys
import threading

import pytest
from mpi4py import MPI  # noqa: F401  (initializes MPI with MPI_THREAD_MULTIPLE)

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")

import horovod_cpp.torch as hvd  # noqa: E402

TEST_TIMEOUT = float(os.environ.get("HVD_TEST_TIMEOUT", "90"))


@pytest.fixture(scope="session", autouse=True)
def horovod():
    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.fixture(autouse=True)
def deadline(request):
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def expire():
        if capture is not None:
            capture.suspend_global_capture(in_=True)  # so the report reaches mpirun's output
        sys.stderr.write("\n[rank %s] %s did not finish within %.0f s; stacks:\n"
                         % (os.environ.get("OMPI_COMM_WORLD_RANK", "?"), request.node.nodeid,
                            TEST_TIMEOUT))
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(TEST_TIMEOUT, expire)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


def same_on_every_rank(value):
    """The list of every rank's `value` (for asserting that all ranks saw the same thing)."""
    return hvd.allgather_object(value)
