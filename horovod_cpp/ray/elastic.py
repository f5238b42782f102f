"""Elastic jobs on a Ray cluster: ``ElasticRayExecutor``, and ``RayExecutor`` with
``min_workers``/``max_workers``, as in ``horovod.ray``.

    import horovod_cpp.torch as hvd
    from horovod_cpp.ray import ElasticRayExecutor

    settings = ElasticRayExecutor.create_settings(min_np=2, max_np=8, timeout_s=30)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    results = executor.run(train)   # train() uses hvd.elastic.run and a TorchState

The hosts are the cluster's live Ray nodes, each with as many slots as it has CPUs for
``cpus_per_slot`` (and GPUs for ``gpus_per_slot`` with ``use_gpu``), found again every second.
hvdrun's elastic driver (horovod_cpp/job/elastic_driver.py) runs the job over them: each
worker is a Ray actor pinned to its node (a slot), kept across the job's rounds, meeting the
others through the rendezvous store in this process. So

* a node that dies takes its workers with it: the job goes on with the workers left (at least
  ``min_np``; it waits up to ``elastic_timeout`` for nodes otherwise). A node where a worker
  died gets no new worker for ``NODE_COOLDOWN`` seconds (its death may not have reached Ray's
  control store yet; its other workers go on); a node that joins, a restarted one included (a
  new node id), gets workers, and the job grows at the next ``state.commit()``, up to
  ``max_np`` (without one: every slot there is);
* a worker whose function raises is dropped and its node blacklisted (for good, or for a time
  drawn from ``cooldown_range``), as in Horovod.

``run`` returns the values of the last round's ranks, in rank order; if the job fails, the
first rank's exception (``RankError``, with its traceback) or a ``HorovodRunnerError`` saying
why (too few workers left past ``elastic_timeout``, ``reset_limit`` reached).
"""
import os
import sys
import time
from dataclasses import dataclass

from horovod_cpp.job.service import HorovodRunnerError, RankError, check_positive_ints
from horovod_cpp.ray.common import facing_address, node_slots, outcome

# How long a node where one of our workers died gets no new worker (the head's health checks
# take ~15-30 s to declare a killed node dead; a node that is fine gets workers again after it).
NODE_COOLDOWN = 60.0


@dataclass
class ElasticSettings(object):
    """What ``ElasticRayExecutor.create_settings`` returns (Horovod's ElasticSettings, the
    parts that apply here). ``timeout_s``: the workers' Gloo timeout; ``elastic_timeout``: how
    long the job waits for workers when fewer than ``min_np`` are left, and for a round's
    members to join it; ``nics``: the network interface the workers use."""
    min_np: int = 1
    max_np: int = None
    reset_limit: int = None
    cooldown_range: tuple = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    ssh_identity_file: str = None
    nics: object = None
    verbose: int = 1


class _ElasticWorker(object):
    """One slot's worker: a Ray actor on its node (made remote in ``_Job.spawn``)."""

    def run(self, env, fn, args, kwargs, hints=None):
        os.environ.update(env)
        from horovod_cpp import elastic
        elastic.in_launcher_process = True
        if hints is not None:  # the scheduler's: where the job's goodput hints go
            from horovod_cpp.adaptive import hints as _hints
            _hints.set_sink(hints)
        return outcome(lambda: fn(*(args or ()), **(kwargs or {})))


class _ActorProcess(object):
    """A worker actor as the elastic driver's process: poll(), returncode, stop."""
    stdin = stdout = stderr = None

    def __init__(self, actor, ref, node):
        self.actor, self.ref, self.node = actor, ref, node
        self.returncode = None
        self.value = None
        self.error = None  # (type, message, traceback, exception) of the function's raise
        self.died = None  # why the actor died (Ray's words), when it did

    def poll(self):
        if self.returncode is not None:
            return self.returncode
        import ray
        import ray.exceptions
        ready, _ = ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            kind, payload = ray.get(self.ref)
        except ray.exceptions.RayError as e:  # the actor died, or could not be placed
            self.died = (str(e).strip().splitlines() or ["died"])[0]
            self.returncode = -9
            return self.returncode
        if kind == "error":
            self.error, self.returncode = payload, 1
        else:  # "ok", or "removed" (the driver told it to leave)
            self.value, self.returncode = payload, 0
        return self.returncode

    def stop(self):
        import ray
        try:
            ray.kill(self.actor)
        except Exception:
            pass
        if self.returncode is None:
            self.returncode = -15


class _Job(object):
    """One run: the Ray nodes as the driver's hosts, actors as its workers."""

    def __init__(self, executor, fn, args, kwargs):
        self.executor = executor
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.nodes = {}  # host name -> (node id, ip)

    def discover(self):
        import ray
        e = self.executor
        hosts = {}
        allotted = e.allotment() if e.allotment is not None else None
        for node in ray.nodes():
            slots = node_slots(node, e.cpus_per_slot, e.gpus_per_slot)
            if allotted is not None:
                slots = min(slots, int(allotted.get(node["NodeID"], 0)))
            if slots < 1:
                continue
            name = "%s@%s" % (node["NodeID"][:12], node["NodeManagerAddress"])
            self.nodes[name] = (node["NodeID"], node["NodeManagerAddress"])
            hosts[name] = slots
        return hosts

    def spawn(self, host, env, command, secret):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        node_id, _ = self.nodes[host]
        e = self.executor
        actor = ray.remote(_ElasticWorker).options(
            num_cpus=e.cpus_per_slot, num_gpus=e.gpus_per_slot,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        ).remote()
        env = dict(env, HOROVOD_GLOO_SECRET=secret,
                   HOROVOD_GLOO_TIMEOUT_SECONDS=str(e.settings.timeout_s))
        nics = e.settings.nics
        if nics:
            env["HOROVOD_GLOO_IFACE"] = nics if isinstance(nics, str) else sorted(nics)[0]
        env.update(e.env_vars)
        return _ActorProcess(actor, actor.run.remote(env, self.fn, self.args, self.kwargs,
                                                     e.hints),
                             node_id)

    def hostname(self, host):
        return self.nodes[host][1]

    def lost(self, worker):
        """A worker whose actor died (not one whose function raised) went down with its node,
        or as if it had: its node gets no new worker for NODE_COOLDOWN seconds (its other
        workers go on)."""
        p = worker.proc
        if p.died is None:
            return False
        self.executor._log("worker %s died (%s); its node sits out %g s"
                           % (worker.id, p.died, NODE_COOLDOWN))
        return NODE_COOLDOWN


class ElasticRayExecutor(object):
    """Runs an elastic function on the Ray cluster's nodes (see the module's documentation).
    ``cpus_per_slot``/``gpus_per_slot``: each worker's resources (a node has as many slots as
    they fit in it); ``env_vars``: variables every worker gets.

    For the scheduler (``horovod_cpp.ray.scheduler``): ``allotment()`` returns the slots the job
    may use, {Ray node id: slots}, read again every second (the job grows into slots added and
    drains slots taken away at its next commit, within ``drain_seconds``); ``hints`` is a
    callable the workers' adaptive training sends its goodput hints to."""

    @staticmethod
    def create_settings(min_np=None, max_np=None, reset_limit=None, elastic_timeout=600,
                        timeout_s=30, ssh_identity_file=None, nics=None, min_num_proc=None,
                        max_num_proc=None, cooldown_range=None, verbose=1, **kwargs):
        min_np = min_np if min_np is not None else (min_num_proc or 1)
        max_np = max_np if max_np is not None else max_num_proc
        return ElasticSettings(min_np=min_np, max_np=max_np, reset_limit=reset_limit,
                               cooldown_range=cooldown_range, elastic_timeout=elastic_timeout,
                               timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                               nics=nics, verbose=verbose)

    def __init__(self, settings, use_gpu=False, cpus_per_slot=1, gpus_per_slot=None,
                 env_vars=None, override_discovery=True, allotment=None, drain_seconds=0.0,
                 hints=None):
        self.settings = settings or ElasticSettings()
        s = self.settings
        check_positive_ints(min_np=s.min_np, max_np=s.max_np)
        if s.max_np is not None and s.max_np < s.min_np:
            raise ValueError("need min_np <= max_np, got %d > %d" % (s.min_np, s.max_np))
        if cpus_per_slot is None or cpus_per_slot <= 0:
            raise ValueError("cpus_per_slot must be positive, got %r" % (cpus_per_slot,))
        if gpus_per_slot and not use_gpu:
            raise ValueError("gpus_per_slot is set but use_gpu is False")
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        self.env_vars = {k: str(v) for k, v in (env_vars or {}).items()}
        self.allotment = allotment
        self.drain_seconds = drain_seconds
        self.hints = hints
        self.history = []  # the rounds of the last (or current) run: (round, [ids], reason)
        self.driver = None  # the elastic driver of the run under way
        self._job = None
        self._started = False
        self.log_tag = None  # (the scheduler's: its job's name, in each log line)

    def node_of_host(self, host):
        """The Ray node id of one of the run's hosts (None if unknown)."""
        job = self._job
        return job.nodes.get(host, (None, None))[0] if job is not None else None

    def start(self):
        """Connects to the Ray cluster (``RAY_ADDRESS``, else a local one) if not yet."""
        import ray
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
        self._started = True

    def _log(self, text):
        if self.settings.verbose >= 1:
            print("horovod_cpp.ray elastic: %s %s%s" % (
                time.strftime("%H:%M:%S"), "(%s) " % self.log_tag if self.log_tag else "",
                text), flush=True)

    def run(self, worker_fn, callbacks=None, args=None, kwargs=None):
        """Runs ``worker_fn(*args, **kwargs)`` as an elastic job; the values of the last
        round's ranks, in rank order. ``callbacks`` are accepted and not called (as
        RayExecutor's)."""
        from horovod_cpp.job.elastic_driver import ElasticDriver, ElasticError

        if not self._started:
            raise RuntimeError("ElasticRayExecutor: start() first")
        s = self.settings
        job = self._job = _Job(self, worker_fn, args, kwargs)
        hosts = job.discover()
        slots = sum(hosts.values())
        if slots < s.min_np:
            raise ValueError(
                "ElasticRayExecutor: the Ray cluster's live nodes have %d slots of %g CPUs%s, "
                "fewer than min_np %d" % (slots, self.cpus_per_slot, " and %g GPUs"
                                          % self.gpus_per_slot if self.gpus_per_slot else "",
                                          s.min_np))
        # No max_np: no bound but the slots there are (the nodes that join later, the
        # scheduler's allotment as it grows), as in Horovod, not the slots found at the start.
        max_np = s.max_np or sys.maxsize
        driver = ElasticDriver(
            ["ray"], min(slots, max_np), s.min_np, max_np, elastic_timeout=s.elastic_timeout,
            reset_limit=s.reset_limit, cooldown_range=s.cooldown_range, log=self._log,
            discover=job.discover, spawn=job.spawn, hostname=job.hostname, lost=job.lost,
            address=facing_address([ip for _, ip in job.nodes.values()]),
            stop=_ActorProcess.stop, drain_seconds=self.drain_seconds)
        self.driver = driver
        self.history = driver.history  # (the rounds as they form, for whoever watches)
        try:
            rc = driver.run()
        except ElasticError as e:
            failed = [w for w in driver.workers if w.proc.error is not None]
            if not failed:
                raise HorovodRunnerError("ElasticRayExecutor: %s" % e) from None
            cause = _rank_error(failed[0])
            raise HorovodRunnerError("ElasticRayExecutor: %s (first failure: worker %s raised "
                                     "%s: %s)" % (e, failed[0].id, cause.exc_type,
                                                  failed[0].proc.error[1])) from cause
        finally:
            for w in driver.workers:
                w.proc.stop()
        members = driver.members
        if rc == 0:
            return [w.proc.value for w in members]
        for w in members:
            if w.proc.error is not None:
                raise _rank_error(w)
        raise HorovodRunnerError("ElasticRayExecutor: the job failed: %s" % "; ".join(
            "rank %d (%s) %s" % (w.rank, w.id, w.proc.died or "exit %s" % w.ended)
            for w in members if w.ended != 0))


def _rank_error(worker):
    """The RankError of a worker whose function raised (its rank in its last round)."""
    exc_type, message, text, exc = worker.proc.error
    error = RankError(worker.rank if worker.rank is not None else -1, exc_type, message, text)
    error.__cause__ = exc
    return error


__all__ = ["ElasticRayExecutor", "ElasticSettings"]
