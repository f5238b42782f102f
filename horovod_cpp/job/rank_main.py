"""One HorovodRunner (or horovod_cpp.runner.run) rank, started by mpirun or hvdrun's Gloo and
elastic launchers: fetch the pickled function from the driver, call it, and report rank 0's
return value (every rank's with HVD_SPARK_ALL_RESULTS=1) or this rank's exception with its
traceback. The rank reported is the one the rank holds when the function returns (in an
elastic job, its rank in the last round).

    python -m horovod_cpp.job.rank_main      (HVD_SPARK_JOB, HVD_SPARK_KEY in the environment)
"""
import os
import sys
import traceback

import cloudpickle

from horovod_cpp.job import proc
from horovod_cpp.job import network, sources

_job = None  # (address, key, rank) while running under HorovodRunner


def _report_error(address, key, rank, exc, text):
    try:
        pickled = cloudpickle.dumps(exc)
        cloudpickle.loads(pickled)
    except Exception:
        pickled = None
    try:
        network.request(address, key, {"type": "error", "rank": rank,
                                       "exc_type": type(exc).__name__, "message": str(exc),
                                       "traceback": text, "exception": pickled})
    except OSError as e:
        sys.stderr.write("horovod_cpp: could not report the error to the driver: %s\n" % e)
    sys.stderr.write(text)


def _use_task_gpus(rank):
    """Under Spark with GPU resources: CUDA_VISIBLE_DEVICES from the tasks' GPU addresses
    (task._layout), before anything can initialise CUDA; this task's own addresses in
    HVD_SPARK_TASK_GPUS."""
    table = os.environ.get("HVD_SPARK_RANK_GPUS")
    if not table:
        return
    import json
    mine = json.loads(table)[rank]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine["visible"])
    os.environ["HVD_SPARK_TASK_GPUS"] = ",".join(mine["own"])


def _rank_now(default):
    """This process's rank now: the runtime's, where the function left horovod_cpp running
    (an elastic job's rank changes between rounds), else ``default``."""
    torch_api = sys.modules.get("horovod_cpp.torch")
    try:
        if torch_api is not None and torch_api.is_initialized():
            return int(torch_api.rank())
    except Exception:  # a runtime that stopped with an error
        pass
    return default


def main():
    proc.watch_parent()  # orted killed: do not linger
    # Whole lines reach mpirun (it tags chunks, not lines) and the driver sees them promptly.
    sys.stdout.reconfigure(line_buffering=True)
    address = os.environ["HVD_SPARK_JOB"]
    key = bytes.fromhex(os.environ["HVD_SPARK_KEY"])
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "0")))
    _use_task_gpus(rank)
    # Run as __main__, this file is not the module log_to_driver imports: set the context there.
    import horovod_cpp.job.rank_main as module
    module._job = (address, key, rank)
    try:
        fn, kwargs, recorded = cloudpickle.loads(network.request(address, key,
                                                                 {"type": "payload"}))
        sources.restore(fn, recorded)  # the user's file names in tracebacks (cloudpickle 3.1+)
        value = fn(**kwargs)
    except SystemExit:
        raise
    except BaseException as e:
        _report_error(address, key, _rank_now(rank), e, traceback.format_exc())
        return 1
    rank = _rank_now(rank)
    # HorovodRunner wants rank 0's value; horovod_cpp.runner.run every rank's.
    if rank == 0 or os.environ.get("HVD_SPARK_ALL_RESULTS") == "1":
        try:
            data = cloudpickle.dumps(value)
        except Exception as e:
            err = TypeError("the return value of main (%s) is not cloudpickle-serializable: %s"
                            % (type(value).__name__, e))
            _report_error(address, key, rank, err, "%s: %s\n" % (type(err).__name__, err))
            return 1
        network.request(address, key, {"type": "result", "rank": rank, "value": data})
    return 0


def log_to_driver(message):
    """Sends ``message`` (truncated to 4000 characters) to the HorovodRunner driver, which
    prints it whatever driver_log_verbosity is. Outside HorovodRunner it is printed."""
    text = str(message)[:4000]
    if _job is None:
        print(text, flush=True)
        return
    address, key, rank = _job
    try:
        network.request(address, key, {"type": "log", "rank": rank, "message": text})
    except OSError as e:
        sys.stderr.write("horovod_cpp: log_to_driver failed: %s\n" % e)


if __name__ == "__main__":
    sys.exit(main())
