"""Runs one rank on a remote host for a launcher that started it over ssh.

    ssh HOST python -m horovod_cpp.job.task_exec CWD -- COMMAND...

The first line of stdin is the job's secret (HOROVOD_GLOO_SECRET: never on a command line,
where ``ps`` would show it), the second a JSON object of environment variables for the rank.
The rank runs in a session of its own; when stdin closes (the launcher ended it, or ssh
died with the launcher or its host's link) the rank's whole process group is stopped. The exit
status is the rank's (128 + N for signal N).
"""
import json
import os
import signal
import sys
import threading

from horovod_cpp.job import proc


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m horovod_cpp.job.task_exec CWD -- COMMAND...", file=sys.stderr)
        return 2
    cwd, command = argv[0], argv[2:]
    # Raw reads of fd 0 (no buffered stdin whose lock a daemon thread could hold at exit).
    pending = b""
    while pending.count(b"\n") < 2:
        chunk = os.read(0, 65536)
        if not chunk:
            print("task_exec: stdin closed before the secret and environment", file=sys.stderr)
            return 2
        pending += chunk
    secret, env_json, _ = pending.split(b"\n", 2)
    secret = secret.decode().strip()
    env = dict(os.environ)
    env.update(json.loads(env_json.decode() or "{}"))
    env["HOROVOD_GLOO_SECRET"] = secret
    child = proc.popen(command, cwd=cwd, env=env, stdin=open(os.devnull, "rb"))

    def watch_stdin():
        while os.read(0, 4096):
            pass
        proc.stop_group(child, grace=2.0)

    threading.Thread(target=watch_stdin, name="hvd-stdin-watch", daemon=True).start()
    code = child.wait()
    proc.stop_group(child, grace=1.0)  # whatever the rank left in its group
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without waiting for the stdin watcher
