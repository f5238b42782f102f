"""Launching horovod_cpp jobs: the ``hvdrun`` command, ``run`` (a Python function on N ranks,
like ``horovod.run``) and the mpirun logic they share with ``horovod_cpp.spark.HorovodRunner``."""
from horovod_cpp.runner.api import run  # noqa: F401
from horovod_cpp.runner.launch import main  # noqa: F401
