"""Runs a command (an mpirun of a C++ test binary) with a Gloo rendezvous store for its ranks:
the MPI test suites on the Gloo backend. mpirun starts the processes and the test harness keeps
MPI for its own cross-checks; horovod_cpp itself runs on Gloo (tests/mpi/mpi_test_main.cc sets
each rank's HOROVOD_RANK/SIZE from MPI when HOROVOD_CONTROLLER=gloo).

    python3 tests/with_rendezvous.py mpirun -np 3 build/tests/mpi_core_tests
"""
import os
import subprocess
import sys

# The checkout's package (pure Python up to here: horovod_cpp imports its compiled core lazily),
# so that this runs with any python3, also one without horovod_cpp installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from horovod_cpp.job.rendezvous import RendezvousServer, new_secret  # noqa: E402


def main(argv):
    secret = new_secret()
    server = RendezvousServer(secret, bind="127.0.0.1")
    # (oneCCL's data plane stays if asked for: it runs beside either controller)
    cpu = "ccl" if os.environ.get("HOROVOD_CPU_OPERATIONS") == "ccl" else "gloo"
    env = dict(os.environ, HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS=cpu,
               HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
               HOROVOD_GLOO_RENDEZVOUS_PORT=str(server.port), HOROVOD_GLOO_SECRET=secret,
               HOROVOD_HOSTNAME="127.0.0.1")
    try:
        return subprocess.call(argv, env=env)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
