"""HorovodRunner: run a function on N horovod_cpp ranks from a Spark driver.

np > 0: a Spark barrier stage of np tasks; task 0 gathers the tasks' addresses and starts the
ranks with mpirun, whose daemons are started inside the barrier tasks through an rsh agent
(no ssh needed). np < 0: -np ranks on the driver, no Spark job. Either way ``main`` and its
kwargs travel with cloudpickle and rank 0's return value comes back.

The driver runs a small authenticated service (``JobService``) that hands out the pickled
function and receives rank 0's result, rank errors with their tracebacks, log_to_driver
messages, the ranks' output (driver_log_verbosity="all") and how mpirun ended.
"""
import functools
import os
import re
import shlex
import sys
import threading
import time
import uuid

from horovod_cpp.job import mpirun, network
from horovod_cpp.job.script import as_main
from horovod_cpp.job.service import (HorovodRunnerError, JobService, check_positive_ints,
                                     pickle_main)


VERBOSITIES = ("all", "log_callback_only")


class HorovodRunner(object):
    """``HorovodRunner(*, np, driver_log_verbosity="log_callback_only")``, as in Databricks'
    sparkdl: ``np > 0`` runs np ranks as Spark barrier tasks, ``np < 0`` runs -np ranks on the
    driver. ``driver_log_verbosity="all"`` streams every rank's output to the driver;
    ``"log_callback_only"`` only what the ranks send with ``log_to_driver``.
    ``start_timeout`` (seconds; default HOROVOD_SPARK_START_TIMEOUT, else 600; not in sparkdl):
    how long ``run`` waits for np free task slots and the barrier stage's start."""

    def __init__(self, *, np, driver_log_verbosity="log_callback_only", start_timeout=None):
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
        self.start_timeout = start_timeout
        if start_timeout is not None:
            resolve_start_timeout(start_timeout)  # validated now, not at run()

    def run(self, main, *args, **kwargs):
        """Runs ``main(**kwargs)`` on every rank and returns rank 0's return value; or, with
        ``main`` a path, that script with ``args`` as its command line on every rank
        (returns None), as ``TorchDistributor.run`` does (horovod_cpp.job.script)."""
        main = as_main(main, args, "HorovodRunner.run")
        payload = pickle_main(main, kwargs)
        key = network.new_key()
        job = JobService(key, payload, stream=self.driver_log_verbosity == "all")
        try:
            if self.num_processor < 0:
                run_on_driver(job, key, -self.num_processor, mpirun.horovod_env())
            else:
                self._run_on_spark(job, key)
            return job.outcome()
        finally:
            job.stop()

    # ---- np > 0: a Spark barrier stage ------------------------------------------------------

    def _run_on_spark(self, job, key):
        caller = "HorovodRunner(np=%d)" % self.num_processor
        sc = active_spark_context(caller, "use np=%d to run the ranks on the driver"
                                  % -self.num_processor)
        run_barrier_job(sc, self.num_processor, job, key, caller=caller,
                        stream=self.driver_log_verbosity == "all", env=mpirun.horovod_env(),
                        mpi_args=os.environ.get("HVD_SPARK_MPI_ARGS", "").split(),
                        timeout=resolve_start_timeout(self.start_timeout))


def run_on_driver(job, key, np, ranks_env, mpi_args=()):
    """Starts ``np`` ranks of ``job`` on the driver with mpirun (no Spark job)."""
    env = dict(os.environ)
    env.update({"HVD_SPARK_JOB": "127.0.0.1:%d" % job.port, "HVD_SPARK_KEY": key.hex()})
    argv = mpirun.build_command(
        np, [sys.executable, "-m", "horovod_cpp.job.rank_main"], env=ranks_env,
        passthrough=["HVD_SPARK_JOB", "HVD_SPARK_KEY"], oversubscribe=np > (os.cpu_count() or 1),
        mpirun=mpirun.find_mpirun(), mpi_args=list(mpi_args))
    job.launch(argv, env)


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, extra_mpi_args=None,
        env=None, stdout=None, stderr=None, verbose=1, prefix_output_with_timestamp=False,
        local_mode=False):
    """``horovod.spark.run``: runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks as a Spark
    barrier stage of the active SparkSession; returns the list of every rank's return value,
    in rank order. ``fn`` may be a script's path: then ``args`` is its command line, and the
    value is None (TorchDistributor's ``run("train.py", "--arg", ...)``; horovod_cpp.job.script).
    ``local_mode=True`` (TorchDistributor's name; not in Horovod) runs the ranks on the driver
    with mpirun instead, without a Spark job (``HorovodRunner(np=-n)``); then num_proc defaults
    to 1 and no SparkSession is needed.

    num_proc: default the SparkContext's defaultParallelism. start_timeout: seconds to wait
    for free task slots and the stage's start (default HOROVOD_SPARK_START_TIMEOUT, else
    600). extra_mpi_args: a string of further mpirun arguments. env: the variables every rank
    gets (default: the HOROVOD_* variables of os.environ). stdout/stderr: where the ranks'
    output goes (default sys.stdout, each line tagged "[rank]<stream>:"); with a stream given
    its lines come untagged, as Horovod writes them. verbose: 0 quiet, 1 says how many
    processes run, 2 also the mpirun command. prefix_output_with_timestamp: each line of
    output starts with the time it reached the driver."""
    script = isinstance(fn, (str, os.PathLike))
    sc = None
    if not local_mode:
        sc = active_spark_context("horovod_cpp.spark.run", "pass local_mode=True (or use "
                                  "horovod_cpp.runner.run) to run the ranks without Spark")
    if num_proc is None:
        num_proc = 1 if local_mode else int(sc.defaultParallelism)
    check_positive_ints(num_proc=num_proc)  # (set: defaultParallelism when not given)
    timeout = resolve_start_timeout(start_timeout)
    caller = "horovod_cpp.spark.run(num_proc=%d)" % num_proc
    main = as_main(fn, args, caller) if script else functools.partial(fn, *args)
    payload = pickle_main(main, dict(kwargs or {}), caller=caller)
    ranks_env = mpirun.horovod_env() if env is None else {
        name: str(env[name]) for name in mpirun.forwarded_env(env)}
    ranks_env["HVD_SPARK_ALL_RESULTS"] = "1"
    mpi_args = shlex.split(extra_mpi_args or "") + os.environ.get(
        "HVD_SPARK_MPI_ARGS", "").split()
    if verbose >= 1:
        sys.stderr.write("Running %d processes...\n" % num_proc)
    key = network.new_key()
    job = JobService(key, payload, stream=True, ranks=num_proc, stdout=stdout, stderr=stderr,
                     timestamp=prefix_output_with_timestamp)
    try:
        if local_mode:
            run_on_driver(job, key, num_proc, ranks_env, mpi_args)
        else:
            run_barrier_job(sc, num_proc, job, key, caller=caller, stream=True, env=ranks_env,
                            mpi_args=mpi_args, timeout=timeout, verbose=verbose >= 2)
        values = job.outcome()
        return None if script else values
    finally:
        job.stop()


def active_spark_context(caller, alternative):
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise HorovodRunnerError("%s needs an active SparkSession (or %s)" % (caller, alternative))
    return sc


def resolve_start_timeout(value=None):
    """Seconds to wait for the task slots and the barrier stage's start: ``value``, else
    HOROVOD_SPARK_START_TIMEOUT, else 600."""
    if value is None:
        text = os.environ.get("HOROVOD_SPARK_START_TIMEOUT")
        if not text:
            return 600.0
        try:
            value = float(text)
        except ValueError:
            raise ValueError("HOROVOD_SPARK_START_TIMEOUT must be a number of seconds, got %r"
                             % text) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("start_timeout must be a positive number of seconds, got %r" % (value,))
    return float(value)


def _seconds(text, default):
    """A Spark duration ('30s', '120', '2min', '500ms') in seconds."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", str(text or ""))
    if not m:
        return default
    scale = {"ms": 0.001, "s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
    return float(m.group(1)) * scale


def _busy_slots(sc):
    """Task slots that running tasks of this application hold now: the task scheduler's own
    count (the status tracker's lags behind task starts by up to a task's length)."""
    try:
        counts = sc._jsc.sc().taskScheduler().runningTasksByExecutors().valuesIterator()
        busy = 0
        while counts.hasNext():
            busy += int(counts.next())
        return busy
    except Exception:  # private API; fall back below
        pass
    tracker = sc.statusTracker()
    busy = 0
    for stage in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage)
        if info is not None:
            busy += info.numActiveTasks
    return busy


def _wait_for_slots(sc, np, deadline, caller, timeout):
    """Returns once ``np`` task slots are free. A cluster that cannot ever hold np tasks fails
    at once (after giving a cluster's executors Spark's registration wait to arrive); one whose
    slots other jobs hold is waited for, with one message, until ``deadline``."""
    conf = sc.getConf()
    slots = _task_slots(sc)
    if slots < np and not sc.master.startswith("local"):
        # A young application's executors may still be registering: wait as Spark's own
        # scheduler does, up to maxRegisteredResourcesWaitingTime after the context started.
        young = sc.startTime / 1000.0 + _seconds(
            conf.get("spark.scheduler.maxRegisteredResourcesWaitingTime", "30s"), 30.0)
        while slots < np and time.time() < young and time.monotonic() < deadline:
            time.sleep(0.5)
            slots = _task_slots(sc)
    if slots < np:
        raise HorovodRunnerError(
            "%s needs %d task slots at the same time (Spark barrier mode), but this Spark "
            "cluster has %d (master %s, spark.task.cpus=%s). Use np <= %d, add executors, or "
            "use np=%d to run the ranks on the driver."
            % (caller, np, slots, sc.master, conf.get("spark.task.cpus", "1"), slots, -np))
    free = slots - _busy_slots(sc)
    if free >= np:
        return
    sys.stderr.write("%s: waiting for %d task slots, %d free (other Spark jobs hold the rest; "
                     "giving up after %g s)\n" % (caller, np, free, timeout))
    sys.stderr.flush()
    while free < np:
        if time.monotonic() >= deadline:
            raise HorovodRunnerError(
                "%s: gave up after %g s waiting for %d task slots (%d of %d free): other Spark "
                "jobs hold them. Wait longer with start_timeout (or HOROVOD_SPARK_START_TIMEOUT),"
                " or free the slots." % (caller, timeout, np, free, slots))
        time.sleep(0.5)
        slots = _task_slots(sc)
        free = slots - _busy_slots(sc)


def _executor_hosts(sc):
    """The hosts of the executors Spark still has (names or addresses), or None."""
    try:
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        return {info.host() for info in infos}
    except Exception:  # private API
        return None


def _silence_limit(conf):
    """How long a barrier task may go unheard before the driver calls its host lost: the
    collective timeout plus 30 s (the ranks' own report naming the host comes first when the
    launcher survives), at most Spark's own spark.network.timeout."""
    network_timeout = _seconds(conf.get("spark.network.timeout", "120s"), 120.0)
    try:
        collective = float(os.environ.get("HOROVOD_COLLECTIVE_TIMEOUT_SECONDS", "300"))
    except ValueError:
        collective = 300.0
    if collective <= 0:
        return network_timeout
    return min(network_timeout, collective + 30.0)


# After a failure is known, how long the barrier tasks get to end by themselves before the
# Spark job is cancelled (a task on a lost host never reaches the final barrier).
_FAILED_GRACE = 5.0


def run_barrier_job(sc, np, job, key, caller, stream, env, mpi_args, timeout, verbose=False):
    """Runs ``np`` ranks as a Spark barrier stage reporting to ``job`` (a JobService), after
    waiting up to ``timeout`` seconds for free slots and the stage's start. Returns once the
    job has an outcome (``job.outcome()`` tells it); cancels the Spark job when a rank failed,
    a task's host was lost, or Spark retried the stage."""
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise HorovodRunnerError(
            "HorovodRunner needs Spark barrier mode, which does not support dynamic "
            "resource allocation (SPARK-24942): set spark.dynamicAllocation.enabled=false")
    begun = time.monotonic()
    deadline = begun + timeout
    _wait_for_slots(sc, np, deadline, caller, timeout)
    spec = {
        "np": np,
        "job": "%s:%d" % (conf.get("spark.driver.host", "127.0.0.1"), job.port),
        "key": key,
        "env": env,
        "stream": stream,
        "host_per_task": os.environ.get("HVD_SPARK_HOST_SALT") == "task",
        "mpi_args": list(mpi_args),
        "verbose": verbose,
    }
    group = "horovod_cpp-%s" % uuid.uuid4().hex[:12]
    failure = []

    def spark_job():
        try:
            sc.setJobGroup(group, caller, interruptOnCancel=True)
            rdd = sc.parallelize(range(np), np).barrier()
            rdd.mapPartitions(_checked_task(spec)).collect()
        except BaseException as e:  # reported below
            failure.append(e)

    silence = _silence_limit(conf)
    thread = threading.Thread(target=spark_job, name="hvd-spark-job", daemon=True)
    thread.start()
    stop = None  # why the Spark job is cancelled
    failed_at = None
    try:
        while thread.is_alive():
            thread.join(0.2)
            now = time.monotonic()
            if job.tasks_started() < np and now >= deadline:
                stop = "start"
            elif job.lost_tasks(silence):
                stop = "lost"
            elif job.retried():
                stop = "retried"
            elif job.failed():
                failed_at = failed_at or now
                if now - failed_at >= _FAILED_GRACE:
                    stop = "failed"
            if stop:
                break
    except BaseException:
        sc.cancelJobGroup(group)
        thread.join(30)
        raise
    if stop:
        sc.cancelJobGroup(group)
        thread.join(60)
    if stop == "start":
        raise HorovodRunnerError(
            "%s: the barrier stage did not start within %g s (%d of %d tasks started; Spark "
            "starts a barrier stage only when all its tasks fit at once)"
            % (caller, timeout, job.tasks_started(), np))
    if failure and not job.has_outcome() and not stop:
        # A Spark job that failed by itself (an executor lost, say): the task's connection to
        # this process closes at the same time; give it a moment to be seen.
        wait_until = time.monotonic() + 3.0
        while not job.lost_tasks(3.0) and time.monotonic() < wait_until:
            time.sleep(0.1)
    lost = job.describe_lost(silence if stop == "lost" else 3.0, _executor_hosts(sc))
    if lost:
        job.note_lost(lost, stop == "retried")
    if failure and not job.has_outcome():
        if lost:
            raise HorovodRunnerError("%s\nthe Spark job then failed: %s"
                                     % (lost, _spark_reason(failure[0]))) from failure[0]
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
