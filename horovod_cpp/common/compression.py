"""The codec interface every face's ``Compression`` implements (Horovod's
``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)``), and the codec that sends
tensors as they are."""


class Compressor:
    """Interface for compressing and decompressing a tensor."""

    @staticmethod
    def compress(tensor):
        """Returns the tensor to send and a context for decompress."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Restores a tensor received from the other ranks."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
