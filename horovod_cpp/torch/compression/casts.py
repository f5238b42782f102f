"""The cast codecs: tensors travel as they are (``NoneCompressor``), or their floating-point
values as float16 / bfloat16 and back (as Horovod's ``Compression.fp16``)."""
import torch

from horovod_cpp.common.compression import Compressor, NoneCompressor  # noqa: F401


class CastCompressor(Compressor):
    """Floating-point tensors travel as ``wire_dtype`` and come back in their own dtype; other
    tensors travel as they are."""
    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        tensor_compressed = tensor
        if tensor.dtype.is_floating_point:
            tensor_compressed = tensor.type(cls.wire_dtype)
        return tensor_compressed, tensor.dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        tensor_decompressed = tensor
        if ctx.is_floating_point:
            tensor_decompressed = tensor.type(ctx)
        return tensor_decompressed

    # DistributedOptimizer's path (the optimizer keeps one wire buffer per gradient): compress
    # into that buffer and decompress into the gradient itself, so that no tensor is allocated
    # (and its pages zeroed) twice a step; the values are those of compress/decompress.
    @classmethod
    def compress_into(cls, tensor, wire):
        """(the tensor to send, ctx) as compress(tensor), written into ``wire`` (None, or
        what an earlier call returned for this gradient) when it fits."""
        if not tensor.dtype.is_floating_point:
            return tensor, tensor.dtype
        if wire is None or wire.shape != tensor.shape or wire.dtype != cls.wire_dtype:
            wire = torch.empty(tensor.shape, dtype=cls.wire_dtype)
        wire.copy_(tensor)
        return wire, tensor.dtype

    @staticmethod
    def decompress_into(tensor, ctx, out):
        """Writes decompress(tensor, ctx) into ``out`` (the gradient compress_into read)."""
        if tensor is not out:
            out.copy_(tensor)


class FP16Compressor(CastCompressor):
    """Floating-point tensors travel as float16 and come back in their own dtype."""
    wire_dtype = torch.float16


class BF16Compressor(CastCompressor):
    """Floating-point tensors travel as bfloat16 (float32's range, 8 bits of mantissa: no
    overflow where float16 would need a loss scale) and come back in their own dtype."""
    wire_dtype = torch.bfloat16
