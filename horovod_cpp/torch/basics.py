"""Lifecycle and topology of ``horovod_cpp.torch``, as Horovod's ``basics``: ``init``,
``shutdown``, ``size``/``rank``/..., what the build and the job use (``mpi_enabled``, ...), the
timeline, the reduction ops and the error types: horovod_cpp.common.basics (one runtime per
process, shared with horovod_cpp.tensorflow), with torch's frames skipped in the call sites
that error messages name (a gradient's allreduce: the user's ``loss.backward()``).
"""
import torch

from horovod_cpp.common import basics as _common
from horovod_cpp.common.basics import *  # noqa: F401,F403
from horovod_cpp.common.basics import __all__, _core, _host_backend  # noqa: F401

_common.skip_call_sites_in(torch)
