"""Runs examples/train.py on 1 and on 2 ranks and checks the final test accuracy of both:
at least 0.95, and the same (the global batch does not depend on the number of ranks).

usage: check_example.py PYTHON MPIEXEC [MPIEXEC FLAGS...]
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train.py")


def accuracy(python, mpiexec, flags, np):
    cmd = [mpiexec, "-n", str(np)] + flags + [python, TRAIN]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print("$ " + " ".join(cmd) + "\n" + out.stdout + out.stderr)
    if out.returncode != 0:
        sys.exit("check_example: %d-rank run exited %d" % (np, out.returncode))
    found = re.search(r"final test accuracy: ([0-9.]+) \((\d+) ranks", out.stdout)
    if not found or int(found.group(2)) != np:
        sys.exit("check_example: no final accuracy line for %d ranks" % np)
    return float(found.group(1))


def main():
    python, mpiexec, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    one, two = accuracy(python, mpiexec, flags, 1), accuracy(python, mpiexec, flags, 2)
    print("check_example: accuracy %.4f on 1 rank, %.4f on 2 ranks" % (one, two))
    if min(one, two) < 0.95:
        sys.exit("check_example: accuracy below 0.95")
    if abs(one - two) > 0.01:
        sys.exit("check_example: 1 and 2 ranks disagree by more than 0.01")


if __name__ == "__main__":
    main()
