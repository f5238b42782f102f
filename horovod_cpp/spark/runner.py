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
import pickle
import re
import shlex
import socket
import sys
import threading
import time
import uuid

import cloudpickle

from horovod_cpp.runner import mpirun
from horovod_cpp.spark import network, sources


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
        caller = "HorovodRunner(np=%d)" % self.num_processor
        sc = active_spark_context(caller, "use np=%d to run the ranks on the driver"
                                  % -self.num_processor)
        run_barrier_job(sc, self.num_processor, job, key, caller=caller,
                        stream=self.driver_log_verbosity == "all", env=mpirun.horovod_env(),
                        mpi_args=os.environ.get("HVD_SPARK_MPI_ARGS", "").split(),
                        timeout=resolve_start_timeout(self.start_timeout))


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, extra_mpi_args=None,
        env=None, stdout=None, stderr=None, verbose=1, prefix_output_with_timestamp=False):
    """``horovod.spark.run``: runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks as a Spark
    barrier stage of the active SparkSession; returns the list of every rank's return value,
    in rank order.

    num_proc: default the SparkContext's defaultParallelism. start_timeout: seconds to wait
    for free task slots and the stage's start (default HOROVOD_SPARK_START_TIMEOUT, else
    600). extra_mpi_args: a string of further mpirun arguments. env: the variables every rank
    gets (default: the HOROVOD_* variables of os.environ). stdout/stderr: where the ranks'
    output goes (default sys.stdout, each line tagged "[rank]<stream>:"); with a stream given
    its lines come untagged, as Horovod writes them. verbose: 0 quiet, 1 says how many
    processes run, 2 also the mpirun command. prefix_output_with_timestamp: each line of
    output starts with the time it reached the driver."""
    sc = active_spark_context("horovod_cpp.spark.run", "use horovod_cpp.runner.run to run "
                              "the ranks without Spark")
    if num_proc is None:
        num_proc = int(sc.defaultParallelism)
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError("num_proc must be a positive int, got %r" % (num_proc,))
    timeout = resolve_start_timeout(start_timeout)
    caller = "horovod_cpp.spark.run(num_proc=%d)" % num_proc
    payload = pickle_main(functools.partial(fn, *args), dict(kwargs or {}), caller=caller)
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
        run_barrier_job(sc, num_proc, job, key, caller=caller, stream=True, env=ranks_env,
                        mpi_args=mpi_args, timeout=timeout, verbose=verbose >= 2)
        return job.outcome()
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


def pickle_main(main, kwargs, caller="HorovodRunner.run"):
    """cloudpickle (main, kwargs) on the driver, naming what cannot be pickled."""
    if not callable(main):
        raise TypeError("main must be callable, got %r" % (main,))
    try:
        return cloudpickle.dumps((main, kwargs, sources.record(main)))
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
    ranks' values (horovod_cpp.runner.run, whose ranks all report). ``stdout``/``stderr``:
    where streamed rank output goes (default: both to sys.stdout, as "[rank]<stream>:line");
    ``timestamp``: prefix every streamed line with the time it arrived.

    Barrier tasks keep a connection open ("task", then "alive" every second, "bye" at the
    end); ``lost_tasks`` names those whose connection closed early or that went silent. Task 0
    asks "launch" before starting mpirun, and only the first ask is granted."""

    def __init__(self, key, payload, stream, ranks=None, stdout=None, stderr=None,
                 timestamp=False):
        self._payload = payload
        self._stream = stream
        self._ranks = ranks
        self._out = {"stdout": stdout, "stderr": stderr}
        self._timestamp = timestamp
        self._lock = threading.Lock()
        self._results = {}
        self._errors = []
        self._launcher = None
        self._tasks = {}  # (stage attempt, index) -> what a task said of itself, and when
        self._launched = None  # the stage attempt whose task 0 started mpirun
        self._refused = []
        self._lost = None  # (text, retried) once the driver called a host lost
        self._task_socks = []  # the tasks' heartbeat connections, closed by stop()
        self._print_lock = threading.Lock()
        self._service = network.Service(key, self._handle)
        self.port = self._service.port

    def stop(self):
        self._service.stop()
        with self._lock:
            socks, self._task_socks = self._task_socks, []
        for sock in socks:  # a task cut off from this host would hold its thread for good
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _handle(self, sock, message):
        kind = message.get("type")
        reply = "ok"
        if kind == "task":
            self._follow_task(sock, message)
            return
        if kind == "payload":
            reply = self._payload
        elif kind == "launch":
            with self._lock:
                reply = self._launched is None
                if reply:
                    self._launched = message["attempt"]
                else:
                    self._refused.append(message["attempt"])
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

    def _follow_task(self, sock, hello):
        entry = {"index": hello["index"], "attempt": None, "host": hello["host"],
                 "ip": hello["ip"], "last": time.monotonic(), "closed": None, "done": False}
        with self._lock:
            self._tasks[hello["id"]] = entry
            self._task_socks.append(sock)
        try:
            while True:
                message = network.recv(sock, self._service.key)
                with self._lock:
                    entry["last"] = time.monotonic()
                    if message.get("type") == "attempt":
                        entry["attempt"] = message["attempt"]
                    elif message.get("type") == "bye":
                        entry["done"] = True
                        return
        except (OSError, EOFError, pickle.UnpicklingError):
            with self._lock:
                if not entry["done"]:
                    entry["closed"] = time.monotonic()

    def tasks_started(self):
        with self._lock:
            return len({t["index"] for t in self._tasks.values()})

    def lost_tasks(self, silence):
        """The tasks whose connection closed before they said goodbye, or that have been
        silent for ``silence`` s: once the ranks started, those of the stage attempt that
        started them."""
        now = time.monotonic()
        with self._lock:
            return [dict(t) for _, t in sorted(self._tasks.items())
                    if (self._launched is None or t["attempt"] == self._launched)
                    and not t["done"]
                    and (t["closed"] is not None or now - t["last"] >= silence)]

    def describe_lost(self, silence, alive=None):
        """A line per lost host: what was heard of its tasks last. ``alive``: the hosts (names
        or addresses) whose Spark executor is still registered; a task there whose connection
        closed was stopped by Spark after another host's loss (Spark kills every task of a
        failed barrier stage), so it names no host unless nothing else does."""
        now = time.monotonic()
        lost = self.lost_tasks(silence)
        if alive:
            dead = [t for t in lost if t["closed"] is None
                    or (t["host"] not in alive and t["ip"] not in alive)]
            lost = dead or lost
        hosts = {}
        for t in lost:
            hosts.setdefault((t["host"], t["ip"]), []).append(t)
        lines = []
        for (host, ip), tasks in sorted(hosts.items()):
            ids = ", ".join(str(t["index"]) for t in tasks)
            closed = [t for t in tasks if t["closed"] is not None]
            if closed:
                why = ("the connection of its Spark task %s to the driver closed %.0f s ago (the "
                       "task's process or executor died)" % (ids, now - closed[0]["closed"]))
            else:
                why = ("nothing heard from its Spark task %s for %.0f s (the host is down or cut "
                       "off from the network)" % (ids, now - max(t["last"] for t in tasks)))
            lines.append("lost host %s (%s): %s" % (host, ip, why))
        return "\n".join(lines)

    def note_lost(self, text, retried=False):
        with self._lock:
            self._lost = (text, retried)

    def retried(self):
        with self._lock:
            return bool(self._refused)

    def failed(self):
        with self._lock:
            return bool(self._errors) or (self._launcher is not None
                                          and self._launcher["returncode"] != 0)

    def _print(self, text, stream="stdout"):
        with self._print_lock:
            out = self._out[stream] or sys.stdout
            out.write(text + "\n")
            out.flush()

    def output_line(self, rank, stream, text):
        if not self._stream:
            return
        if rank is not None and self._out[stream] is None:
            text = "[%d]<%s>:%s" % (rank, stream, text)
        if self._timestamp:
            text = "%s %s" % (time.strftime("%a %b %d %H:%M:%S %Y"), text)
        self._print(text, stream if stream in self._out else "stdout")

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
        lost, retried = self._lost or ("", False)
        if retried:
            lost += ("\nSpark then retried the barrier stage; horovod_cpp does not start a "
                     "second training run, and cancelled the Spark job")
        if launcher is None:
            raise HorovodRunnerError(lost.strip() or
                                     "the job ended without a report from its launcher")
        if launcher["returncode"] != 0:
            raise HorovodRunnerError((launcher["description"] + "\n" + lost).strip())
        if self._ranks is not None:
            missing = [r for r in range(self._ranks) if r not in results]
            if missing:
                raise HorovodRunnerError("rank(s) %s exited without returning a value"
                                         % ", ".join(map(str, missing)))
            return [cloudpickle.loads(results[r]) for r in range(self._ranks)]
        if 0 not in results:
            raise HorovodRunnerError("rank 0 exited without returning a value from main")
        return cloudpickle.loads(results[0])
