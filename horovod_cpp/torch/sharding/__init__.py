"""Sharded training (ZeRO 1-3) on horovod_cpp's runtime.

    optimizer = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=2)
    model = hvd.shard_model(model, auto_wrap={Block})                      # stage 3
    optimizer = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=3)

One concept per module, each importing only the ones before it:

* ``common``: the gradient checks, the non-finite flag, clipping by the global norm;
* ``flat``: the flat-parameter storage (a bucket of stages 1-2, a unit's buffer of stage 3);
* ``deferred``: a model built on the meta device, initialised module by module into its slices;
* ``elastic``: commits with a replica on another host, and the reshard after a resize;
* ``optimizer``: ``ShardedOptimizer``, stages 1 and 2;
* ``model``: ``shard_model``, the stage-3 model wrapper and its hooks;
* ``stage3``: stage 3's optimizer, registered as ``ShardedOptimizer``'s stage 3;
* ``dcp``: checkpoints of the models and optimizers above in PyTorch's distributed-checkpoint
  format (``hvd.dcp.save`` / ``hvd.dcp.load``).
"""
from horovod_cpp.torch.sharding.optimizer import ShardedOptimizer
from horovod_cpp.torch.sharding.deferred import sharded_init
from horovod_cpp.torch.sharding.model import ShardedModel, shard_model, sharding_of
from horovod_cpp.torch.sharding.stage3 import FullyShardedOptimizer
from horovod_cpp.torch.sharding import dcp

__all__ = ["dcp", "ShardedOptimizer", "FullyShardedOptimizer", "ShardedModel", "shard_model",
           "sharded_init", "sharding_of"]
