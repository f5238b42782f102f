"""Open MPI's rsh agent for hvdrun's jobs on other hosts (``-mca plm_rsh_agent``): ssh, with
the remote daemon (orted) under a guard that ends it, and every rank it started, when the ssh
session ends.

    python -m horovod_cpp.runner.ssh_agent [SSH OPTIONS...] -- HOST COMMAND...

Why: when a host's link goes down, mpirun's host is cut off from that host's orted, and the
orted (which only hears from mpirun) waits for good: its ranks end by the collective timeout,
the orted stays. The host's sshd notices that its client is gone (``ClientAliveInterval``;
the test bed sets 3 s x 3) and ends the session; the guard, the session's command, sees its
standard output hang up and kills every process of the session it started. Without python3 on
the remote host the command runs unguarded, as with plain ssh.
"""
import os
import shlex
import sys

# Runs on the remote host: python3 -c GUARD COMMAND. Starts COMMAND (a shell command line, as
# Open MPI gives it to ssh) in a session of its own; when its own stdout or stderr (the ssh
# channel) hangs up, or on SIGHUP/SIGTERM, kills every process of that session.
GUARD = r"""
import os, select, signal, subprocess, sys
child = subprocess.Popen(["/bin/sh", "-c", sys.argv[1]], start_new_session=True)
def end(*_):
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[3]) == child.pid:  # session
                        os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
    os._exit(255)
signal.signal(signal.SIGHUP, end)
signal.signal(signal.SIGTERM, end)
watch = select.poll()
for fd in (1, 2):
    watch.register(fd, select.POLLERR | select.POLLHUP)
while child.poll() is None:
    if watch.poll(500):
        end()
code = child.returncode
os._exit(128 - code if code < 0 else code)
"""


def remote_command(words):
    """The remote shell command line: ``words`` (Open MPI's command for the host) under the
    guard where the host has python3."""
    command = " ".join(words)
    return ("if command -v python3 >/dev/null 2>&1; then exec python3 -c %s %s; "
            "else exec /bin/sh -c %s; fi" % (shlex.quote(GUARD), shlex.quote(command),
                                              shlex.quote(command)))


def main(argv):
    if "--" not in argv or len(argv) < argv.index("--") + 3:
        sys.stderr.write("usage: python -m horovod_cpp.runner.ssh_agent [SSH OPTIONS...] -- "
                         "HOST COMMAND...\n")
        return 2
    cut = argv.index("--")
    ssh_options, host, words = argv[:cut], argv[cut + 1], argv[cut + 2:]
    os.execvp("ssh", ["ssh", "-x"] + ssh_options + [host, remote_command(words)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
