"""Process sets, as in horovod.torch: ``ProcessSet``, ``global_process_set``,
``add_process_set`` and ``remove_process_set`` (horovod_cpp.common.process_sets: one registry
per process, shared with horovod_cpp.tensorflow)."""
from horovod_cpp.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                             global_process_set, register_process_sets,
                                             remove_process_set)
