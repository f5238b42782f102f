"""Helpers built on the collectives, as in ``horovod.tensorflow.functions``:
``broadcast_variables``, ``broadcast_object``, ``broadcast_object_fn`` and
``allgather_object`` (objects travel pickled, through horovod_cpp.common.objects: the names
horovod_cpp.torch gives them)."""
from horovod_cpp.common import objects
from horovod_cpp.common.process_sets import global_process_set
from horovod_cpp.tensorflow.collectives import _plain_python, broadcast_


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns ``root_rank``'s value to each variable on every rank of the set (a model's
    ``variables``, an optimizer's), in one fused operation. ``inplace`` is accepted for
    Horovod's signature."""
    broadcast_(variables, root_rank, name="broadcast_variables", process_set=process_set)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Sends any picklable ``obj`` from ``root_rank`` to every rank and returns it
    (``session`` is accepted for Horovod's signature)."""
    return objects.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function that broadcasts its argument from ``root_rank`` (Horovod's helper)."""
    def fn(obj):
        return objects.broadcast_object(obj, root_rank, name, process_set)
    return fn


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Gathers any picklable ``obj`` from every rank of the set; the list, in rank order."""
    return objects.allgather_object(obj, name, process_set)


__all__ = ["broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object"]


_plain_python(globals(), __all__)
