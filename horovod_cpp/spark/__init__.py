"""Running horovod_cpp from Spark: ``HorovodRunner(np=N).run(main, **kwargs)`` as in
Databricks' sparkdl, ``run(fn, args, kwargs, num_proc)`` as ``horovod.spark.run`` (every rank's
value), ``run_elastic(fn, args, kwargs, num_proc, min_np, max_np)`` as
``horovod.spark.run_elastic`` (a lost executor shrinks the job, a returning one grows it), and
``log_to_driver`` for messages from the ranks."""
from horovod_cpp.job.service import HorovodRunnerError, RankError  # noqa: F401
from horovod_cpp.spark.runner import HorovodRunner, run  # noqa: F401


def run_elastic(*args, **kwargs):
    """``horovod.spark.run_elastic``: see horovod_cpp.spark.elastic.run_elastic."""
    from horovod_cpp.spark.elastic import run_elastic as _run_elastic
    return _run_elastic(*args, **kwargs)


def log_to_driver(message):
    """Sends ``message`` from a rank to the HorovodRunner driver (printed there whatever
    driver_log_verbosity is; truncated to 4000 characters)."""
    from horovod_cpp.job import rank_main
    rank_main.log_to_driver(message)


__all__ = ["HorovodRunner", "HorovodRunnerError", "RankError", "log_to_driver", "run",
           "run_elastic"]
