"""``hvd.elastic``: training that survives ranks leaving and joining, as in horovod.torch.elastic::

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()      # every few steps: a point to roll back to

    train(state)

Run under ``hvdrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh python train.py``.
When a rank fails, the others get HorovodInternalError: ``run`` restores the last commit, the
job re-forms without the lost ranks (the processes stay), rank 0 broadcasts the state, and
``train`` is called again. When hosts are added, the next ``commit``/``check_host_updates``
raises HostsUpdatedInterrupt on every rank and the job re-forms with them.
"""
import functools

from horovod_cpp.elastic import HostsUpdatedInterrupt, worker
from horovod_cpp.torch import basics
from horovod_cpp.torch.basics import HorovodInternalError
from horovod_cpp.torch.elastic.sampler import ElasticSampler
from horovod_cpp.torch.elastic.state import ObjectState, State, TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError"]


def run(func):
    """Decorates ``func(state, *args, **kwargs)``: on HorovodInternalError the state is
    restored to its last commit, on HostsUpdatedInterrupt it is kept; either way the job
    re-forms (hvd.shutdown, the driver's next round, hvd.init), the state is synced from rank
    0 (unless the interrupt says it need not be), the reset callbacks run, and ``func`` is
    called again. Returns ``func``'s value."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
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
            worker().request_reset(why)
            basics.shutdown()
            basics.init()
            state.on_reset()
    return wrapper
