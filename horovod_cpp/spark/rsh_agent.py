"""Open MPI's rsh agent for HorovodRunner (``-mca plm_rsh_agent``): instead of ssh, ask the
barrier task that owns ``host`` to run the daemon command, and stay in the foreground relaying
its output until it exits (exit code 255 if the task cannot be reached or is lost).

    python -m horovod_cpp.spark.rsh_agent [--stdin] HOST COMMAND...

--stdin (run_elastic's workers): this process's stdin goes to the command's, as over ssh.
"""
import json
import os
import sys
import threading

from horovod_cpp.job import proc
from horovod_cpp.job import network


LOST = 255  # the task could not be reached, or its connection dropped


def _forward_stdin(sock, key):
    """This process's stdin to the command, then end-of-file (raw reads of fd 0)."""
    try:
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            network.send(sock, key, {"type": "in", "data": data})
        network.send(sock, key, {"type": "eof"})
    except OSError:
        pass


def main(argv):
    stdin = len(argv) > 1 and argv[1] == "--stdin"
    if stdin:
        argv = argv[:1] + argv[2:]
    if len(argv) < 3:
        sys.stderr.write("usage: python -m horovod_cpp.spark.rsh_agent [--stdin] HOST "
                         "COMMAND...\n")
        return 2
    host, command = argv[1], " ".join(argv[2:])  # a shell command line, as ssh would run it
    try:
        table = json.loads(os.environ["HVD_SPARK_TASKS"])
        key = bytes.fromhex(os.environ["HVD_SPARK_KEY"])
    except (KeyError, ValueError) as e:
        sys.stderr.write("horovod_cpp rsh agent: started outside HorovodRunner (%s)\n" % e)
        return LOST
    if host not in table:
        sys.stderr.write("horovod_cpp rsh agent: unknown host %s (known: %s)\n"
                         % (host, ", ".join(sorted(table))))
        return LOST
    proc.watch_parent()  # mpirun gone: the connection drops and the task kills the daemon
    address = table[host][0]
    try:
        sock = network.connect(address)
        network.send(sock, key, {"type": "run", "command": command, "stdin": stdin})
        if stdin:
            threading.Thread(target=_forward_stdin, args=(sock, key), daemon=True).start()
        out = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
        while True:
            message = network.recv(sock, key)
            if message["type"] == "out":
                out[message["stream"]].write(message["data"])
                out[message["stream"]].flush()
            elif message["type"] == "exit":
                code = message["code"]
                return code if code >= 0 else 128 - code
            else:
                sys.stderr.write("horovod_cpp rsh agent: %s\n" % message.get("message"))
                return LOST
    except (OSError, network.ProtocolError) as e:
        sys.stderr.write("horovod_cpp rsh agent: lost the task service of %s at %s: %s\n"
                         % (host, address, e))
        return LOST


if __name__ == "__main__":
    sys.exit(main(sys.argv))
