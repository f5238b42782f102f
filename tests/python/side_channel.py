"""A barrier beside horovod_cpp for tests that shut it down: MPI's under mpirun, the launcher's
rendezvous store under hvdrun --gloo (HOROVOD_CONTROLLER=gloo)."""
import os
import time

GLOO = os.environ.get("HOROVOD_CONTROLLER", "").lower() == "gloo"
_state = {"client": None, "count": 0}

if not GLOO:
    from mpi4py import MPI  # noqa: F401  (initializes MPI with MPI_THREAD_MULTIPLE)


def rank():
    """This process's rank as the launcher numbered it."""
    return int(os.environ["HOROVOD_RANK"]) if GLOO else MPI.COMM_WORLD.Get_rank()


def barrier(timeout=60.0):
    if not GLOO:
        # Not MPI_Barrier: Open MPI's blocking calls spin (sched_yield with mpi_yield_when_idle),
        # and on an oversubscribed host (4 ranks and test.sh's background builds on 2 cores)
        # two spinning ranks kept the ranks they wait for, sleepers woken by the network, off the
        # CPU for seconds to minutes (measured: a sleeping process starved 90 s, the 2 x 2 suite
        # past its 90 s deadline ~1 run in 10). A request polled with sleeps leaves them the CPU.
        request = MPI.COMM_WORLD.Ibarrier()
        end = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > end:
                raise TimeoutError("side-channel barrier: not every rank arrived within %g s"
                                   % timeout)
            time.sleep(0.001)
        return
    from horovod_cpp.job.rendezvous import RendezvousClient
    if _state["client"] is None:
        import atexit
        _state["client"] = RendezvousClient(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                            os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"],
                                            os.environ["HOROVOD_GLOO_SECRET"])
        atexit.register(_state["client"].close)
    client = _state["client"]
    _state["count"] += 1
    prefix = "tests/barrier%d/" % _state["count"]
    client.set(prefix + str(rank()), b"1")
    for r in range(int(os.environ["HOROVOD_SIZE"])):
        if client.wait(prefix + str(r), timeout) is None:
            raise TimeoutError("side-channel barrier: rank %d did not arrive within %g s"
                               % (r, timeout))
