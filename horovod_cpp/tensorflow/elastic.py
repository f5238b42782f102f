"""``hvd.elastic`` for TensorFlow, as ``horovod.tensorflow.elastic``::

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...
        state.commit()

``TensorFlowState`` keeps a list of ``tf.Variable`` objects, ``TensorFlowKerasState`` a Keras
model's and optimizer's variables (``model.variables``, ``optimizer.variables``), plus any
picklable attributes: commit copies the values to host memory, restore assigns them back, sync
broadcasts them from rank 0 in one fused operation. ``run`` is horovod_cpp's shared one
(horovod_cpp.common.elastic): restore on a failure, keep on a host update, re-form the job in
process, sync, call again.
"""
from horovod_cpp.common.elastic import (ModelState, ObjectState, State,  # noqa: F401
                                        VariablesState, run)
from horovod_cpp.elastic import HostsUpdatedInterrupt  # noqa: F401
from horovod_cpp.tensorflow.basics import HorovodInternalError  # noqa: F401
from horovod_cpp.tensorflow.collectives import broadcast_


class TensorFlowState(VariablesState):
    """A list of ``tf.Variable`` objects (``variables``) plus any picklable attributes."""

    def __init__(self, variables=None, **kwargs):
        self._tf_variables = list(variables or [])
        super().__init__(**kwargs)

    def _variables(self):
        return self._tf_variables

    def _read(self, var):
        return var.numpy()

    def _broadcast(self, variables):
        broadcast_(variables, 0, name="elastic.variables")


class TensorFlowKerasState(ModelState):
    """A Keras model's and optimizer's variables plus any picklable attributes (the
    optimizer's read at each commit, restore and sync: Keras builds them at the first step)."""
    _read = TensorFlowState._read
    _broadcast = TensorFlowState._broadcast


__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState",
           "HostsUpdatedInterrupt", "HorovodInternalError"]
