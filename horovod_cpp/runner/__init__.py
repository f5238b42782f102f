"""Launching horovod_cpp jobs: the ``hvdrun`` command and the mpirun logic it shares with
``horovod_cpp.spark.HorovodRunner``."""
from horovod_cpp.runner.launch import main  # noqa: F401
