"""A per-test deadline for our pytest suites (pytest-timeout is not in Debian, and a fresh
machine may not reach PyPI): a test still running after ``HVD_TEST_TIMEOUT`` seconds (default
90) prints every thread's stack, kills the processes it started (and theirs) and ends the
process with exit code 3, so a hang fails fast instead of eating the CI budget.

Use from a conftest.py:  ``from pytest_deadline import deadline  # noqa: F401``
"""
import faulthandler
import os
import signal
import sys
import threading

import pytest

# Every live process below a pid (from /proc): the launchers' own helper.
from horovod_cpp.job.proc import descendants  # noqa: F401  (tests/launch/conftest.py too)

TEST_TIMEOUT = float(os.environ.get("HVD_TEST_TIMEOUT", "90"))

# What a test wants printed if it expires (e.g. the output of the job it is reading from):
# callables returning text, cleared before each test.
ON_EXPIRE = []


@pytest.fixture(autouse=True)
def deadline(request):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    limit = TEST_TIMEOUT
    marker = request.node.get_closest_marker("deadline")
    if marker is not None:
        limit = float(marker.args[0])

    def expire():
        if capture is not None:
            capture.suspend_global_capture(in_=True)  # so the report reaches the terminal
        sys.stderr.write("\n[rank %s] %s did not finish within %.0f s; stacks:\n"
                         % (os.environ.get("OMPI_COMM_WORLD_RANK", "-"), request.node.nodeid,
                            limit))
        faulthandler.dump_traceback(all_threads=True)
        for hook in list(ON_EXPIRE):
            try:
                sys.stderr.write("\n%s\n" % hook())
            except Exception as e:  # (a report, never a second failure)
                sys.stderr.write("\n(an expiry report failed: %r)\n" % e)
        if capture is not None:  # what the test printed (or its processes, at the fd level),
            try:                 # which exiting here would lose; last, so a log's tail has it
                out, err = capture.read_global_capture()
                if out or err:
                    sys.stderr.write("\n[rank %s] the test's captured output (its end):\n%s%s\n"
                                     % (os.environ.get("OMPI_COMM_WORLD_RANK", "-"),
                                        out[-8000:], err[-8000:]))
            except Exception as e:
                sys.stderr.write("\n(reading the captured output failed: %r)\n" % e)
        sys.stderr.flush()
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(3)

    del ON_EXPIRE[:]
    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()
