"""Launching horovod_cpp jobs: the ``hvdrun`` command (MPI, Gloo, elastic) and ``run`` (a
Python function on N ranks, like ``horovod.run``). What they share with the Spark runners (the
mpirun command, the job service, the rank main) is in ``horovod_cpp.job``, below both."""
from horovod_cpp.runner.api import run  # noqa: F401
from horovod_cpp.runner.launch import main  # noqa: F401
