"""A rank for tests/launch/test_gloo.py: ``gloo_worker.py MODE``.

    sum       allreduce of (rank + 1) * ones, prints the result and the topology
    die       rank 1 SIGKILLs itself after the first allreduce; the others print the error they
              get from their next collectives and how long it took
"""
import os
import signal
import sys
import time

import torch

import horovod_cpp.torch as hvd

mode = sys.argv[1]
hvd.init()
r, n = hvd.rank(), hvd.size()
if mode == "sum":
    out = hvd.allreduce(torch.ones(3) * (r + 1), op=hvd.Sum)
    print("rank %d size %d local %d/%d cross %d/%d gloo %s sum %s" % (
        r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
        hvd.gloo_enabled(), out.tolist()), flush=True)
elif mode == "die":
    hvd.allreduce(torch.ones(1), name="first")
    if r == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for i in range(1000):
            hvd.allreduce(torch.ones(1), name="step%d" % i)
        print("rank %d: no error" % r, flush=True)
    except hvd.HorovodInternalError as e:
        print("rank %d: HorovodInternalError after %.2f s: %s" % (r, time.monotonic() - start, e),
              flush=True)
        sys.exit(5)
hvd.shutdown()
