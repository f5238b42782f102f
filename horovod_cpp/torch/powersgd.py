"""The old module path of PowerSGD, kept for one release (0.1.x); it goes in 0.2. PowerSGD
is ``horovod_cpp.torch.compression.powersgd`` (``hvd.Compression.powersgd(...)``)."""
from horovod_cpp.torch.compression.powersgd import *  # noqa: F401,F403
from horovod_cpp.torch.compression.powersgd import (LowRankReduction, PowerSGD,  # noqa: F401
                                                    low_rank_product, matrix_rank, q_seed)
