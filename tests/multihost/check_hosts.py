"""What every rank of a cross-host job sees: its host, its local and cross ranks, the launching
shell's environment, and collectives whose results are computed by hand.

    hvdrun -np 4 -H hvd-h1:2,hvd-h2:2 python check_hosts.py --hosts hvd-h1:2,hvd-h2:2
        [--timeline FILE]   (the job was started with --timeline-filename FILE)
"""
import argparse
import json
import os
import socket
import sys

import torch

import horovod_cpp.torch as hvd


def expected_layout(hosts, rank):
    """(host, local_rank, local_size, cross_rank, cross_size) of ``rank`` when ranks fill
    the hosts of ``-H`` in order (hvdrun maps by slot)."""
    slots = [(h, int(n)) for h, n in (item.split(":") for item in hosts.split(","))]
    first = 0
    for index, (host, n) in enumerate(slots):
        if rank < first + n:
            uniform = len({s for _, s in slots}) == 1
            return host, rank - first, n, index, len(slots) if uniform else None
        first += n
    raise AssertionError("rank %d is beyond the slots of %s" % (rank, hosts))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--timeline")
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    host, local_rank, local_size, cross_rank, cross_size = expected_layout(args.hosts, rank)
    problems = []

    def check(what, got, want):
        if got != want:
            problems.append("%s: got %r, expected %r" % (what, got, want))

    check("hostname", socket.gethostname(), host)
    check("local_rank", hvd.local_rank(), local_rank)
    check("local_size", hvd.local_size(), local_size)
    check("cross_rank", hvd.cross_rank(), cross_rank)
    check("cross_size", hvd.cross_size(), cross_size)
    check("HVD_MULTIHOST_MARK", os.environ.get("HVD_MULTIHOST_MARK"), "forwarded to every host")

    # Sum of 1..size, each rank's contribution distinct; 3 MiB crosses the chunk size.
    t = torch.full((3 << 18,), float(rank + 1))
    check("allreduce", float(hvd.allreduce(t, op=hvd.Sum, name="mh.sum")[-1]),
          size * (size + 1) / 2)
    gathered = hvd.allgather(torch.tensor([[rank, cross_rank]]), name="mh.gather")
    check("allgather", gathered.tolist(),
          [[r, expected_layout(args.hosts, r)[3]] for r in range(size)])
    root = size - 1  # the last rank lives on the last host
    b = hvd.broadcast(torch.tensor([rank * 10.0]), root, name="mh.bcast")
    check("broadcast", float(b[0]), root * 10.0)
    names = hvd.allgather_object(socket.gethostname())
    check("hosts of every rank", names, [expected_layout(args.hosts, r)[0] for r in range(size)])
    hvd.shutdown()

    if args.timeline and rank == 0:
        with open(args.timeline) as f:
            text = f.read().rstrip().rstrip(",")
        events = json.loads(text if text.endswith("]") else text + "]")
        seen = {e.get("args", {}).get("name") for e in events if e.get("ph") == "M"}
        for name in ("mh.sum", "mh.gather", "mh.bcast"):
            if not any(name in str(s) for s in seen):
                problems.append("timeline: no row for %s (rows: %s)" % (name, sorted(map(str, seen))[:10]))
    if problems:
        print("rank %d on %s:\n  %s" % (rank, socket.gethostname(), "\n  ".join(problems)),
              file=sys.stderr)
        sys.exit(1)
    print("rank %d on %s: ok" % (rank, socket.gethostname()))


if __name__ == "__main__":
    main()
