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
from horovod_cpp.common.elastic import run
from horovod_cpp.elastic import HostsUpdatedInterrupt
from horovod_cpp.torch.basics import HorovodInternalError
from horovod_cpp.torch.elastic.sampler import ElasticSampler
from horovod_cpp.torch.elastic.state import ObjectState, State, TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError"]


