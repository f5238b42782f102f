"""Gradient compression for the wire, as Horovod's ``horovod.tensorflow.compression``:
``Compression.none``, ``Compression.fp16`` and ``Compression.bf16`` (floating-point tensors
travel as float16 / bfloat16 and come back in their own dtype; others travel as they are)."""
import tensorflow as tf

from horovod_cpp.common.compression import Compressor, NoneCompressor  # noqa: F401


class CastCompressor(Compressor):
    """Floating-point tensors travel as ``wire_dtype`` and come back in their own dtype."""
    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype.is_floating and tensor.dtype != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16Compressor(CastCompressor):
    """Floating-point tensors travel as float16."""
    wire_dtype = tf.float16


class BF16Compressor(CastCompressor):
    """Floating-point tensors travel as bfloat16 (float32's range, 8 bits of mantissa)."""
    wire_dtype = tf.bfloat16


class Compression:
    """The codecs by name: ``none``, ``fp16``, ``bf16``."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["Compression", "Compressor", "NoneCompressor", "CastCompressor", "FP16Compressor",
           "BF16Compressor"]
