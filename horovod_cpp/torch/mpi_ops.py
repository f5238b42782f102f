"""The old module path of the collectives, kept for one release (0.1.x); it goes in 0.2.
``horovod_cpp.torch.mpi_ops`` was split into ``basics`` (lifecycle and topology),
``tensor_bridge`` (tensors to and from the core; ``poll``, ``synchronize``), ``adasum`` and
``collectives``. Import from ``horovod_cpp.torch`` (``hvd.allreduce``, ...) or those modules."""
from horovod_cpp.torch.adasum import adasum_pair  # noqa: F401
from horovod_cpp.torch.basics import *  # noqa: F401,F403
from horovod_cpp.torch.basics import _core  # noqa: F401
from horovod_cpp.torch.collectives import *  # noqa: F401,F403
from horovod_cpp.torch.tensor_bridge import (handle_average_backwards_compatibility,  # noqa: F401
                                             check_supported_op, poll, synchronize)
