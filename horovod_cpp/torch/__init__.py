"""``import horovod_cpp.torch as hvd``: a drop-in for ``horovod.torch``.

    hvd.init()
    model = ...
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Run with ``mpirun -np N python train.py``.
"""
from horovod_cpp.torch.basics import (Adasum, Average, HorovodInternalError,
                                      HorovodNotSupportedError, HorovodPreconditionError, Max,
                                      Min, Product, Sum, ccl_built, cross_rank, cross_size,
                                      cuda_built, ddl_built, gloo_built, gloo_enabled, init,
                                      is_initialized, local_rank, local_size, mpi_built,
                                      mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                      rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod_cpp.torch.collectives import (allgather, allgather_async, allreduce, allreduce_,
                                           allreduce_async, allreduce_async_, alltoall,
                                           alltoall_async, barrier, broadcast, broadcast_,
                                           broadcast_async, broadcast_async_, grouped_allgather,
                                           grouped_allgather_async, grouped_allreduce,
                                           grouped_allreduce_, grouped_allreduce_async,
                                           grouped_allreduce_async_, grouped_reducescatter,
                                           grouped_reducescatter_async, join, reducescatter,
                                           reducescatter_async, sparse_allreduce_async)
from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.functions import (allgather_object, broadcast_object,
                                         broadcast_optimizer_state, broadcast_parameters)
from horovod_cpp.torch.tensor_bridge import poll, synchronize
from horovod_cpp.torch.optimizer import DistributedOptimizer
from horovod_cpp.torch.sharding import (ShardedOptimizer, dcp, shard_model, sharded_init,
                                        sharding_of)
from horovod_cpp.torch.process_sets import (ProcessSet, add_process_set, global_process_set,
                                            remove_process_set)
from horovod_cpp.torch.sync_batch_norm import SyncBatchNorm
from horovod_cpp.torch import elastic  # noqa: E402  (hvd.elastic)
from horovod_cpp.elastic import HostsUpdatedInterrupt
from horovod_cpp.torch import distributed as _c10d_backend

_c10d_backend.register()  # torch.distributed.init_process_group("horovod_cpp")

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "gloo_built", "gloo_enabled", "nccl_built", "cuda_built", "rocm_built", "ccl_built",
    "ddl_built", "Average", "Sum", "Adasum", "Min", "Max", "Product", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "poll", "synchronize", "join", "barrier", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set", "start_timeline",
    "stop_timeline", "HorovodInternalError", "HorovodNotSupportedError",
    "HorovodPreconditionError", "Compression", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object", "DistributedOptimizer",
    "ShardedOptimizer", "dcp", "shard_model", "sharded_init", "sharding_of",
    "SyncBatchNorm", "elastic", "HostsUpdatedInterrupt",
]
