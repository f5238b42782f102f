"""Elastic training's framework-neutral half, shared by every face's ``hvd.elastic``:
``State`` (commit = save + check for host updates; restore; sync; reset callbacks),
``ObjectState`` (picklable attributes), ``VariablesState`` (variables with ``assign``) and the
``run`` decorator that restores, re-forms the
job and syncs on a failure or a host update. The faces add their states (``TorchState``,
``TensorFlowKerasState``, ...)."""
import copy
import functools

from horovod_cpp.common import basics
from horovod_cpp.common.basics import HorovodInternalError, rank
from horovod_cpp.common.objects import broadcast_object
from horovod_cpp.elastic import HostsUpdatedInterrupt, enabled, worker


class State(object):
    """Base of the elastic states: commit = save + check_host_updates; restore; sync; reset
    callbacks (run after every reset, on every rank, once the new world is up)."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after every reset: where the learning rate and the
        per-rank batch follow the new world size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (the point a failure rolls back to), then checks for host updates
        (which raises HostsUpdatedInterrupt on every rank when there are some)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when the driver has added or removed
        hosts since this round began. Rank 0 asks the driver; every rank gets its answer, so
        all raise or none does."""
        changed = False
        if enabled() and rank() == 0:
            changed = worker().hosts_changed()
        if broadcast_object(changed, 0, name="elastic.hosts_updated"):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()


class ObjectState(State):
    """Picklable attributes (``ObjectState(epoch=0, batch=0)``, then ``state.epoch``); synced by
    broadcasting them from rank 0."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        super().__init__()
        self._bcast_object = bcast_object
        self._get_rank = get_rank
        self._saved_state = kwargs
        self._set_attrs()

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0,
                                                   name="elastic.object_state")
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


class VariablesState(ObjectState):
    """Variables that have ``assign`` (TensorFlow's, Keras's) plus any picklable attributes:
    commit copies their values to host memory, restore assigns them back, sync broadcasts
    them from rank 0. A subclass says which variables (``_variables``, read at each commit,
    restore and sync, so ones built later are covered), how to read one to NumPy
    (``_read``) and how to broadcast them (``_broadcast``)."""

    def __init__(self, **kwargs):
        self._saved_values = None
        super().__init__(**kwargs)
        self._save_variables()

    def _variables(self):
        raise NotImplementedError()

    def _read(self, var):
        raise NotImplementedError()

    def _broadcast(self, variables):
        raise NotImplementedError()

    def _save_variables(self):
        self._saved_values = [copy.deepcopy(self._read(v)) for v in self._variables()]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        variables = self._variables()
        if self._saved_values is not None and len(self._saved_values) == len(variables):
            for var, value in zip(variables, self._saved_values):
                var.assign(value)
        super().restore()

    def sync(self):
        variables = self._variables()
        if variables:
            self._broadcast(variables)
        self._save_variables()
        super().sync()


class ModelState(VariablesState):
    """A Keras model's and optimizer's variables (the optimizer's: the model's own when not
    given; read at each commit, restore and sync, as Keras builds them at the first step)
    plus any picklable attributes."""

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(**kwargs)

    def _variables(self):
        variables = list(self.model.variables)
        if self.optimizer is not None:
            variables += list(self.optimizer.variables)
        return variables


# Functions that say whether an exception is a HorovodInternalError in a framework's wrapping
# (its message, or None): horovod_cpp.tensorflow registers one for the errors of its ops inside
# a tf.function, which reach Python as tf.errors.UnknownError.
_internal_error_readers = []


def add_internal_error_reader(reader):
    """Registers ``reader(exception) -> message or None`` (see above)."""
    _internal_error_readers.append(reader)


def _first_answer(callables, error):
    """(the first of ``callables`` whose answer to ``error`` is not None, that answer), or
    (None, None)."""
    for c in callables:
        answer = c(error)
        if answer is not None:
            return c, answer
    return None, None


def _wrapped_internal_error(error):
    return _first_answer(_internal_error_readers, error)[1]


# Handlers of errors a reset can recover from on the rank that raised them (adaptive
# training's out-of-memory back-off): ``handler(exception)`` returns why (a message) when it
# took the error as its own and prepared the retry, else None; ``release()`` of the same
# object, if it has one, runs once the exception and its frames are gone.
_recoverable_error_handlers = []


def add_recoverable_error_handler(handler):
    """Registers ``handler`` (see above)."""
    _recoverable_error_handlers.append(handler)


def _recoverable(error):
    """(why, the handler's release or None) of the handler that took ``error``, or (None,
    None)."""
    handler, why = _first_answer(_recoverable_error_handlers, error)
    return why, getattr(handler, "release", None)


def run(func):
    """Decorates ``func(state, *args, **kwargs)``: on HorovodInternalError (also as a framework
    wraps it, see ``add_internal_error_reader``) the state is restored to its last commit, on HostsUpdatedInterrupt it is kept; either way the job
    re-forms (hvd.shutdown, the driver's next round, hvd.init), the state is synced from rank
    0 (unless the interrupt says it need not be), the reset callbacks run, and ``func`` is
    called again. An error that a registered handler recovers from (an out-of-memory error
    in adaptive training, see ``add_recoverable_error_handler``) is a reset of the same kind
    as a HorovodInternalError, started by the rank that raised it: its shutdown fails the
    other ranks' collectives, so they reset with it. Returns ``func``'s value."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            release = None
            try:
                # The sync is a collective too: a rank lost during it (right after a round
                # formed) resets like one lost while training (Horovod's sync is outside its
                # try: the survivors exit; the chaos campaign found that).
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                state.restore()
                skip_sync = False
                why = "HorovodInternalError: %s" % e
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
                why = "hosts updated"
            except Exception as e:  # noqa: B902 (a framework's wrapping of the two above)
                message = _wrapped_internal_error(e)
                if message is None:
                    why, release = _recoverable(e)
                    if why is None:
                        raise
                else:
                    state.restore()
                    why = "HorovodInternalError: %s" % message
                skip_sync = False
            if release is not None:
                # Out of the except clause: the exception's frames (a failed step's
                # activations) are gone, and what they held can be released before the
                # restore needs memory of its own.
                release()
                state.restore()
            worker().request_reset(why)
            basics.shutdown()
            basics.init()
            state.on_reset()
    return wrapper
