"""HorovodRunner: run a function on N horovod_cpp ranks from a Spark driver.

np > 0: a Spark barrier stage of np tasks; task 0 gathers the tasks' addresses and starts the
ranks with mpirun, whose daemons are started inside the barrier tasks through an rsh agent
(no ssh needed). np < 0: -np ranks on the driver, no Spark job. Either way ``main`` and its
kwargs travel with cloudpickle and rank 0's return value comes back.

The driver runs a small authenticated service (``JobService``) that hands out the pickled
function and receives rank 0's result, rank errors with their tracebacks, log_to_driver
messages, the ranks' output (driver_log_verbosity="all") and how mpirun ended.
"""
import os
import pickle
import re
import sys
import threading
import uuid

import cloudpickle

from horovod_cpp.runner import mpirun
from horovod_cpp.spark import network


class HorovodRunnerError(RuntimeError):
    """The job failed without a Python exception on a rank (a crash, a launch problem, a
    failed Spark job)."""


class RankError(HorovodRunnerError):
    """A rank raised an exception. ``rank``, ``exc_type`` (the remote exception's type name)
    and ``remote_traceback`` tell where; ``__cause__`` is the remote exception itself when it
    could be unpickled on the driver."""

    def __init__(self, rank, exc_type, message, remote_traceback):
        self.rank = rank
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        super().__init__("rank %d raised %s: %s\n\nTraceback on rank %d:\n%s"
                         % (rank, exc_type, message, rank, remote_traceback.rstrip()))


VERBOSITIES = ("all", "log_callback_only")


class HorovodRunner(object):
    """HorovodRunner(*, np, driver_log_verbosity="log_callback_only"), as in Databricks'
    sparkdl: ``np > 0`` runs np ranks as Spark barrier tasks, ``np < 0`` runs -np ranks on the
    driver. ``driver_log_verbosity="all"`` streams every rank's output to the driver;
    ``"log_callback_only"`` only what the ranks send with ``log_to_driver``."""

    def __init__(self, *, np, driver_log_verbosity="log_callback_only"):
        if isinstance(np, bool) or not isinstance(np, int):
            raise TypeError("np must be an int, got %r" % (np,))
        if np == 0:
            raise ValueError(
                "HorovodRunner(np=0) is not supported: use np > 0 to run np ranks as Spark "
                "barrier tasks on the cluster, or np < 0 to run -np ranks on the driver only "
                "(e.g. np=-2 for debugging)")
        if driver_log_verbosity not in VERBOSITIES:
            raise ValueError("driver_log_verbosity must be 'all' or 'log_callback_only', got %r"
                             % (driver_log_verbosity,))
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity

    def run(self, main, **kwargs):
        """Runs ``main(**kwargs)`` on every rank; returns rank 0's return value."""
        payload = pickle_main(main, kwargs)
        key = network.new_key()
        job = JobService(key, payload, stream=self.driver_log_verbosity == "all")
        try:
            if self.num_processor < 0:
                self._run_on_driver(job, key)
            else:
                self._run_on_spark(job, key)
            return job.outcome()
        finally:
            job.stop()

    # ---- np < 0: ranks on the driver ----------------------------------------------------------

    def _run_on_driver(self, job, key):
        np = -self.num_processor
        env = dict(os.environ)
        env.update({"HVD_SPARK_JOB": "127.0.0.1:%d" % job.port, "HVD_SPARK_KEY": key.hex()})
        argv = mpirun.build_command(
            np, [sys.executable, "-m", "horovod_cpp.spark.rank_main"],
            env=mpirun.horovod_env(), passthrough=["HVD_SPARK_JOB", "HVD_SPARK_KEY"],
            oversubscribe=np > (os.cpu_count() or 1), mpirun=mpirun.find_mpirun())
        job.launch(argv, env)

    # ---- np > 0: a Spark barrier stage ------------------------------------------------------

    def _run_on_spark(self, job, key):
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is None:
            raise HorovodRunnerError(
                "HorovodRunner(np=%d) needs an active SparkSession (or use np=%d to run the "
                "ranks on the driver)" % (self.num_processor, -self.num_processor))
        np = self.num_processor
        conf = sc.getConf()
        if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
            raise HorovodRunnerError(
                "HorovodRunner needs Spark barrier mode, which does not support dynamic "
                "resource allocation (SPARK-24942): set spark.dynamicAllocation.enabled=false")
        slots = _task_slots(sc)
        if slots < np:
            raise HorovodRunnerError(
                "HorovodRunner(np=%d) needs %d task slots at the same time (Spark barrier mode), "
                "but this Spark cluster has %d (master %s, spark.task.cpus=%s). Use np <= %d, "
                "add executors, or use np=%d to run the ranks on the driver."
                % (np, np, slots, sc.master, conf.get("spark.task.cpus", "1"), slots, -np))
        spec = {
            "np": np,
            "job": "%s:%d" % (conf.get("spark.driver.host", "127.0.0.1"), job.port),
            "key": key,
            "env": mpirun.horovod_env(),
            "stream": self.driver_log_verbosity == "all",
            "host_per_task": os.environ.get("HVD_SPARK_HOST_SALT") == "task",
            "mpi_args": os.environ.get("HVD_SPARK_MPI_ARGS", "").split(),
        }
        group = "horovod_cpp-%s" % uuid.uuid4().hex[:12]
        failure = []

        def spark_job():
            try:
                sc.setJobGroup(group, "HorovodRunner(np=%d)" % np, interruptOnCancel=True)
                rdd = sc.parallelize(range(np), np).barrier()
                rdd.mapPartitions(_checked_task(spec)).collect()
            except BaseException as e:  # reported below
                failure.append(e)

        thread = threading.Thread(target=spark_job, name="hvd-spark-job", daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.2)
        except BaseException:
            sc.cancelJobGroup(group)
            thread.join(30)
            raise
        if failure and not job.has_outcome():
            reason = _spark_reason(failure[0])
            missing = re.search(_NO_HOROVOD_CPP + r" (\S+) \(([^\n]*)\)", str(failure[0]))
            if missing:
                raise HorovodRunnerError(
                    "the Spark executors' Python, %s, cannot import horovod_cpp (%s). Install "
                    "horovod_cpp into that Python on every executor, or point the executors "
                    "at a Python that has it: set PYSPARK_PYTHON (or spark.pyspark.python) "
                    "before the SparkSession starts; this driver runs %s"
                    % (missing.group(1), missing.group(2).strip(), sys.executable)) from None
            raise HorovodRunnerError("the Spark barrier job failed: %s" % reason) from failure[0]


_NO_HOROVOD_CPP = "horovod_cpp is not importable in the executor Python"


def _checked_task(spec):
    """The barrier tasks' function. It travels by value (it refers to no module of
    horovod_cpp), so an executor whose Python lacks horovod_cpp reaches its first line and
    reports that, instead of failing to unpickle with a long Java stack trace."""
    marker = _NO_HOROVOD_CPP

    def run(partition):
        import sys as _sys
        try:
            from horovod_cpp.spark import task as _task
        except ImportError as e:
            raise RuntimeError("%s %s (%s: %s)" % (marker, _sys.executable, type(e).__name__, e))
        return _task.barrier_task(spec)(partition)

    return run


def pickle_main(main, kwargs, caller="HorovodRunner.run"):
    """cloudpickle (main, kwargs) on the driver, naming what cannot be pickled."""
    if not callable(main):
        raise TypeError("main must be callable, got %r" % (main,))
    try:
        return cloudpickle.dumps((main, kwargs))
    except Exception as e:  # find the culprit for the message
        what = None
        try:
            cloudpickle.dumps(main)
        except Exception as inner:
            what, e = "the function %s" % getattr(main, "__qualname__", repr(main)), inner
        if what is None:
            for name, value in kwargs.items():
                try:
                    cloudpickle.dumps(value)
                except Exception as inner:
                    what, e = "keyword argument %r (%s)" % (name, type(value).__name__), inner
                    break
        raise pickle.PicklingError(
            "%s: could not pickle %s with cloudpickle: %s: %s. Everything main "
            "uses travels to the ranks; create such objects (and do imports) inside main."
            % (caller, what or "main and its arguments", type(e).__name__, e)) from e


def _task_slots(sc):
    """How many tasks the cluster can run at once."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().resourceProfileFromId(0)
        slots = int(jsc.maxNumConcurrentTasks(profile))
        if slots > 0:
            return slots
    except Exception:  # private API; fall back below
        pass
    return int(sc.defaultParallelism)


def _spark_reason(exc):
    """The useful part of a Py4J/Spark error: the Python traceback of the failed task, or the
    first line."""
    text = str(exc)
    m = re.search(r"(Traceback \(most recent call last\):.*?)(?:\n\s+at |\n\tat |\Z)", text, re.S)
    if m:
        return m.group(1).strip()
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _result_dict(result):
    return {"returncode": result.returncode, "description": result.describe()}


class JobService(object):
    """The driver's end: payload out; results, errors, logs and the launcher's status in.
    ``ranks``: None, rank 0's value is the outcome (HorovodRunner); N, the list of all N
    ranks' values (horovod_cpp.runner.run, whose ranks all report)."""

    def __init__(self, key, payload, stream, ranks=None):
        self._payload = payload
        self._stream = stream
        self._ranks = ranks
        self._lock = threading.Lock()
        self._results = {}
        self._errors = []
        self._launcher = None
        self._print_lock = threading.Lock()
        self._service = network.Service(key, self._handle)
        self.port = self._service.port

    def stop(self):
        self._service.stop()

    def _handle(self, sock, message):
        kind = message.get("type")
        reply = "ok"
        if kind == "payload":
            reply = self._payload
        elif kind == "log":
            self._print(message["message"])
        elif kind == "output":
            for rank, stream, text in message["lines"]:
                self.output_line(rank, stream, text)
        elif kind == "result":
            with self._lock:
                self._results[message["rank"]] = message["value"]
        elif kind == "error":
            with self._lock:
                self._errors.append(message)
        elif kind == "launcher":
            self.set_launcher(message["result"])
        network.send(sock, self._service.key, reply)

    def _print(self, text):
        with self._print_lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def output_line(self, rank, stream, text):
        if not self._stream:
            return
        self._print(text if rank is None else "[%d]<%s>:%s" % (rank, stream, text))

    def launch(self, argv, env):
        """Runs mpirun (``argv``) here, its output to output_line; records how it ended."""
        launch = mpirun.Launch(argv, self.output_line, env=env)
        try:
            result = launch.wait()
        except BaseException:
            launch.terminate()
            raise
        self.set_launcher(_result_dict(result))

    def set_launcher(self, result):
        with self._lock:
            self._launcher = result

    def has_outcome(self):
        with self._lock:
            return bool(self._errors) or self._launcher is not None

    def outcome(self):
        with self._lock:
            errors, launcher, results = list(self._errors), self._launcher, dict(self._results)
        if errors:
            first = errors[0]
            error = RankError(first["rank"], first["exc_type"], first["message"],
                              first["traceback"])
            cause = None
            if first.get("exception") is not None:
                try:
                    cause = cloudpickle.loads(first["exception"])
                except Exception:
                    cause = None
            raise error from cause
        if launcher is None:
            raise HorovodRunnerError("the job ended without a report from its launcher")
        if launcher["returncode"] != 0:
            raise HorovodRunnerError(launcher["description"])
        if self._ranks is not None:
            missing = [r for r in range(self._ranks) if r not in results]
            if missing:
                raise HorovodRunnerError("rank(s) %s exited without returning a value"
                                         % ", ".join(map(str, missing)))
            return [cloudpickle.loads(results[r]) for r in range(self._ranks)]
        if 0 not in results:
            raise HorovodRunnerError("rank 0 exited without returning a value from main")
        return cloudpickle.loads(results[0])
