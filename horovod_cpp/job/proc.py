"""Child processes that never outlive whoever started them.

Every launcher process (mpirun, orted, the ranks' shell) runs in its own session, so that its
whole process group can be signalled, and gets PR_SET_PDEATHSIG: if the thread that started it
dies, the kernel sends it SIGTERM. ``stop_group`` is SIGTERM, a grace period, then SIGKILL.
"""
import collections
import ctypes
import os
import signal
import subprocess
import time

_PR_SET_PDEATHSIG = 1
_libc = None


def _set_pdeathsig():
    # Runs in the child between fork and exec: only async-signal-safe work.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def popen(args, **kwargs):
    """subprocess.Popen in a new session that dies with its parent thread.

    Call it from a thread that lives as long as the child should (PR_SET_PDEATHSIG fires when
    the creating *thread* exits)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return subprocess.Popen(args, start_new_session=True, preexec_fn=_set_pdeathsig, **kwargs)


def stop_group(proc, grace=3.0):
    """Stops ``proc`` and everything in its process group; returns its exit status."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    # Descendants may still be alive after the leader exited.
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(proc.pid, signal.SIGKILL)
    return proc.wait()


def kill_group(proc):
    """SIGKILLs ``proc``, its process group and its other descendants at once (mpirun starts
    ssh in groups of their own); returns its exit status. For a process known to be stuck (a
    SIGTERM would only add its own noise)."""
    others = descendants(proc.pid)
    _signal_group(proc.pid, signal.SIGKILL)
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.wait()


def descendants(pid):
    """The pids below ``pid`` in the process tree (Linux /proc), children first."""
    children = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def describe_exit(returncode):
    """'exit code 3' or 'signal 9 (SIGKILL)' for a Popen returncode (negative = signal)."""
    if returncode is not None and returncode < 0:
        return "signal %d (%s)" % (-returncode, signal_name(-returncode))
    return "exit code %s" % returncode


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def watch_parent(poll_seconds=0.5):
    """Starts a daemon thread that exits this process when its parent goes away (reparenting
    changes getppid), for processes whose parent cannot be trusted to clean up."""
    import threading

    parent = os.getppid()

    def watch():
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="hvd-parent-watch", daemon=True).start()
