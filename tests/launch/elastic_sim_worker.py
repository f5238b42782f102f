"""A simulated rank of an elastic job (the driver's protocol without torch or Gloo), for
tests/launch/test_elastic.py:  elastic_sim_worker.py TARGET_SIZE [FAILING_WORKER_ID]

Joins rounds until one has TARGET_SIZE ranks, then exits 0. Between rounds it does what a real
rank's hvd.elastic.run does: a newer round (a peer failed) or a host update makes it ask for a
reset and join again. FAILING_WORKER_ID exits 3 right after joining the first round ("*":
every worker does).
HVD_SIM_START_DELAY: seconds the process takes to start before it joins (a real rank's Python
and torch imports). HVD_SIM_FROM_ROUND: rounds before this one do not end it, whatever their
size.
"""
import os
import sys
import time

from horovod_cpp import elastic

target = int(sys.argv[1])
failing = sys.argv[2] if len(sys.argv) > 2 else None
time.sleep(float(os.environ.get("HVD_SIM_START_DELAY", "0")))
w = elastic.worker()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    k = w.join()
    size = int(os.environ["HOROVOD_SIZE"])
    print("round %d rank %s size %d" % (k, os.environ["HOROVOD_RANK"], size), flush=True)
    if failing in (w.id, "*") and k == 0:
        time.sleep(0.3)
        sys.exit(3)
    if size == target and k >= int(os.environ.get("HVD_SIM_FROM_ROUND", "0")):
        time.sleep(1.0)  # the other members print too before anyone ends
        sys.exit(0)
    while time.monotonic() < deadline:
        latest = w.store().get("elastic/round")
        if int(latest) > k:
            why = "a newer round"
            break
        if w.hosts_changed():
            why = "hosts changed"
            break
        time.sleep(0.05)
    w.request_reset(why)
sys.exit(7)
