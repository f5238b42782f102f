"""Gradient compression, above the collectives (as ``horovod.torch.compression``): the cast
codecs (``casts``) and PowerSGD (``powersgd``). The collectives take any object with
``compress``/``decompress`` and name none of them::

    hvd.allreduce(t, compression=hvd.Compression.fp16)
    hvd.DistributedOptimizer(opt, compression=hvd.Compression.powersgd(
        matrix_approximation_rank=2))
"""
from horovod_cpp.torch.compression.casts import (BF16Compressor, CastCompressor, Compressor,
                                                 FP16Compressor, NoneCompressor)
from horovod_cpp.torch.compression.powersgd import PowerSGD


def _powersgd(**kwargs):
    """PowerSGD low-rank compression of an optimizer's gradients (``compression.powersgd``):
    ``DistributedOptimizer(opt, compression=Compression.powersgd(matrix_approximation_rank=2,
    start_powerSGD_iter=10))``. One instance per optimizer (it keeps state per gradient)."""
    return PowerSGD(**kwargs)


class Compression:
    """The compression algorithms to choose from: ``Compression.none``, ``Compression.fp16``,
    ``Compression.bf16``, and for DistributedOptimizer ``Compression.powersgd(...)``."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    powersgd = staticmethod(_powersgd)


__all__ = ["Compression", "Compressor", "NoneCompressor", "CastCompressor", "FP16Compressor",
           "BF16Compressor", "PowerSGD"]
