"""One rank of a fault-injection job (tests/launch/test_faults.py runs it under mpirun).

    fault_worker.py kill   RANK STEPS    rank RANK SIGKILLs itself after STEPS allreduces
    fault_worker.py raise  RANK STEPS    rank RANK raises RuntimeError after STEPS training steps
    fault_worker.py stall  RANK          rank RANK never submits the tensor the others reduce
    fault_worker.py stop   RANK STEPS    rank RANK freezes (SIGSTOP) after STEPS allreduces, as a
                                         hung host would: alive, sockets open, nothing answers
    fault_worker.py killbig RANK STEPS   rank RANK submits the 64 MiB allreduce of step STEPS and
                                         SIGKILLs itself while the others are inside it

Every rank prints "step N" as it goes, so the test can see that the survivors were working.
"""
import os
import signal
import sys

import torch

import horovod_cpp.torch as hvd


def main():
    mode, victim = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    hvd.init()
    rank = hvd.rank()
    if mode in ("kill", "stop"):
        x = torch.ones(1 << 16)
        for step in range(10 ** 9):  # the survivors never stop on their own
            if rank == victim and step == steps:
                print("rank %d: %s myself" % (rank, "killing" if mode == "kill" else "stopping"),
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
            hvd.allreduce(x, name="grad.%d" % (step % 7))
            if step % 50 == 0:
                print("step %d" % step, flush=True)
    elif mode == "raise":
        torch.manual_seed(0)
        model = torch.nn.Linear(32, 4)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for step in range(10 ** 9):
            if rank == victim and step == steps:
                raise RuntimeError("rank %d: injected failure at step %d" % (rank, step))
            opt.zero_grad()
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
            if step % 50 == 0:
                print("step %d" % step, flush=True)
    elif mode == "killbig":
        import time
        x = torch.ones(16 << 20)
        for step in range(10 ** 9):
            if rank == victim and step == steps:
                hvd.allreduce_async(x, name="big.%d" % step)
                time.sleep(0.05)  # the others are past the negotiation, in the data plane
                print("rank %d: killing myself inside a collective" % rank, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce(x, name="big.%d" % step)
            print("step %d" % step, flush=True)
    elif mode == "stall":
        if rank != victim:
            hvd.allreduce(torch.ones(4), name="stalled.tensor")  # raises once shut down
        else:
            import time
            time.sleep(120)  # alive, but never submits; the stall shutdown must end the job
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
