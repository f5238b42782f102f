"""What runs inside each Spark barrier task.

Every task starts a ``TaskService`` that can run one command (Open MPI's orted, sent by the rsh
agent) in its own process group and stream its output back, then shares its address through
``BarrierTaskContext.allGather``. Task 0 starts mpirun with one "host" per distinct host hash
and the rsh agent; all tasks then meet at a final barrier, and every service kills whatever it
started before the task returns, so nothing outlives the Spark job.

Every task also keeps a connection to the driver open and says "alive" on it once a second
(``_Heartbeat``): the driver learns at once when a task's process dies (the connection closes)
and within a bounded time when its host is cut off (silence), and names that host. Task 0
asks the driver before it starts mpirun; the driver agrees once per run, so a barrier stage
that Spark retries after a failure never starts a second training run.
"""
import glob
import hashlib
import json
import os
import queue
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

from horovod_cpp.job import mpirun, proc
from horovod_cpp.job import network

RANK_COMMAND = ("-m", "horovod_cpp.job.rank_main")


def host_hash(salt=""):
    """This machine's name for mpirun -H: tasks with the same hash share one orted. The hash
    covers the Linux namespaces, so containers on one machine are separate hosts."""
    name = socket.gethostname().split(".")[0] or "host"
    h = hashlib.md5(name.encode())
    for ns in sorted(glob.glob("/proc/self/ns/*")):
        try:
            h.update(os.readlink(ns).encode())
        except OSError:
            pass
    h.update(str(salt).encode())
    safe = "".join(c if c.isalnum() or c == "-" else "-" for c in name)
    return "%s-%s" % (safe, h.hexdigest()[:12])


# "orte_tmpdir_base <value>" in an orted command line (the value quoted or not).
_TMPDIR_BASE = re.compile(r"""(orte_tmpdir_base\s+)("[^"]*"|'[^']*'|\S+)""")


class TaskService(object):
    """Runs commands for the rsh agent: {"type": "run", "command": str} starts ``sh -c
    command`` and answers with {"type": "out", "stream", "data"} frames and a final {"type":
    "exit", "code"}. With "stdin": true the agent's {"type": "in", "data"} frames go to the
    command's stdin and {"type": "eof"} closes it (run_elastic's workers take their secret and
    environment there, as over ssh). If the agent's connection drops, the command's process
    group is killed."""

    def __init__(self, key):
        self._key = key
        self._lock = threading.Lock()
        self._procs = []
        self._stopped = False
        self._service = network.Service(key, self._handle)
        self.port = self._service.port

    def _handle(self, sock, message):
        if message.get("type") != "run":
            network.send(sock, self._key, {"type": "error", "message": "unknown request"})
            return
        # Each daemon gets its own session directory. Open MPI names it after the host name
        # and the job, so daemons of one job on one machine (several barrier tasks of a host,
        # or mpirun and a daemon in task 0) would share it, and creating it races: one of them
        # fails in orte_init ("mkdir ... File exists", or a crash).
        # mpirun passes its own base on the daemons' command line (job/mpirun.py's
        # own_session_dir), which would override this one: it is replaced there too.
        tmpdir = tempfile.mkdtemp(prefix="hvd-orted-")
        env = dict(os.environ, OMPI_MCA_orte_tmpdir_base=tmpdir)
        message["command"] = _TMPDIR_BASE.sub(lambda m: m.group(1) + shlex.quote(tmpdir),
                                              message["command"])
        try:
            with self._lock:
                if self._stopped:
                    return
                stdin = subprocess.PIPE if message.get("stdin") else subprocess.DEVNULL
                child = proc.popen(["/bin/sh", "-c", message["command"]],
                                   stdin=stdin, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env)
                self._procs.append(child)
            self._serve(sock, child)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _serve(self, sock, child):
        """Streams ``child``'s output to the agent until it exits, then its exit code."""
        send_lock = threading.Lock()

        def pump(stream, name):
            for data in iter(lambda: stream.read1(65536), b""):
                try:
                    with send_lock:
                        network.send(sock, self._key, {"type": "out", "stream": name,
                                                       "data": data})
                except OSError:
                    proc.stop_group(child)
                    return

        def watch_agent():
            # Without stdin the agent never sends more; a closed connection means it is gone.
            try:
                if child.stdin is None:
                    sock.recv(1)
                else:
                    while True:
                        message = network.recv(sock, self._key)
                        if message.get("type") == "in":
                            child.stdin.write(message["data"])
                            child.stdin.flush()
                        elif message.get("type") == "eof":
                            child.stdin.close()
            except (OSError, EOFError, ValueError, network.ProtocolError):
                pass
            if child.stdin is not None and not child.stdin.closed:
                try:
                    child.stdin.close()
                except OSError:
                    pass
            if child.poll() is None:
                proc.stop_group(child)

        pumps = [threading.Thread(target=pump, args=(child.stdout, "stdout"), daemon=True),
                 threading.Thread(target=pump, args=(child.stderr, "stderr"), daemon=True)]
        for t in pumps:
            t.start()
        threading.Thread(target=watch_agent, daemon=True).start()
        code = child.wait()  # this thread started the child: it must live as long
        for t in pumps:
            t.join(5)
        try:
            with send_lock:
                network.send(sock, self._key, {"type": "exit", "code": code})
        except OSError:
            pass

    def stop(self):
        with self._lock:
            self._stopped = True
            procs = list(self._procs)
        for child in procs:
            proc.stop_group(child, grace=2.0)
        self._service.stop()


class _Forwarder(object):
    """Sends the job's output lines to the driver in batches (driver_log_verbosity="all")."""

    def __init__(self, address, key):
        self._address, self._key = address, key
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvd-forward")
        self._thread.start()

    def line(self, rank, stream, text):
        self._queue.put((rank, stream, text))

    def _run(self):
        broken = False
        while True:
            item = self._queue.get()
            if item is None:
                return
            lines = [item]
            while len(lines) < 500:
                try:
                    nxt = self._queue.get(timeout=0.05)
                except queue.Empty:
                    break
                if nxt is None:
                    self._send(lines, broken)
                    return
                lines.append(nxt)
            broken = self._send(lines, broken)

    def _send(self, lines, broken):
        if broken:
            return True
        try:
            network.request(self._address, self._key, {"type": "output", "lines": lines})
            return False
        except OSError as e:
            sys.stderr.write("horovod_cpp: cannot stream output to the driver: %s\n" % e)
            return True

    def close(self):
        self._queue.put(None)
        self._thread.join(10)


class _Heartbeat(object):
    """This task's line to the driver: {"type": "task", ...} once, then {"type": "alive"} every
    INTERVAL seconds until ``close`` says {"type": "bye"}. If the driver cannot be reached the
    task carries on (the driver then reports the task silent)."""

    INTERVAL = 1.0

    def __init__(self, address, key, hello):
        self._key = key
        self._stop = threading.Event()
        self._lock = threading.Lock()
        try:
            self._sock = network.connect(address)
            network.send(self._sock, key, dict(hello, type="task"))
        except OSError as e:
            sys.stderr.write("horovod_cpp: cannot reach the driver at %s: %s\n" % (address, e))
            self._sock = None
            return
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvd-heartbeat")
        self._thread.start()

    def send(self, message):
        with self._lock:
            if self._sock is None:
                return
            try:
                network.send(self._sock, self._key, message)
            except OSError:
                self._sock.close()
                self._sock = None

    def _run(self):
        while not self._stop.wait(self.INTERVAL):
            self.send({"type": "alive"})

    def connected(self):
        """The driver still takes this task's heartbeats."""
        with self._lock:
            return self._sock is not None

    def local_ip(self):
        """The address this task reaches the driver from."""
        with self._lock:
            return self._sock.getsockname()[0] if self._sock is not None else None

    def close(self):
        if self._sock is None:
            return
        self._stop.set()
        self._thread.join(5)
        self.send({"type": "bye"})
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _layout(infos):
    """The mpirun hosts [(host, slots)] in task order (task 0's host first: rank 0 is there),
    the rsh agent's table {host: [task service addresses]}, and every rank's GPU addresses.

    mpirun maps ranks by slot, so a host's ranks are consecutive and its local rank j is
    started by that host's j-th task. A rank sees the GPUs of all its host's tasks in
    local-rank order, so that device ``local_rank`` (``torch.cuda.set_device(hvd.local_rank())``,
    with one GPU per task) is the one Spark gave its own task."""
    order, table, gpus = [], {}, {}
    for info in sorted(infos, key=lambda i: i["index"]):
        if info["host"] not in table:
            order.append(info["host"])
            table[info["host"]], gpus[info["host"]] = [], []
        table[info["host"]].append(info["addr"])
        gpus[info["host"]].append(info.get("gpus") or [])
    hosts = [(h, len(table[h])) for h in order]
    rank_gpus = []
    for h in order:
        visible = [a for task in gpus[h] for a in task]
        rank_gpus += [{"visible": visible, "own": task} for task in gpus[h]]
    return hosts, table, rank_gpus


def _launch(spec, infos):
    """Task 0: start the ranks with mpirun and report how it ended to the driver."""
    hosts, table, rank_gpus = _layout(infos)
    key = spec["key"]
    env = dict(os.environ)
    env.update({"HVD_SPARK_TASKS": json.dumps(table), "HVD_SPARK_KEY": key.hex(),
                "HVD_SPARK_JOB": spec["job"]})
    passthrough = ["HVD_SPARK_JOB", "HVD_SPARK_KEY"]
    if any(g["own"] for g in rank_gpus):
        env["HVD_SPARK_RANK_GPUS"] = json.dumps(rank_gpus)
        passthrough.append("HVD_SPARK_RANK_GPUS")
    agent = "%s -m horovod_cpp.spark.rsh_agent" % sys.executable
    argv = mpirun.build_command(
        spec["np"], [sys.executable] + list(RANK_COMMAND), hosts=hosts,
        env=spec["env"], passthrough=passthrough, mpi_args=spec["mpi_args"],
        rsh_agent=agent, mpirun=mpirun.find_mpirun())
    command = "horovod_cpp: %s" % mpirun.quote(argv)
    sys.stderr.write(command + "\n")
    forwarder = _Forwarder(spec["job"], key) if spec["stream"] else None
    if forwarder is not None and spec.get("verbose"):
        forwarder.line(None, "stderr", command)

    def on_line(rank, stream, text):
        # The executor's log keeps everything; the driver gets it with verbosity "all".
        sys.stderr.write((text if rank is None else "[%d]<%s>:%s" % (rank, stream, text)) + "\n")
        if forwarder is not None:
            forwarder.line(rank, stream, text)

    launch = mpirun.Launch(argv, on_line, env=env)
    result = launch.wait()
    if forwarder is not None:
        forwarder.close()
    report = {"returncode": result.returncode, "description": result.describe()}
    network.request(spec["job"], key, {"type": "launcher", "result": report})
    return report


def barrier_task(spec):
    """The function for rdd.barrier().mapPartitions."""

    def run(_partition):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        ip = ctx.getTaskInfos()[index].address.rpartition(":")[0] or "127.0.0.1"
        heartbeat = _Heartbeat(spec["job"], spec["key"], {
            "id": ctx.taskAttemptId(), "index": index, "host": socket.gethostname(), "ip": ip})
        service = None
        report = None
        try:
            service = TaskService(spec["key"])
            gpu = (ctx.resources() or {}).get("gpu")
            mine = {"index": index, "addr": "%s:%d" % (ip, service.port),
                    "host": host_hash(index if spec["host_per_task"] else ""),
                    "gpus": list(gpu.addresses) if gpu is not None else [],
                    "id": ctx.taskAttemptId()}
            infos = [json.loads(m) for m in ctx.allGather(json.dumps(mine))]
            # This stage attempt's name: the least task attempt id of its tasks.
            attempt = min(info["id"] for info in infos)
            heartbeat.send({"type": "attempt", "attempt": attempt})
            if index == 0:
                try:
                    if not network.request(spec["job"], spec["key"],
                                           {"type": "launch", "attempt": attempt}):
                        raise RuntimeError(
                            "horovod_cpp: not starting the ranks again: Spark retried the "
                            "barrier stage after a failure, and the first attempt's training "
                            "is what the driver reports")
                    report = _launch(spec, infos)
                finally:
                    ctx.barrier()  # releases the other tasks whatever happened
            else:
                ctx.barrier()
        finally:
            if service is not None:
                service.stop()
            heartbeat.close()
        if report is not None:
            yield report

    return run


def elastic_task(spec):
    """The function for run_elastic's tasks (rdd.mapPartitions, not barrier mode): each task is
    one slot. It serves the driver's rsh agent (TaskService: the driver starts a worker in it
    when its elastic driver wants one there) and keeps its heartbeat until the driver closes
    it at the end of the job. A task that dies (its executor lost) leaves the job's hosts;
    Spark runs it again on an executor that has room, which then joins the job."""

    def run(_partition):
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        service = TaskService(spec["key"])
        hello = {"id": ctx.taskAttemptId(), "index": ctx.partitionId(),
                 "host": socket.gethostname(), "ip": None, "python": sys.executable,
                 "cwd": os.getcwd()}
        # The address the driver reaches this task at: the one on the route to the driver.
        host, _, port = spec["job"].rpartition(":")
        ip = network.source_address(host, int(port))
        hello.update(ip=ip, addr="%s:%d" % (ip, service.port))
        heartbeat = _Heartbeat(spec["job"], spec["key"], hello)
        try:
            while heartbeat.connected():
                time.sleep(0.5)
        finally:
            service.stop()
            heartbeat.close()
        yield ctx.partitionId()

    return run
