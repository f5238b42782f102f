"""``horovod_cpp.spark.run_elastic``: an elastic job whose workers run in Spark tasks, as
``horovod.spark.run_elastic``.

The driver runs a Spark job of ``max_np`` ordinary (not barrier) tasks. Each task is one slot:
it says hello to the driver's job service (its address, its Python, its directory), keeps a
heartbeat, and runs whatever the driver asks of it through its task service. The elastic
driver of hvdrun (job/elastic_driver.py) then runs the job over those slots: its hosts are
the live tasks, it starts a worker in a task through Spark's rsh agent (secret and environment
on stdin, as over ssh), and it forms rounds through its rendezvous store as for hvdrun. So:

* a lost executor takes its tasks and their workers with it: the job goes on with the workers
  left (at least ``min_np``; it waits up to ``elastic_timeout`` for more otherwise), and the
  host is not blacklisted (it left, it did not fail);
* Spark runs those tasks again on an executor that has room (a worker that returns, a new
  executor): the tasks say hello, and the job grows back at the next ``state.commit()``;
* a worker that fails by itself (an exception) is dropped and its host blacklisted, as in
  Horovod.

The function uses ``hvd.elastic.run`` with a ``hvd.elastic.TorchState`` (or ObjectState); the
values returned are those of the last round's ranks, in rank order. When the job ends the
driver closes the tasks' heartbeats and they end, so nothing outlives the Spark job.
"""
import functools
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid

from horovod_cpp.job import mpirun, network, proc
from horovod_cpp.job.service import (HorovodRunnerError, JobService, check_positive_ints,
                                     pickle_main)
from horovod_cpp.spark.runner import _spark_reason, active_spark_context, resolve_start_timeout

# A task unheard for this long is gone (its heartbeat comes every second).
_SILENCE = 10.0


def _elastic_task_fn(spec):
    """The tasks' function; it imports horovod_cpp inside, on the executor."""
    def run(partition):
        from horovod_cpp.spark import task as _task
        return _task.elastic_task(spec)(partition)
    return run


class _Slots(object):
    """The live Spark tasks as the elastic driver's hosts: one slot each, named
    "task<index>@<ip>" (a task that Spark runs again elsewhere is a new host)."""

    def __init__(self, job):
        self._job = job

    def tasks(self):
        return {"task%d@%s" % (t["index"], t["ip"]): t for t in self._job.live_tasks(_SILENCE)}

    def discover(self):
        return {name: 1 for name in self.tasks()}

    @staticmethod
    def address(host):
        return host.rpartition("@")[2]


def run_elastic(fn, args=(), kwargs=None, num_proc=None, min_np=None, max_np=None,
                start_timeout=None, elastic_timeout=None, reset_limit=None, env=None,
                stdout=None, stderr=None, verbose=1, nics=None,
                prefix_output_with_timestamp=False, min_num_proc=None, max_num_proc=None,
                cooldown_range=None):
    """Runs ``fn(*args, **kwargs)`` as an elastic job on the active SparkSession's executors;
    returns the list of the return values of the ranks of the last round, in rank order.

    num_proc: ranks to start with (default the SparkContext's defaultParallelism); min_np
    (default num_proc) and max_np (default num_proc): the fewest ranks the job runs on and the
    most (``min_num_proc``/``max_num_proc`` are Horovod's older names). start_timeout: seconds
    to wait for num_proc tasks to start (default HOROVOD_SPARK_START_TIMEOUT, else 600).
    elastic_timeout: seconds to wait for hosts when fewer than min_np ranks are left (default
    600). reset_limit: most resets. env: the variables every rank gets (default the HOROVOD_*
    variables of os.environ). stdout/stderr, verbose and prefix_output_with_timestamp as in
    ``run``; nics: the network interface the workers use (the first of the list).
    cooldown_range (seconds, seconds): how long a host whose worker failed stays out (default:
    for the rest of the job)."""
    min_np = min_np if min_np is not None else min_num_proc
    max_np = max_np if max_np is not None else max_num_proc
    sc = active_spark_context("horovod_cpp.spark.run_elastic",
                              "use horovod_cpp.runner.run with min_np/max_np")
    if num_proc is None:
        num_proc = int(sc.defaultParallelism)
    check_positive_ints(num_proc=num_proc, min_np=min_np, max_np=max_np)
    min_np = min_np or num_proc
    max_np = max_np or max(num_proc, min_np)
    if not min_np <= num_proc <= max_np:
        raise ValueError("need min_np <= num_proc <= max_np, got %d <= %d <= %d"
                         % (min_np, num_proc, max_np))
    timeout = resolve_start_timeout(start_timeout)
    elastic_timeout = 600.0 if elastic_timeout is None else float(elastic_timeout)
    caller = "horovod_cpp.spark.run_elastic(num_proc=%d)" % num_proc
    payload = pickle_main(functools.partial(fn, *args), dict(kwargs or {}), caller=caller)
    ranks_env = mpirun.horovod_env() if env is None else {
        name: str(env[name]) for name in mpirun.forwarded_env(env)}
    if nics:
        ranks_env["HOROVOD_GLOO_IFACE"] = list(nics)[0] if not isinstance(nics, str) else nics
    if verbose >= 1:
        sys.stderr.write("Running %d elastic processes (min %d, max %d)...\n"
                         % (num_proc, min_np, max_np))
    key = network.new_key()
    job = JobService(key, payload, stream=True, stdout=stdout, stderr=stderr,
                     timestamp=prefix_output_with_timestamp, elastic=True)
    driver_host = socket.gethostbyname(sc.getConf().get("spark.driver.host", "127.0.0.1"))
    spec = {"job": "%s:%d" % (driver_host, job.port), "key": key}
    ranks_env.update({"HVD_SPARK_JOB": spec["job"], "HVD_SPARK_KEY": key.hex(),
                      "HVD_SPARK_ALL_RESULTS": "1"})
    group = "horovod_cpp-elastic-%s" % uuid.uuid4().hex[:12]
    failure = []

    def spark_job():
        try:
            sc.setJobGroup(group, caller, interruptOnCancel=True)
            sc.parallelize(range(max_np), max_np).mapPartitions(
                _elastic_task_fn(spec)).collect()
        except BaseException as e:  # reported below
            failure.append(e)

    thread = threading.Thread(target=spark_job, name="hvd-spark-elastic", daemon=True)
    thread.start()
    slots = _Slots(job)
    try:
        deadline = time.monotonic() + timeout
        while len(slots.discover()) < num_proc:
            if failure or not thread.is_alive():
                raise HorovodRunnerError("%s: the Spark job ended before %d tasks started: %s"
                                         % (caller, num_proc, _spark_reason(failure[0])
                                            if failure else "no error"))
            if time.monotonic() >= deadline:
                raise HorovodRunnerError(
                    "%s: %d of %d tasks started within %g s (each task is a slot: the cluster "
                    "needs %d free task slots)" % (caller, len(slots.discover()), num_proc,
                                                   timeout, num_proc))
            time.sleep(0.2)
        rc = _drive(job, slots, key, num_proc, min_np, max_np, elastic_timeout, reset_limit,
                    cooldown_range, ranks_env, driver_host, verbose)
        job.set_launcher({"returncode": rc, "description": "the elastic job %s" % (
            "succeeded" if rc == 0 else "failed (exit code %d)" % rc)})
        return job.outcome()
    finally:
        job.stop()  # the tasks' heartbeats close: they end, and so does the Spark job
        thread.join(30)
        if thread.is_alive():
            sc.cancelJobGroup(group)
            thread.join(30)


def _drive(job, slots, key, num_proc, min_np, max_np, elastic_timeout, reset_limit,
           cooldown_range, ranks_env, driver_host, verbose):
    """Runs the elastic driver over the Spark tasks; its exit code."""
    from horovod_cpp.job.elastic_driver import ElasticDriver, ElasticError
    from horovod_cpp.spark.rsh_agent import LOST

    def spawn(host, env, command, secret):
        task = slots.tasks().get(host)
        if task is None:  # gone since the last discovery: a worker that fails at once
            return proc.popen([sys.executable, "-c", "import sys; sys.exit(%d)" % LOST],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
        python = task["python"]
        inner = [python, "-m", "horovod_cpp.job.task_exec", task["cwd"], "--", python,
                 "-m", "horovod_cpp.job.rank_main"]
        agent_env = dict(os.environ, HVD_SPARK_TASKS=json.dumps({host: [task["addr"]]}),
                         HVD_SPARK_KEY=key.hex())
        p = proc.popen([sys.executable, "-m", "horovod_cpp.spark.rsh_agent", "--stdin", host,
                        " ".join(shlex.quote(a) for a in inner)],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=agent_env)
        # The executor keeps its own environment; the job's variables come on stdin.
        p.stdin.write((secret + "\n" + json.dumps(env) + "\n").encode())
        p.stdin.flush()  # stdin stays open: closing it stops the worker
        return p

    def lost(worker):
        # Its task is gone (executor lost), or the agent lost the task's connection.
        return worker.ended == LOST or worker.host not in slots.tasks()

    def on_line(tag, stream, text):
        job.output_line(None, stream, "[%s]<%s>:%s" % (tag, stream, text))

    def log(text):
        if verbose >= 1:
            job.output_line(None, "stderr", "horovod_cpp.spark.run_elastic: %s" % text)

    driver = ElasticDriver(
        ["python"], num_proc, min_np, max_np, elastic_timeout=elastic_timeout,
        reset_limit=reset_limit, cooldown_range=cooldown_range, env=ranks_env,
        on_line=on_line, log=log, discover=slots.discover, spawn=spawn,
        hostname=slots.address, lost=lost, address=driver_host)
    try:
        return driver.run()
    except ElasticError as e:
        raise HorovodRunnerError("horovod_cpp.spark.run_elastic: %s" % e) from None
