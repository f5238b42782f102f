"""Old module path of ``ShardedOptimizer`` (stages 1-2), kept for one release: the code lives
in ``horovod_cpp.torch.sharding``."""
from horovod_cpp.torch.sharding import ShardedOptimizer  # noqa: F401
from horovod_cpp.torch.sharding.common import (check_gradient,  # noqa: F401
                                               clip_slices_by_global_norm, is_element_state,
                                               nonfinite_flag_grad)
from horovod_cpp.torch.sharding.flat import shard_range  # noqa: F401
from horovod_cpp.torch.grad_hooks import register_grad_ready_hook  # noqa: F401
