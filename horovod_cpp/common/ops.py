"""What the collectives of every framework's face share: the operations' names
(``allreduce.<name>`` or ``allreduce.noname.<n>``, the same in every framework, so ranks of
different frameworks name the same call alike), the reduction ops' checks (``op`` against the
deprecated ``average``) and the process sets' ids."""
import threading
import warnings

from horovod_cpp.common.basics import (Adasum, Average, Max, Min, Product, Sum,
                                       add_lifecycle_hooks)
from horovod_cpp.common.process_sets import ProcessSet

_noname = {}
_noname_lock = threading.Lock()


def _restart_names():
    # Every rank starts again together: default names restart with the runtime, so a call
    # that failed on one rank while it was down cannot shift that rank's sequence.
    with _noname_lock:
        _noname.clear()


add_lifecycle_hooks(on_start=_restart_names)


def op_name(prefix, name):
    """``<prefix>.<name>``, or ``<prefix>.noname.<n>`` numbered per process."""
    if name is not None and not isinstance(name, str):
        raise TypeError("%s: name must be a str or None, got %s" % (prefix, type(name).__name__))
    if name is not None:
        return "%s.%s" % (prefix, name)
    with _noname_lock:
        n = _noname.get(prefix, 0)
        _noname[prefix] = n + 1
    return "%s.noname.%d" % (prefix, n)


def process_set_id(process_set):
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be an hvd.ProcessSet, got %r" % (process_set,))
    if process_set.process_set_id is None:
        raise ValueError("%r has not been registered (hvd.init(process_sets=...) or "
                         "hvd.add_process_set)" % (process_set,))
    return process_set.process_set_id


def handle_average_backwards_compatibility(op, average):
    """``op`` wins; ``average`` (deprecated) maps to Average/Sum; both at once is an error."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        check_supported_op(op)
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning)
        return Average if average else Sum
    return Average


def check_supported_op(op):
    if op not in (Average, Sum, Adasum, Min, Max, Product):
        raise ValueError("unknown reduction op %r; use hvd.Average, Sum, Adasum, Min, Max or "
                         "Product" % (op,))
