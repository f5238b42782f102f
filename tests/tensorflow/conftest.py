"""The TensorFlow lane's suites under mpirun (or hvdrun --gloo): every rank runs the same
tests; horovod_cpp is initialized once. ``KERAS_BACKEND=torch`` runs the Keras tests on Keras's
PyTorch backend (the TensorFlow tests are then skipped). Each test has a deadline
(tests/pytest_deadline.py): a hang ends the job instead of waiting."""
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
os.environ.setdefault("HOROVOD_DEADLOCK_GRACE_SECONDS", "2")
if os.environ.get("HOROVOD_CONTROLLER", "").lower() != "gloo":
    from mpi4py import MPI  # noqa: F401,E402  (initializes MPI first, so it stays this process's)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytest_deadline import deadline  # noqa: E402,F401  (a per-test deadline)

import horovod_cpp.common.basics as basics  # noqa: E402
from horovod_cpp.common.objects import allgather_object  # noqa: E402

TENSORFLOW = os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow"


def pytest_ignore_collect(collection_path, config):
    # The TensorFlow API's tests only where Keras runs on TensorFlow (the same venv runs the
    # Keras tests on torch).
    return not TENSORFLOW and collection_path.name.startswith("test_tf_")


@pytest.fixture(scope="session", autouse=True)
def horovod():
    basics.init()
    yield
    basics.shutdown()


def same_on_every_rank(value):
    """Every rank's ``value``, in rank order."""
    return allgather_object(value)
