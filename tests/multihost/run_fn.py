"""horovod_cpp.runner.run across test hosts: every rank's value comes back, from its own host.

    python tests/multihost/run_fn.py HOSTS NP EXPECTED_HOSTS     (run on a test host)
"""
import socket
import sys

import cloudpickle

from horovod_cpp.runner import run

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def where(scale):
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() * scale
    out = (hvd.rank(), socket.gethostname(), total)
    hvd.shutdown()
    return out


def main():
    hosts, np, expected = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    results = run(where, args=(2,), np=np, hosts=hosts, start_timeout=10)
    want = [(r, expected[r], 2.0 * np) for r in range(np)]
    if results != want:
        sys.exit("run returned %r, expected %r" % (results, want))
    print("run_fn: every rank's value, from its host: %r" % (results,))


if __name__ == "__main__":
    main()
