"""Open MPI's rsh agent for HorovodRunner (``-mca plm_rsh_agent``): instead of ssh, ask the
barrier task that owns ``host`` to run the daemon command, and stay in the foreground relaying
its output until it exits (exit code 255 if the task cannot be reached).

    python -m horovod_cpp.spark.rsh_agent HOST COMMAND...
"""
import json
import os
import sys

from horovod_cpp.job import proc
from horovod_cpp.job import network


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: python -m horovod_cpp.spark.rsh_agent HOST COMMAND...\n")
        return 2
    host, command = argv[1], " ".join(argv[2:])  # a shell command line, as ssh would run it
    try:
        table = json.loads(os.environ["HVD_SPARK_TASKS"])
        key = bytes.fromhex(os.environ["HVD_SPARK_KEY"])
    except (KeyError, ValueError) as e:
        sys.stderr.write("horovod_cpp rsh agent: started outside HorovodRunner (%s)\n" % e)
        return 255
    if host not in table:
        sys.stderr.write("horovod_cpp rsh agent: unknown host %s (known: %s)\n"
                         % (host, ", ".join(sorted(table))))
        return 255
    proc.watch_parent()  # mpirun gone: the connection drops and the task kills the daemon
    address = table[host][0]
    try:
        sock = network.connect(address)
        network.send(sock, key, {"type": "run", "command": command})
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
                return 255
    except (OSError, network.ProtocolError) as e:
        sys.stderr.write("horovod_cpp rsh agent: lost the task service of %s at %s: %s\n"
                         % (host, address, e))
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv))
