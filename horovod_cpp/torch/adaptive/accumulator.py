"""Accumulator: metrics summed over the ranks (AdaptDL's ``adaptdl.torch.Accumulator``)::

    accum = Accumulator()
    accum["loss_sum"] += loss.item() * len(batch)   # this rank's part
    accum["total"] += len(batch)
    with accum.synchronized():                      # collective: every rank enters it
        print(accum["loss_sum"] / accum["total"])   # the sums over every rank
    accum.reset()

Outside ``synchronized()`` a value is the last synchronized sum plus this rank's updates since;
inside, the sums over every rank (the updates of every rank gathered once on entry). Its
state_dict (the synchronized sums; synchronize before saving) holds plain numbers."""
import contextlib

from horovod_cpp.torch.functions import allgather_object


class Accumulator(object):
    def __init__(self):
        self._synced = {}
        self._updates = {}
        self._in_sync = False

    def __getitem__(self, key):
        if self._in_sync:
            return self._synced.get(key, 0)
        return self._synced.get(key, 0) + self._updates.get(key, 0)

    def __setitem__(self, key, value):
        if self._in_sync:
            raise RuntimeError("Accumulator: values are read-only inside synchronized()")
        self._updates[key] = value - self._synced.get(key, 0)

    def __contains__(self, key):
        return key in self._synced or key in self._updates

    def keys(self):
        return sorted(set(self._synced) | set(self._updates))

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def update(self, values):
        for k, v in dict(values).items():
            self[k] = self[k] + v

    @contextlib.contextmanager
    def synchronized(self):
        """Collective: adds every rank's updates into the sums, which reads then return."""
        gathered = allgather_object(self._updates, name="adaptive.accumulator")
        for updates in gathered:
            for k, v in updates.items():
                self._synced[k] = self._synced.get(k, 0) + v
        self._updates = {}
        self._in_sync = True
        try:
            yield self
        finally:
            self._in_sync = False

    def reset(self):
        """Forgets every value (local: call it on every rank)."""
        self._synced, self._updates = {}, {}

    def state_dict(self):
        return {"synced": dict(self._synced), "updates": dict(self._updates)}

    def load_state_dict(self, state):
        self._synced = dict(state["synced"])
        self._updates = dict(state.get("updates", {}))
