"""Runs a training example on 1 and on 2 ranks and checks the final test accuracy of both: at
least --min-accuracy, and the same within 0.01 (the examples' global batch does not depend on
the number of ranks). With --launches-ranks N the program starts its ranks itself
(HorovodRunner): it runs once and must report N ranks.

usage: check_accuracy.py --min-accuracy A --mpiexec MPIEXEC [--mpiexec-flag F ...] -- PROGRAM...
       check_accuracy.py --min-accuracy A --launches-ranks N -- PROGRAM...
"""
import argparse
import re
import subprocess
import sys


def accuracy(args, np):
    if args.launches_ranks:
        cmd = list(args.program)
    else:
        cmd = [args.mpiexec, "-n", str(np)] + args.mpiexec_flag + args.program
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print("$ " + " ".join(cmd) + "\n" + out.stdout + out.stderr)
    if out.returncode != 0:
        sys.exit("check_accuracy: %d-rank run exited %d" % (np, out.returncode))
    found = re.search(r"final test accuracy: ([0-9.]+) \((\d+) ranks?", out.stdout)
    if not found or int(found.group(2)) != np:
        sys.exit("check_accuracy: no final accuracy line for %d ranks" % np)
    return float(found.group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--min-accuracy", type=float, required=True)
    parser.add_argument("--mpiexec")
    parser.add_argument("--launches-ranks", type=int, default=0)
    parser.add_argument("--mpiexec-flag", action="append", default=[])
    parser.add_argument("--max-disagreement", type=float, default=0.01,
                        help="how far the 1- and 2-rank accuracies may differ (default 0.01)")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.program and args.program[0] == "--":
        args.program = args.program[1:]
    if args.launches_ranks:
        got = accuracy(args, args.launches_ranks)
        print("check_accuracy: %.4f on %d ranks" % (got, args.launches_ranks))
        if got < args.min_accuracy:
            sys.exit("check_accuracy: accuracy below %.2f" % args.min_accuracy)
        return
    if not args.mpiexec:
        parser.error("--mpiexec is required without --launches-ranks")
    one, two = accuracy(args, 1), accuracy(args, 2)
    print("check_accuracy: %.4f on 1 rank, %.4f on 2 ranks" % (one, two))
    if min(one, two) < args.min_accuracy:
        sys.exit("check_accuracy: accuracy below %.2f" % args.min_accuracy)
    if abs(one - two) > args.max_disagreement:
        sys.exit("check_accuracy: 1 and 2 ranks disagree by more than %g" % args.max_disagreement)


if __name__ == "__main__":
    main()
