"""Running horovod_cpp from Spark: ``HorovodRunner(np=N).run(main, **kwargs)`` as in
Databricks' sparkdl, ``run(fn, args, kwargs, num_proc)`` as ``horovod.spark.run`` (every rank's
value), and ``log_to_driver`` for messages from the ranks."""
from horovod_cpp.job.service import HorovodRunnerError, RankError  # noqa: F401
from horovod_cpp.spark.runner import HorovodRunner, run  # noqa: F401


def log_to_driver(message):
    """Sends ``message`` from a rank to the HorovodRunner driver (printed there whatever
    driver_log_verbosity is; truncated to 4000 characters)."""
    from horovod_cpp.job import rank_main
    rank_main.log_to_driver(message)


__all__ = ["HorovodRunner", "HorovodRunnerError", "RankError", "log_to_driver", "run"]
