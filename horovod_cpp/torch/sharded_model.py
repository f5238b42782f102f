"""Old module path of stage 3 (``shard_model``, ``FullyShardedOptimizer``), kept for one
release: the code lives in ``horovod_cpp.torch.sharding``."""
from horovod_cpp.torch.sharding import (FullyShardedOptimizer, ShardedModel,  # noqa: F401
                                        shard_model, sharding_of)
