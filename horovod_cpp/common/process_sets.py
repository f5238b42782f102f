"""Process sets, as in Horovod: ``ProcessSet``, ``global_process_set``, ``add_process_set`` and
``remove_process_set``; one registry per process, whichever frameworks use it."""
from horovod_cpp._build import import_core

_core = import_core()


class ProcessSet:
    """A subset of the ranks that run collectives among themselves.

    Create one with a list of global ranks, then register it by passing it to
    ``hvd.init(process_sets=[...])`` or, with dynamic process sets, to ``hvd.add_process_set``.
    """

    def __init__(self, ranks):
        if ranks is not None and not isinstance(ranks, (list, tuple, range)):
            raise ValueError("horovod_cpp's ProcessSet takes a list of ranks "
                             "(mpi4py communicators are not supported); got %r" % (ranks,))
        self.ranks = sorted(int(r) for r in ranks) if ranks is not None else None
        self.process_set_id = None

    def _check_registered(self):
        if self.process_set_id is None:
            raise ValueError("this process set has not been registered yet: pass it to "
                             "hvd.init(process_sets=[...]) or hvd.add_process_set()")

    def size(self):
        """Number of ranks in the set."""
        self._check_registered()
        return len(_core.process_set_info(self.process_set_id)[0])

    def rank(self):
        """This rank's index within the set, or -1 if it is not a member."""
        self._check_registered()
        return _core.process_set_info(self.process_set_id)[1]

    def included(self):
        """Whether this rank belongs to the set."""
        self._check_registered()
        return _core.process_set_info(self.process_set_id)[2]

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id and \
            self.ranks == other.ranks

    def __hash__(self):
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


# Every rank; its ranks are filled in by hvd.init().
global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0


def register_process_sets(process_sets):
    """Assigns ids 1, 2, ... to the sets passed to init, in order (as the core does)."""
    for i, ps in enumerate(process_sets):
        ps.process_set_id = i + 1


def add_process_set(process_set):
    """Adds a process set on every rank (collective; needs HOROVOD_DYNAMIC_PROCESS_SETS=1 or
    ``hvd.init(process_sets="dynamic")``). Accepts a ProcessSet or a list of ranks and returns
    the registered ProcessSet. Raises ValueError if a set with these ranks exists already."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError("%r has already been registered" % (ps,))
    ps.process_set_id = _core.add_process_set(ps.ranks)
    return ps


def remove_process_set(process_set):
    """Removes a process set on every rank (collective). Returns False if it was not
    registered (or is the global set), True once removed."""
    if process_set.process_set_id in (None, 0):
        return False
    try:
        _core.remove_process_set(process_set.process_set_id)
    except ValueError:
        return False
    process_set.process_set_id = None
    return True
