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


def _pairwise_cover(items):
    """A subset of one test's parametrizations in which every pair of parameter values that
    occurs in the full matrix still occurs (greedy, deterministic: the same on every rank)."""
    def pairs(item):
        params = sorted((k, repr(v)) for k, v in item.callspec.params.items())
        return {(a, b) for i, a in enumerate(params) for b in params[i + 1:]}

    covers = [(it, pairs(it)) for it in items]
    wanted = set().union(*(p for _, p in covers))
    kept = []
    while wanted:
        best, best_pairs = max(covers, key=lambda c: len(c[1] & wanted))  # first of the best
        kept.append(best)
        wanted -= best_pairs
    return kept


def pytest_collection_modifyitems(config, items):
    """HVD_TEST_MATRIX=pairwise (the Gloo lanes, where each collective costs ~0.6 ms against
    MPI's ~0.02 ms here): a test parametrized over three or more parameters runs on a pairwise
    covering subset of its matrix (every two values that meet in the full matrix meet in one
    of the kept cases) instead of every combination. The MPI lanes run the full matrix."""
    if os.environ.get("HVD_TEST_MATRIX") != "pairwise":
        return
    families = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and len(callspec.params) >= 3:
            families.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    dropped = set()
    for family in families.values():
        kept = {id(it) for it in _pairwise_cover(family)}
        dropped.update(id(it) for it in family if id(it) not in kept)
    if dropped:
        config.hook.pytest_deselected(items=[it for it in items if id(it) in dropped])
        items[:] = [it for it in items if id(it) not in dropped]
