"""horovod_cpp: Horovod-style distributed training with a C++17 core.

Use ``import horovod_cpp.torch as hvd`` as a drop-in for ``horovod.torch``.
"""
__version__ = "0.1.0"
