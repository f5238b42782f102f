"""Horovod's module path ``horovod.torch.mpi_ops``, as a face over the modules it was split into:
``basics`` (lifecycle and topology), ``tensor_bridge`` (tensors to and from the core; ``poll``,
``synchronize``), ``adasum``, ``collectives`` and ``process_sets``. It stays (code written for
Horovod imports from it); new code imports from ``horovod_cpp.torch`` or those modules."""
from horovod_cpp.torch.adasum import adasum_pair  # noqa: F401
from horovod_cpp.torch.basics import *  # noqa: F401,F403
from horovod_cpp.torch.basics import _core  # noqa: F401
from horovod_cpp.torch.collectives import *  # noqa: F401,F403
from horovod_cpp.torch.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                            global_process_set, remove_process_set)
from horovod_cpp.torch.tensor_bridge import (handle_average_backwards_compatibility,  # noqa: F401
                                             check_supported_op, poll, synchronize)
