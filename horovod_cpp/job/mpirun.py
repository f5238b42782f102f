"""The one place that builds and runs mpirun commands (hvdrun and HorovodRunner both use it).

``build_command`` returns the argv; ``Launch`` runs it, turns Open MPI's ``[1,R]<stdout>:``
tags into ``[R]<stdout>:`` lines for a callback, keeps the last lines of every rank, and
explains a failure (which rank, exit code or signal) from mpirun's own report.
"""
import collections
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from horovod_cpp._build import import_core
from horovod_cpp.job import proc
from horovod_cpp.job.hosts import hosts_arg


# ---- HOROVOD_* knobs as command-line flags --------------------------------------------------

def _number(kind, lo, hi):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise ValueError("expected a%s number, got %r"
                             % ("n integer" if kind is int else "", text))
        if not lo <= value <= hi:
            raise ValueError("%s is outside [%s, %s]" % (text, lo, hi))
        return value
    return parse


class Knob(collections.namedtuple("Knob", "flag aliases env kind parse to_env help")):
    """One hvdrun flag for a HOROVOD_* knob. ``parse`` is None for a switch (store_true)."""
    __slots__ = ()

    @property
    def dest(self):
        """The argparse attribute of the flag: --cycle-time-ms -> cycle_time_ms."""
        return self.flag.lstrip("-").replace("-", "_")


LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


def _flag_of(spec):
    """The Knob for one entry of the core's knob table (common/config/knobs.def)."""
    kind, scale = spec["type"], spec["flag_scale"]
    # Bounds as people write them: 60000, not 60000.0.
    lo, hi = (int(b) if b == int(b) else b for b in (spec["min"] / scale, spec["max"] / scale))
    unit = " This flag is in MiB." if scale == 1 << 20 else ""
    text = "%s Sets %s (default %s).%s" % (spec["help"], spec["name"], spec["default"], unit)
    text = text.replace("%", "%%")  # argparse formats help texts
    if kind == "bool":
        parse, to_env = None, lambda _: "1"
    elif kind == "level":
        parse, to_env = str.lower, str
    elif kind == "path":
        keyword = spec["note"]
        parse = str
        to_env = lambda path: path if keyword and path == keyword else os.path.abspath(path)
    elif kind in ("bytes", "integer") and scale == 1:
        parse, to_env = _number(int, lo, hi), str
    elif kind in ("bytes", "integer"):
        parse, to_env = _number(float, lo, hi), lambda v: str(int(v * scale))
    else:
        parse, to_env = _number(float, lo, hi), repr
    aliases = (spec["flag_alias"],) if spec["flag_alias"] else ()
    return Knob(spec["flag"], aliases, spec["name"], kind, parse, to_env, text)


_KNOBS = []


def knobs():
    """hvdrun's knob flags, one per knob of the core's table that declares a flag."""
    if not _KNOBS:
        _KNOBS.extend(_flag_of(spec) for spec in import_core().knobs() if spec["flag"])
    return tuple(_KNOBS)


# hvdrun gives every rank, on every host, the launching shell's environment (as horovodrun
# does) with -x NAME, so values never appear on a command line; except these, which belong to
# the host or the session a process runs in (a remote rank keeps its own), or to Open MPI
# itself (a job launched from inside another job's rank must not inherit its identity).
EXCLUDED_ENV = ("HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_",
                "TERM", "DISPLAY", "XAUTHORITY", "MAIL", "CUDA_VISIBLE_DEVICES")
EXCLUDED_ENV_PREFIXES = ("SSH_", "BASH_FUNC_", "PMIX_", "ORTE_", "OPAL_", "OMPI_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def forwarded_env(environ=None):
    """The names of ``environ`` (default os.environ) that hvdrun forwards to every rank:
    all but EXCLUDED_ENV, names starting with EXCLUDED_ENV_PREFIXES (OMPI_MCA_* parameters
    do go: they configure the job) and names that are not plain identifiers."""
    environ = os.environ if environ is None else environ
    names = []
    for name in sorted(environ):
        if not _ENV_NAME.match(name) or name in EXCLUDED_ENV:
            continue
        if name.startswith(EXCLUDED_ENV_PREFIXES) and not name.startswith("OMPI_MCA_"):
            continue
        names.append(name)
    return names


def horovod_env(environ=None):
    """The HOROVOD_* variables of ``environ`` (default os.environ)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith("HOROVOD_")}


# ---- hosts over ssh -------------------------------------------------------------------------

def ssh_options(port=None, identity_file=None):
    """ssh arguments for a port and a key (empty when neither is given)."""
    out = []
    if port is not None:
        out += ["-p", str(port)]
    if identity_file is not None:
        out += ["-i", os.path.abspath(identity_file)]
    return out


def is_this_host(name):
    """Whether ``name`` is this machine (mpirun starts its ranks without ssh)."""
    return name in ("localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn())


def unreachable_hosts(names, timeout, ssh_args=(), ssh="ssh"):
    """[(host, why)] for the hosts other than this one that do not run ``ssh HOST true``
    within ``timeout`` seconds (all tried at once; BatchMode: never a password prompt)."""
    deadline = time.monotonic() + timeout
    procs = {}
    for name in dict.fromkeys(names):
        if is_this_host(name):
            continue
        # The deadline below decides; ssh's own connect timeout only stops it afterwards.
        argv = [ssh, "-o", "BatchMode=yes", "-o",
                "ConnectTimeout=%d" % (int(timeout) + 5)] + list(ssh_args) + [name, "true"]
        try:
            procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as e:
            for started in procs.values():
                started.kill()
                started.wait()
                started.stderr.close()
            return [(host, "cannot run ssh: %s" % e) for host in names if not is_this_host(host)]
    failed = []
    for name, p in procs.items():
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            failed.append((name, "no answer within %g s" % timeout))
        else:
            if p.returncode != 0:
                why = p.stderr.read().decode("utf-8", "replace").strip().splitlines()
                failed.append((name, why[-1] if why else "ssh exited with %d" % p.returncode))
        p.stderr.close()
    return failed


# ---- the command ----------------------------------------------------------------------------

class MpirunNotFound(RuntimeError):
    pass


def find_mpirun():
    path = shutil.which("mpirun")
    if path is None:
        raise MpirunNotFound("mpirun not found on PATH (%s); install Open MPI "
                             "(Debian: apt-get install openmpi-bin)"
                             % os.environ.get("PATH", ""))
    return path


def build_command(np, command, hosts=None, env=None, passthrough=(), mpi_args=(),
                  oversubscribe=False, rsh_agent=None, mpirun="mpirun", as_root=None):
    """The mpirun argv running ``command`` (a list) on ``np`` ranks.

    hosts: [(name, slots)] or None for this machine. env: {name: value} given to every rank
    with -x NAME=VALUE; passthrough: names given with -x NAME (value from mpirun's
    environment, so secrets never appear on a command line). Binding is off and ranks are
    mapped by slot: each rank runs a training thread and horovod_cpp's background thread, which
    must not share one core.

    MPI's progress loop yields the core while it waits (``mpi_yield_when_idle 1``, unless
    ``mpi_args`` or OMPI_MCA_mpi_yield_when_idle choose otherwise): a rank blocked in a
    collective then leaves the CPU to its own training thread instead of spinning on it
    (measured in docs/performance.md: +10-25% samples/s for a communication-heavy model when
    ranks share cores with their compute threads)."""
    if as_root is None:
        as_root = os.geteuid() == 0
    argv = [mpirun]
    if as_root:
        argv.append("--allow-run-as-root")
    argv += ["--tag-output", "-np", str(np)]
    if hosts:
        argv += ["-H", hosts_arg(hosts)]
    argv += ["--bind-to", "none", "--map-by", "slot"]
    if oversubscribe:
        argv.append("--oversubscribe")
    if ("mpi_yield_when_idle" not in " ".join(mpi_args)
            and "OMPI_MCA_mpi_yield_when_idle" not in os.environ):
        argv += ["-mca", "mpi_yield_when_idle", "1"]
    if rsh_agent:
        argv += ["-mca", "plm_rsh_agent", rsh_agent]
    for name, value in sorted((env or {}).items()):
        argv += ["-x", "%s=%s" % (name, value)]
    for name in passthrough:
        argv += ["-x", name]
    argv += list(mpi_args)
    argv += list(command)
    return argv


def quote(argv):
    return " ".join(shlex.quote(a) for a in argv)


# ---- running it -----------------------------------------------------------------------------

_TAG_ANYWHERE = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
_SIGNALED = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal "
                       r"(\d+) \(([^)]*)\)")
_PROCESS = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
_SHUT_DOWN_BY = re.compile(r"shutdown requested by rank (\d+) \(([^)]*)\)")


def shut_down_by(line):
    """(rank, host) of the rank that shut the job down, when a rank's `line` reports it (the
    ranks that did not fail first, e.g. a rank that raised, see "shutdown requested by rank 1
    (host)"); else None."""
    if "shutdown requested by" not in line:
        return None
    m = _SHUT_DOWN_BY.search(line)
    return (int(m.group(1)), m.group(2)) if m else None
_EXIT_CODE = re.compile(r"Exit code:\s+(\d+)")


def split_tagged(line, partial):
    """The complete lines in one physical line of ``mpirun --tag-output`` output.

    Open MPI tags every chunk a rank writes, not every line, so ranks writing without line
    buffering give ``[1,2]<stdout>:a[1,2]<stdout>:b[1,1]<stdout>:c`` followed by more. Every
    chunk but the last is an unfinished line of its rank (kept in ``partial``); the last one
    ended with the newline and completes its rank's line. Untagged text is mpirun's own
    (rank None)."""
    pieces = _TAG_ANYWHERE.split(line)
    out = []
    if pieces[0] or len(pieces) == 1:
        out.append((None, "stderr", pieces[0]))
    tags = [(int(pieces[i]), pieces[i + 1], pieces[i + 2]) for i in range(1, len(pieces), 3)]
    for i, (rank, kind, text) in enumerate(tags):
        text = partial.pop((rank, kind), "") + text
        if i + 1 < len(tags):
            partial[(rank, kind)] = text
        else:
            out.append((rank, kind, text))
    return out


class Result(object):
    """How an mpirun run ended: ``returncode``, ``failed_rank`` with ``failure`` ('exit code
    3' / 'signal 9 (Killed)') when mpirun reported one, ``tails`` {rank: last lines} and
    ``launcher_tail`` (mpirun's own untagged lines)."""

    def __init__(self, returncode, failed_rank, failure, tails, launcher_tail,
                 stopped_after_abort=False):
        self.stopped_after_abort = stopped_after_abort
        self.returncode = returncode
        self.failed_rank = failed_rank
        self.failure = failure
        self.tails = tails
        self.launcher_tail = launcher_tail

    def describe(self):
        """One paragraph saying why the job failed, with the failing rank's last lines."""
        text = "mpirun exited with %s" % proc.describe_exit(self.returncode)
        if self.stopped_after_abort:
            text = ("the job aborted and mpirun, waiting for a host it could not reach, was "
                    "killed")
        if self.failed_rank is not None:
            text += ": rank %d exited with %s" % (self.failed_rank, self.failure)
        elif not self.stopped_after_abort and self.returncode is not None \
                and 128 < self.returncode < 128 + 65:
            # Open MPI passes a rank's signal on as 128 + N; its report of which rank is
            # missing (it ends some failed jobs with only "Primary job terminated normally,
            # but 1 process returned a non-zero exit code").
            number = self.returncode - 128
            text += (": a rank exited with signal %d (%s), or with exit code %d; mpirun did "
                     "not say which rank" % (number, proc.signal_name(number), self.returncode))
        lines = self.tails.get(self.failed_rank) if self.failed_rank is not None else None
        culprit = self._shut_down_by()
        if culprit is not None and culprit[0] != self.failed_rank:
            # Not the rank that exited first: the one whose failure shut the job down.
            text += "; rank %d (on %s) shut the job down" % culprit
            if self.tails.get(culprit[0]):
                lines = self.tails[culprit[0]]
                text += "\nlast output of rank %d:\n  %s" % (culprit[0], "\n  ".join(lines))
                return text
        timed_out = self._collective_timeout() if self.failed_rank is None else None
        if lines:
            text += "\nlast output of rank %d:\n  %s" % (self.failed_rank, "\n  ".join(lines))
        elif timed_out:
            text += "\n%s" % "\n".join(timed_out)
        elif self.failed_rank is None and self.launcher_tail:
            text += "\nlast output of mpirun:\n  %s" % "\n  ".join(self.launcher_tail)
        return text

    def _shut_down_by(self):
        for rank in sorted(r for r in self.tails if r is not None):
            for line in self.tails[rank]:
                culprit = shut_down_by(line)
                if culprit is not None:
                    return culprit
        return None

    def _collective_timeout(self):
        """The first rank's report of a collective timeout (it names the silent ranks and
        their hosts), or None."""
        for rank in sorted(self.tails):
            lines = self.tails[rank]
            for i, line in enumerate(lines):
                if "collective timeout: rank " in line:
                    return lines[i:i + 8]
        return None


def own_session_dir(argv, env=None):
    """(argv, directory): ``argv`` with an Open MPI session directory base of this job's own (a
    new directory, which the caller removes once mpirun has ended), or (argv, None) where the
    argv or the environment already chooses a local or remote one.

    Open MPI 4.1 keeps one directory per host and user (ompi.<host>.<uid>) under the temporary
    directory, made by each mpirun as it starts and removed by each as it ends when empty: one
    mpirun's cleanup can remove it between another's mkdir and stat, and that mpirun fails
    ("A call to mkdir was unable to create the desired directory ... File exists"). Two jobs
    started together on one machine hit it (2 mpiruns in 200, 20 at a time, here). The new
    directory is made where Open MPI would have made its own: below the
    OMPI_MCA_orte_tmpdir_base of ``env`` (default os.environ) where set, else TMPDIR (or /tmp).
    It is the global base (orte_tmpdir_base): with only the local one (orte_local_tmpdir_base)
    every MPI rank refuses to start, as mpirun also hands its ranks the global one. Daemons on
    other hosts make the same path there and leave it empty when the job ends."""
    if (os.path.basename(argv[0]) not in ("mpirun", "mpiexec", "orterun")
            or any("tmpdir_base" in a for a in argv)):
        return list(argv), None  # not mpirun (runner.run starts hvdrun, which calls this)
    env = os.environ if env is None else env
    if env.get("OMPI_MCA_orte_local_tmpdir_base") or env.get("OMPI_MCA_orte_remote_tmpdir_base"):
        return list(argv), None
    base = env.get("OMPI_MCA_orte_tmpdir_base")
    if base:
        os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix="hvd-mpi.", dir=base or None)
    return [argv[0], "-mca", "orte_tmpdir_base", path] + list(argv[1:]), path


class Launch(object):
    """Runs an mpirun argv; ``on_line(rank, stream, text)`` gets every rank's line (rank None
    for mpirun's own). ``wait()`` returns a Result. Call from a thread that outlives the job
    (the child dies with the thread that started it). The job has a session directory of its
    own (own_session_dir), removed when ``wait`` returns.

    Once the job has aborted (MPI_Abort, e.g. by horovod_cpp's collective timeout), mpirun
    stops every rank and exits; but it waits for good for a daemon on a host it can no longer
    reach (a dead link). ``wait`` stops it ABORT_GRACE seconds after the abort."""

    TAIL = 30
    ABORT_GRACE = 10.0
    DRAIN_SECONDS = 30.0
    _ABORTED = ("MPI_ABORT was invoked", "collective timeout: rank ")

    def __init__(self, argv, on_line, env=None, cwd=None):
        self._on_line = on_line
        self._tails = collections.defaultdict(lambda: collections.deque(maxlen=self.TAIL))
        self._launcher = collections.deque(maxlen=self.TAIL)
        self._lock = threading.Lock()
        self._failed_rank = None
        self._failure = None
        self._pending_process = None
        self._aborted_at = None
        self.stopped_after_abort = False
        argv, self._session_dir = own_session_dir(argv, env)
        try:
            self.proc = proc.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env, cwd=cwd)
        except BaseException:
            self._remove_session_dir()
            raise
        self._readers = [threading.Thread(target=self._read, args=(f,), daemon=True,
                                          name="hvd-mpirun-" + name)
                         for f, name in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in self._readers:
            t.start()

    def _read(self, stream):
        partial = {}  # (rank, stream) -> text of a line that rank has not finished yet
        for raw in iter(stream.readline, b""):
            for rank, kind, text in split_tagged(raw.decode("utf-8", "replace").rstrip("\n"),
                                                 partial):
                with self._lock:
                    if rank is None:
                        self._launcher.append(text)
                        self._parse_report(text)
                    else:
                        self._tails[rank].append(text)
                    if self._aborted_at is None and any(m in text for m in self._ABORTED):
                        self._aborted_at = time.monotonic()
                self._on_line(rank, kind, text)
        stream.close()

    def _parse_report(self, line):
        if self._failed_rank is not None:
            return
        m = _SIGNALED.search(line)
        if m:
            self._failed_rank = int(m.group(1))
            self._failure = "signal %s (%s) on node %s" % (m.group(4), m.group(5), m.group(3))
            return
        m = _PROCESS.search(line)
        if m:
            self._pending_process = int(m.group(1))
            return
        m = _EXIT_CODE.search(line)
        if m and self._pending_process is not None:
            self._failed_rank = self._pending_process
            self._failure = "exit code %s" % m.group(1)

    def _join_readers(self, seconds):
        deadline = time.monotonic() + seconds
        for t in self._readers:
            t.join(max(0.0, deadline - time.monotonic()))

    def _remove_session_dir(self):
        if self._session_dir is not None:
            shutil.rmtree(self._session_dir, ignore_errors=True)

    def terminate(self):
        proc.stop_group(self.proc)

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        returncode = None
        while returncode is None:
            try:
                returncode = self.proc.wait(1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            with self._lock:
                aborted_at = self._aborted_at
            if aborted_at is not None and now - aborted_at > self.ABORT_GRACE:
                self.stopped_after_abort = True
                self._on_line(None, "stderr",
                              "horovod_cpp: mpirun has not ended %g s after the job aborted "
                              "(it waits for a host it cannot reach: see the ranks' messages "
                              "above); killing it" % self.ABORT_GRACE)
                returncode = proc.kill_group(self.proc)
            elif deadline is not None and now >= deadline:
                returncode = proc.stop_group(self.proc)
        # Every line mpirun wrote is read before the Result is made: its report of the rank
        # that failed is the last thing it writes, and a reader that is behind (a loaded
        # machine) must not lose it. Where the output has not ended within a few seconds (a
        # descendant still holds the pipes), what mpirun left in its session is stopped first.
        self._join_readers(self.DRAIN_SECONDS / 6)
        proc.stop_group(self.proc, grace=1.0)
        self._join_readers(self.DRAIN_SECONDS)
        self._remove_session_dir()
        with self._lock:
            return Result(returncode, self._failed_rank, self._failure,
                          {r: list(t) for r, t in self._tails.items()}, list(self._launcher),
                          self.stopped_after_abort)


def forward_signals(launch):
    """SIGINT/SIGTERM to this process stop the job (mpirun then stops the ranks)."""
    def handler(signum, frame):
        try:
            os.killpg(launch.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
