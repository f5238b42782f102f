"""Starting one worker process of a job on a host, for every launcher that starts its own
(hvdrun --gloo, the elastic drivers of hvdrun and of Spark): locally as a child, on another
host over ssh through ``python -m horovod_cpp.job.task_exec`` (same interpreter path and
working directory there), which takes the job's secret and environment on stdin and stops the
process when ssh goes away; its output lines; stopping it; the address the other hosts reach
this one on.
"""
import json
import os
import shlex
import subprocess
import sys
import threading

from horovod_cpp.job import mpirun, network, proc

LOCAL_NAMES = ("localhost", "127.0.0.1")


def is_local(name):
    return name in LOCAL_NAMES or mpirun.is_this_host(name)


def facing_address(hosts):
    """The address of this host that the other hosts reach it on: HOROVOD_GLOO_RENDEZVOUS_ADDR
    when hvdrun's environment sets it, else loopback if all hosts are local, else the source
    address of the route to the first other host."""
    if os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    remote = [h for h, _ in hosts if not is_local(h)]
    if not remote:
        return "127.0.0.1"
    return network.source_address(remote[0], 22)


# ssh notices a host that stopped answering (its link down) within ~6 s and exits 255, which
# ends that host's ranks for the launcher.
SSH_ALIVE = ["-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]


def remote_argv(host, command, ssh_args=(), ssh="ssh"):
    inner = [sys.executable, "-m", "horovod_cpp.job.task_exec", os.getcwd(), "--"]
    return ([ssh, "-o", "BatchMode=yes"] + SSH_ALIVE + list(ssh_args) +
            [host, " ".join(shlex.quote(a) for a in inner + list(command))])


def spawn(host, env, command, secret, ssh_args=(), ssh="ssh"):
    """Starts ``command`` on ``host`` with ``env`` added to the environment (on another host:
    the variables hvdrun forwards, then ``env``) and the job's secret; stdout/stderr piped.
    Call it from a thread that outlives the process (proc.popen's parent-death signal)."""
    if is_local(host):
        full = dict(os.environ)
        full.update(env)
        full["HOROVOD_GLOO_SECRET"] = secret
        return proc.popen(list(command), env=full, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    remote_env = {n: os.environ[n] for n in mpirun.forwarded_env() if n in os.environ}
    remote_env.update(env)
    p = proc.popen(remote_argv(host, command, ssh_args, ssh), stdin=subprocess.PIPE,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write((secret + "\n" + json.dumps(remote_env) + "\n").encode())
    p.stdin.flush()  # stdin stays open: closing it stops the rank
    return p


def read_output(p, tag, on_line):
    """Threads passing ``p``'s output lines to ``on_line(tag, stream, text)``."""
    def read(stream, pipe):
        for raw in iter(pipe.readline, b""):
            on_line(tag, stream, raw.decode("utf-8", "replace").rstrip("\n"))
        pipe.close()
    threads = []
    for stream in ("stdout", "stderr"):
        t = threading.Thread(target=read, args=(stream, getattr(p, stream)), daemon=True,
                             name="hvd-out-%s" % tag)
        t.start()
        threads.append(t)
    return threads


def stop_process(p):
    """Closes a remote rank's stdin (task_exec then stops it) and stops the local process."""
    if p.stdin is not None and not p.stdin.closed:
        try:
            p.stdin.close()
        except OSError:
            pass
    proc.stop_group(p, grace=2.0)
