"""Lifecycle and topology shared by every framework's face (``horovod_cpp.torch``,
``horovod_cpp.tensorflow``), as Horovod's ``horovod.common.basics``: ``init``, ``shutdown``,
``size``/``rank``/..., what the build and the job use (``mpi_enabled``, ...), the timeline, the
reduction ops and the error types. Names no framework: one process has one runtime, whichever
frameworks it imports. The lowest module of the package but ``process_sets``.
"""
import atexit
import os
import warnings

from horovod_cpp._build import import_core
from horovod_cpp import elastic
from horovod_cpp.common.process_sets import ProcessSet, global_process_set, register_process_sets

_core = import_core()
_call_site_skip = set()


def skip_call_sites_in(*modules):
    """Error messages about a collective name the caller's file:line: the first frame outside
    horovod_cpp (the directory of its _core) and the packages given here by the frameworks'
    faces (torch: a gradient's allreduce is the user's ``loss.backward()``; TensorFlow and
    Keras: the user's ``tape.gradient`` or ``model.fit``)."""
    _call_site_skip.update(
        os.path.join(f(os.path.dirname(module.__file__)), "")
        for module in modules for f in (os.path.abspath, os.path.realpath))
    _core.set_call_site_skip(sorted(_call_site_skip))


skip_call_sites_in(_core)

HorovodInternalError = _core.HorovodInternalError
HorovodPreconditionError = _core.HorovodPreconditionError


class HorovodNotSupportedError(ValueError, NotImplementedError):
    """An operation horovod_cpp does not support with these arguments (op=Adasum, a
    reducescatter with Min/Max/Product). A ValueError, as horovod_cpp's other argument errors,
    and a NotImplementedError, a RuntimeError, as horovod.torch raises for them."""

Average = _core.AVERAGE
Sum = _core.SUM
Adasum = _core.ADASUM
Min = _core.MIN
Max = _core.MAX
Product = _core.PRODUCT

_atexit_registered = False
# Callables run as the runtime starts (before the core's init, when it was not running) and
# after it shut down: the modules above this one keep per-runtime state (the tensor bridge's
# pending handles and default names) and register here, so this module names none of them.
_on_start = []
_on_shutdown = []


def add_lifecycle_hooks(on_start=None, on_shutdown=None):
    """Registers ``on_start()`` (run by ``init`` when the runtime was not running) and
    ``on_shutdown()`` (run by ``shutdown`` after the core stopped)."""
    if on_start is not None:
        _on_start.append(on_start)
    if on_shutdown is not None:
        _on_shutdown.append(on_shutdown)


# ---- lifecycle and topology ---------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Initializes horovod_cpp (idempotent). ``process_sets``: a list of ProcessSet objects
    registered on every rank (ids 1, 2, ... in order), or "dynamic" to allow
    ``add_process_set``/``remove_process_set`` later (like HOROVOD_DYNAMIC_PROCESS_SETS=1).
    Honours every HOROVOD_* variable set before the call (HOROVOD_TIMELINE included)."""
    if comm is not None:
        raise ValueError("horovod_cpp's init() does not take an MPI communicator; run the "
                         "job with mpirun and use process sets for subsets of ranks")
    ranks = []
    if process_sets == "dynamic":
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    elif process_sets is not None:
        for ps in process_sets:
            if not isinstance(ps, ProcessSet):
                raise ValueError("process_sets must be a list of hvd.ProcessSet (or \"dynamic\")")
        ranks = [ps.ranks for ps in process_sets]
    if not _core.is_initialized():
        for hook in _on_start:
            hook()
    if not _core.is_initialized() and elastic.enabled():
        _elastic_init(ranks)
    else:
        _core.init(ranks)
    global _atexit_registered
    if not _atexit_registered:
        # Before interpreter teardown (and before mpi4py finalizes MPI, if it owns it).
        atexit.register(shutdown)
        _atexit_registered = True
    if process_sets not in (None, "dynamic"):
        register_process_sets(process_sets)
    global_process_set.ranks = list(range(_core.size()))


def _elastic_init(ranks, attempts=10):
    """Joins the driver's next round and initializes in it. A peer lost while the round
    forms (killed, or its host gone, during Init) fails this Init on the others: as for a
    failure while training, they leave that round and join the next one, which the driver forms
    without the lost worker, instead of ending (the chaos campaign found survivors exiting)."""
    for attempt in range(attempts):
        elastic.worker().join()  # this worker's rank and size in the driver's next round
        try:
            _core.init(ranks)
            return
        except HorovodInternalError as e:
            if attempt + 1 == attempts:
                raise
            warnings.warn("horovod_cpp elastic: Init failed (%s); joining the next round" % e)
            _core.shutdown()
            elastic.worker().request_reset("Init failed: %s" % e)


def shutdown():
    """Stops horovod_cpp on every rank; pending operations fail. Idempotent."""
    _core.shutdown()
    for hook in _on_shutdown:
        hook()


is_initialized = _core.is_initialized
size = _core.size
rank = _core.rank
local_size = _core.local_size
local_rank = _core.local_rank
cross_size = _core.cross_size
cross_rank = _core.cross_rank
mpi_threads_supported = _core.mpi_threads_supported


def mpi_built():
    return True


def _host_backend():
    """"MPI" or "Gloo": the running job's controller (with oneCCL's data plane too), before init
    the one the environment asks for."""
    if _core.is_initialized() and _core.host_backend() != "oneCCL":
        return _core.host_backend()
    chosen = [os.environ.get(n, "").lower() for n in ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")]
    return "Gloo" if "gloo" in chosen else "MPI"


def mpi_enabled():
    """Whether the job uses MPI (horovod_cpp runs on MPI or on Gloo, not both)."""
    return _host_backend() == "MPI"


def gloo_built():
    return _core.gloo_built()


def gloo_enabled():
    """Whether the running job uses Gloo (HOROVOD_CONTROLLER=gloo, e.g. under hvdrun --gloo)."""
    return _host_backend() == "Gloo"


def nccl_built():
    """NCCL's version code (e.g. 22809) when built with NCCL, otherwise 0."""
    return _core.nccl_built()


def cuda_built():
    return _core.nccl_built() != 0


def rocm_built():
    return False


def ccl_built():
    """Whether this build has oneCCL's data plane (HOROVOD_CPU_OPERATIONS=ccl)."""
    return _core.ccl_built()


def ccl_enabled():
    """Whether the running job reduces CPU tensors on oneCCL."""
    return _core.is_initialized() and _core.host_backend() == "oneCCL"


def ddl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts recording a timeline into ``file_path`` (written by rank 0)."""
    _core.start_timeline(file_path, mark_cycles)


def stop_timeline():
    """Stops recording; the file is left as valid JSON."""
    _core.stop_timeline()


__all__ = ["HorovodInternalError", "HorovodPreconditionError", "HorovodNotSupportedError",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "add_lifecycle_hooks",
    "skip_call_sites_in", "init",
    "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "mpi_threads_supported", "mpi_built", "mpi_enabled", "gloo_built",
    "gloo_enabled", "nccl_built", "cuda_built", "rocm_built", "ccl_built", "ddl_built",
    "start_timeline", "stop_timeline"]
