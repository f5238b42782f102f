"""Starting horovod_cpp's runtime for ``init_process_group("horovod_cpp")``.

Three ways, tried in this order:
* the runtime is already up (the program called ``hvd.init()``): it is used if its rank and
  size are the process group's;
* the process was started by mpirun (or hvdrun): ``hvd.init()`` on MPI (or hvdrun's Gloo);
* otherwise (torchrun, TorchDistributor, any env:// launch): Gloo, meeting through the store
  that ``init_process_group`` was given. Rank 0 serves horovod_cpp's rendezvous store
  (``horovod_cpp.job.rendezvous``) with a fresh secret and publishes its address, port and
  secret under one key of the c10d store; every rank reads them and initializes.
"""
import os
import socket

from horovod_cpp.job.rendezvous import RendezvousServer, new_secret
from horovod_cpp.job import network
from horovod_cpp.torch import basics

_KEY = "horovod_cpp/rendezvous"
_MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


class Started(object):
    """What this module started, so that the default group's shutdown undoes it alone."""

    def __init__(self, owns_runtime, server=None):
        self.owns_runtime = owns_runtime
        self.server = server

    def close(self):
        if self.owns_runtime and basics.is_initialized():
            basics.shutdown()
        if self.server is not None:
            self.server.stop()
            self.server = None


def launched_by_mpi():
    return any(v in os.environ for v in _MPI_VARS)


def _check(rank, size, how):
    if basics.rank() != rank or basics.size() != size:
        raise RuntimeError(
            "horovod_cpp backend: init_process_group was given rank %d of %d, but horovod_cpp "
            "%s rank %d of %d; launch the job one way (mpirun, hvdrun, torchrun) and let "
            "init_process_group take rank and world size from it"
            % (rank, size, how, basics.rank(), basics.size()))


def _store_host(store):
    """The host of the TCPStore under ``store`` (PrefixStores unwrapped), or None."""
    while store is not None:
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
    return None


def _facing_address(store, own=False):
    """An address of this host that the other ranks reach: HOROVOD_GLOO_RENDEZVOUS_ADDR if
    set (unless ``own``), else this host's address on the route to the c10d store's host
    (loopback when the store is on this host under a loopback name)."""
    if os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") and not own:
        return os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    host = _store_host(store) or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    try:
        return network.source_address(host)
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def start(store, rank, size, timeout):
    """Brings horovod_cpp's runtime up as rank ``rank`` of ``size``; returns a Started."""
    # Subgroups of the c10d world become process sets, added while training runs.
    os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    if basics.is_initialized():
        _check(rank, size, "was initialized as")
        return Started(owns_runtime=False)
    # The backend's operation names never repeat (c10d.<group>.<n>): cached, they would only
    # fill the response cache and evict (measured: a cache miss then costs ~90 us more than
    # with the cache off). Off unless the user sets a capacity.
    os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")
    if launched_by_mpi() or os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        basics.init()
        _check(rank, size, "was started by its launcher as")
        return Started(owns_runtime=True)
    server = None
    if rank == 0:
        secret = new_secret()
        address = _facing_address(store)
        server = RendezvousServer(secret, bind=address)
        store.set(_KEY, "%s %d %s" % (address, server.port, secret))
    # Store.get waits for the key up to the store's timeout (the group's).
    address, port, secret = store.get(_KEY).decode().split(" ")
    seconds = max(1, int(timeout.total_seconds())) if timeout is not None else None
    env = {
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": ("ccl" if os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower()
                                   == "ccl" else "gloo"),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": address, "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
        "HOROVOD_GLOO_SECRET": secret,
    }
    if seconds is not None and "HOROVOD_GLOO_TIMEOUT_SECONDS" not in os.environ:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(seconds)
    if not os.environ.get("HOROVOD_HOSTNAME") and not os.environ.get("HOROVOD_GLOO_IFACE"):
        # Gloo listens on this address and the ranks of one host share it: this host's address
        # on the route to the store (loopback when the store is on this host's loopback), so a
        # host name that does not resolve (a minimal machine, a container) cannot stop it.
        env["HOROVOD_HOSTNAME"] = _facing_address(store, own=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        basics.init()
    except BaseException:
        if server is not None:
            server.stop()
        raise
    finally:
        # The rendezvous's variables are this group's: a later hvd.init() in this process
        # (after destroy_process_group) must not take them for a launcher's.
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Started(owns_runtime=True, server=server)
