"""Elastic training, framework-neutral parts: how a worker of an elastic job joins a round of the
driver's (horovod_cpp/job/elastic_driver.py), asks for a reset, and learns of host changes.

A worker process lives across rounds; each round is one communicator (one Gloo rendezvous under
the scope ``elastic<round>``). The driver publishes a round's assignments in the rendezvous store
and then the round's number; a worker that finds its assignment says it is ready and waits for
the driver's go (which comes once every member of the round is ready, so nobody starts a
rendezvous that a lost worker would leave hanging). Keys:

    elastic/round                      the latest round's number
    elastic/<k>/assign/<worker id>     JSON {rank, size, start, ...} or "stop:<start>" (leave
                                       the job): for that start of the id only (a slot's id
                                       repeats when a worker is started on it again, and a new
                                       worker must not take an earlier one's assignment)
    elastic/<k>/ready/<worker id>      the worker has its assignment
    elastic/<k>/go                     every member is ready: meet
    elastic/<k>/reset/<worker id>      the worker left round k and waits for the next
    elastic/arrived/<worker id>        the worker's process is up and waits for its first round
                                       (HOROVOD_ELASTIC_WORKER_START: which start of the id's)
    elastic/hosts_version              bumped by the driver when hosts were added or removed
"""
import json
import os
import sys
import time

from horovod_cpp.job.rendezvous import RendezvousClient


class HostsUpdatedInterrupt(RuntimeError):
    """Raised on every rank by ``state.check_host_updates()`` (and so by ``state.commit()``)
    when the driver has hosts to add or remove: the job resets to the new set of workers.
    ``skip_sync``: the committed state needs no broadcast afterwards (Horovod's meaning)."""

    def __init__(self, skip_sync=False):
        super().__init__("the hosts of the elastic job changed")
        self.skip_sync = skip_sync


# Set by launchers whose workers run in a process of theirs (Ray's actors): a worker that the
# driver removes raises WorkerRemoved instead of exiting the process.
in_launcher_process = False


class WorkerRemoved(BaseException):
    """Raised by ``hvd.init()`` in place of exiting the process when the worker runs inside a
    process its launcher keeps (a Ray actor) and the driver removed it from the job. A
    BaseException, so that a training loop's ``except Exception`` does not hold on to it."""

    def __init__(self, worker_id):
        super().__init__("worker %s was removed from the elastic job" % worker_id)


def enabled():
    return os.environ.get("HOROVOD_ELASTIC") == "1"


class _Worker(object):
    def __init__(self):
        self.id = os.environ["HOROVOD_ELASTIC_WORKER_ID"]
        self.client = None
        self.round = -1
        self.hosts_version = 0
        self.timeout = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "600"))

    def store(self):
        if self.client is None:
            self.client = RendezvousClient(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                           os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"],
                                           os.environ["HOROVOD_GLOO_SECRET"])
        return self.client

    def _latest(self):
        value = self.store().get("elastic/round")
        return -1 if value is None else int(value)

    def join(self):
        """Waits for a round after the current one that includes this worker, says ready,
        waits for the go and sets HOROVOD_RANK/SIZE/GLOO_SCOPE for the core's Init. Leaves the
        process (exit 0) when the driver says stop."""
        store = self.store()
        deadline = time.monotonic() + self.timeout
        seen = self.round
        if seen < 0:  # the driver tells the members of added hosts only once this is set
            store.set("elastic/arrived/%s" % self.id,
                      os.environ.get("HOROVOD_ELASTIC_WORKER_START", "0").encode())
        while time.monotonic() < deadline:
            k = self._latest()
            if k <= seen:
                time.sleep(0.05)
                continue
            raw = store.get("elastic/%d/assign/%s" % (k, self.id))
            if raw is None:  # not a member of round k: wait for a later one
                seen = k
                continue
            mine = os.environ.get("HOROVOD_ELASTIC_WORKER_START", "0")
            stop = raw.startswith(b"stop")
            meant = (raw[5:].decode() or mine) if stop else \
                str(json.loads(raw.decode()).get("start", mine))
            if meant != mine:  # an earlier worker's, on this slot: not a member of round k
                seen = k
                continue
            if stop:
                print("horovod_cpp elastic: worker %s leaves the job (the driver removed it)"
                      % self.id, file=sys.stderr, flush=True)
                sys.stdout.flush()
                if in_launcher_process:
                    raise WorkerRemoved(self.id)
                os._exit(0)
            store.set("elastic/%d/ready/%s" % (k, self.id), b"1")
            while time.monotonic() < deadline:
                if store.get("elastic/%d/go" % k) is not None:
                    assignment = json.loads(raw.decode())
                    os.environ["HOROVOD_RANK"] = str(assignment["rank"])
                    os.environ["HOROVOD_SIZE"] = str(assignment["size"])
                    os.environ["HOROVOD_GLOO_SCOPE"] = "elastic%d" % k
                    self.round = k
                    self.hosts_version = assignment.get("hosts_version", 0)
                    return k
                if self._latest() != k:
                    break  # the driver formed another round (a member never got ready)
                time.sleep(0.02)
        raise RuntimeError("horovod_cpp elastic: worker %s found no round to join within "
                           "HOROVOD_ELASTIC_TIMEOUT=%g s" % (self.id, self.timeout))

    def request_reset(self, why):
        """Leaves the current round: the driver forms the next one."""
        if self.round >= 0:
            self.store().set("elastic/%d/reset/%s" % (self.round, self.id), why.encode())

    def hosts_changed(self):
        """Whether the driver changed the hosts since this round was formed."""
        value = self.store().get("elastic/hosts_version")
        return value is not None and int(value) > self.hosts_version


_worker = None


def worker():
    global _worker
    if _worker is None:
        _worker = _Worker()
    return _worker
