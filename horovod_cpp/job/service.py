"""The job service: what every way of running a function on N ranks shares (HorovodRunner on
Spark, ``horovod_cpp.runner.run``, Ray). The caller's process pickles the function
(``pickle_main``) and runs a ``JobService`` that hands it to the ranks
(``python -m horovod_cpp.job.rank_main``) and receives rank 0's result (or every rank's), rank
errors with their tracebacks, log messages, the ranks' output and how the launcher ended; the
barrier tasks that host ranks (Spark's) keep a connection to it so that a lost one is named.
"""
import pickle
import socket
import sys
import threading
import time

import cloudpickle

from horovod_cpp.job import mpirun, network, sources


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


def check_positive_ints(**named):
    """ValueError naming the first of ``named``'s values (in order) that is set (not None) but
    not a positive int (bool is not an int here)."""
    for name, value in named.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError("%s must be a positive int, got %r" % (name, value))


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


def _result_dict(result):
    return {"returncode": result.returncode, "description": result.describe()}


class JobService(object):
    """The driver's end: payload out; results, errors, logs and the launcher's status in.
    ``ranks``: None, rank 0's value is the outcome (HorovodRunner); N, the list of all N
    ranks' values (horovod_cpp.runner.run, whose ranks all report). ``elastic``: the ranks of
    an elastic job's last round all report; when the launcher succeeds their values are the
    outcome, in rank order, whatever workers failed and were replaced on the way. ``stdout``/``stderr``:
    where streamed rank output goes (default: both to sys.stdout, as "[rank]<stream>:line");
    ``timestamp``: prefix every streamed line with the time it arrived.

    Barrier tasks keep a connection open ("task", then "alive" every second, "bye" at the
    end); ``lost_tasks`` names those whose connection closed early or that went silent. Task 0
    asks "launch" before starting mpirun, and only the first ask is granted."""

    def __init__(self, key, payload, stream, ranks=None, stdout=None, stderr=None,
                 timestamp=False, elastic=False):
        self._payload = payload
        self._stream = stream
        self._ranks = ranks
        self._elastic = elastic
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
                 "ip": hello["ip"], "last": time.monotonic(), "closed": None, "done": False,
                 "info": dict(hello)}
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

    def live_tasks(self, silence):
        """What the tasks still connected (heard from within ``silence`` s, not said goodbye)
        said of themselves in their hello, in task index order."""
        now = time.monotonic()
        with self._lock:
            return sorted((dict(t["info"]) for t in self._tasks.values()
                           if t["closed"] is None and not t["done"]
                           and now - t["last"] < silence),
                          key=lambda info: (info["index"], info["id"]))

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
        if self._elastic and launcher is not None and launcher["returncode"] == 0:
            # An elastic job that succeeded: the workers that failed on the way were replaced;
            # the ranks of its last round reported, 0 .. n-1.
            missing = [r for r in range(len(results)) if r not in results]
            if not results or missing:
                raise HorovodRunnerError("the elastic job succeeded but its ranks reported %s"
                                         % (sorted(results) or "nothing"))
            return [cloudpickle.loads(results[r]) for r in range(len(results))]
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
