"""``horovod_cpp.ray``: horovod_cpp on a Ray cluster, as ``horovod.ray``.

    import ray
    from horovod_cpp.ray import RayExecutor

    ray.init(address="auto")                  # or a local cluster: ray.init()
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1)
    executor.start()
    results = executor.run(train, args=[...], kwargs={...})   # every worker's value, rank order
    executor.shutdown()

Each worker is a Ray actor holding ``cpus_per_worker`` CPUs (and ``gpus_per_worker`` GPUs with
``use_gpu``) in one placement group, so the job starts whole or not at all. The workers of a
node get consecutive ranks (local ranks 0, 1, ...); they run on the Gloo backend, meeting
through a rendezvous store in the driver's process (authenticated with a per-executor secret).
``run`` calls ``fn(*args, **kwargs)`` on every worker (``fn`` calls ``hvd.init()`` as in any
horovod_cpp program); ``execute(fn)`` calls ``fn(executable)`` with each worker's instance of
``start(executable_cls=...)``; ``execute_single`` does so on rank 0 only; ``run_remote``
returns the ObjectRefs.

Errors: too few CPUs or GPUs in the cluster for the workers is a ValueError at ``start``;
resources that exist but stay busy past ``placement_group_timeout_s`` a TimeoutError, and so
are workers whose processes do not start within ``timeout_s`` once placed. A
worker's exception is raised by ``run`` as ``horovod_cpp.job.service.RankError`` (its rank, its
traceback; also ``horovod_cpp.spark.RankError``), a worker or node that dies as
``HorovodRunnerError`` naming the rank and the node. After an error the other workers may
still be waiting for the failed one (up to HOROVOD_GLOO_TIMEOUT_SECONDS): ``shutdown()`` ends
them, then ``start()`` again.

Elastic jobs: ``ElasticRayExecutor``, or ``RayExecutor(settings, min_workers=...,
max_workers=...)`` (horovod_cpp/ray/elastic.py).
"""
import os
import socket
from dataclasses import dataclass

from horovod_cpp.job.rendezvous import RendezvousServer, new_secret
from horovod_cpp.job.service import HorovodRunnerError, RankError, check_positive_ints
from horovod_cpp.ray.common import facing_address, outcome


@dataclass
class Settings(object):
    """What ``RayExecutor.create_settings`` returns (Horovod's MiniSettings). ``timeout_s``:
    the workers' Gloo rendezvous and collective timeout (HOROVOD_GLOO_TIMEOUT_SECONDS), and how
    long ``start`` waits for their processes once their resources are placed;
    ``placement_group_timeout_s``: how long ``start`` waits for the workers' resources;
    ``nics``: the network interfaces the workers use (the first one). ``ssh_*``: accepted for
    Horovod compatibility; Ray starts the workers, so no ssh is needed."""
    timeout_s: float = 30
    ssh_identity_file: str = None
    ssh_str: str = None
    placement_group_timeout_s: float = 100
    nics: object = None
    verbose: int = 1


class _Worker(object):
    """One rank: a Ray actor (made remote in ``RayExecutor.start``)."""

    def __init__(self):
        self._executable = None

    def where(self):
        import ray
        return ray.util.get_node_ip_address(), socket.gethostname(), os.getpid()

    def setup(self, env, executable_cls, args, kwargs):
        os.environ.update(env)
        if executable_cls is not None:
            self._executable = executable_cls(*(args or ()), **(kwargs or {}))
        return True

    def _scoped(self, run_id, call):
        # Each run meets under a rendezvous scope of its own: a run that failed on some ranks
        # leaves no state that the next run could trip over.
        os.environ["HOROVOD_GLOO_SCOPE"] = "ray/run%d" % run_id
        return outcome(call)

    def run(self, run_id, fn, args, kwargs):
        return self._scoped(run_id, lambda: fn(*(args or ()), **(kwargs or {})))

    def execute(self, run_id, fn):
        return self._scoped(run_id, lambda: fn(self._executable))


def _layout(places):
    """Ranks for workers at ``places`` ([node ip per worker]): each node's workers consecutive,
    nodes in order of first appearance. Returns [(worker index, rank, local rank, local size,
    cross rank, cross size)] by rank."""
    nodes = []
    for ip in places:
        if ip not in nodes:
            nodes.append(ip)
    order = sorted(range(len(places)), key=lambda i: (nodes.index(places[i]), i))
    out = []
    for rank, worker in enumerate(order):
        ip = places[worker]
        local = [w for w in order if places[w] == ip]
        local_rank = local.index(worker)
        same_local = [w for w in order
                      if [v for v in order if places[v] == places[w]].index(w) == local_rank]
        out.append((worker, rank, local_rank, len(local), same_local.index(worker),
                    len(same_local)))
    return out


class RayExecutor(object):
    """Runs functions on ``num_workers`` horovod_cpp ranks, each a Ray actor (see the module's
    documentation). ``num_hosts`` x ``num_workers_per_host`` instead places the workers evenly,
    one bundle of ``num_workers_per_host`` workers per node (placement strategy STRICT_SPREAD).
    """

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None):
        return Settings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                        ssh_str=ssh_str, placement_group_timeout_s=placement_group_timeout_s,
                        nics=nics)

    def __init__(self, settings, num_workers=None, num_hosts=None, num_workers_per_host=1,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None,
                 use_current_placement_group=True, min_workers=None, max_workers=None,
                 reset_limit=None, cooldown_range=None, elastic_timeout=600,
                 override_discovery=True):
        self._elastic = None
        if min_workers is not None or max_workers is not None:
            # Elastic mode (Horovod's): the workers are the cluster's slots, between
            # min_workers and max_workers; run() as ElasticRayExecutor's.
            if num_workers or num_hosts:
                raise ValueError("num_workers/num_hosts and min_workers/max_workers are "
                                 "exclusive (elastic mode sizes the job from the cluster)")
            settings = settings or Settings()
            self._elastic = ElasticRayExecutor(
                ElasticRayExecutor.create_settings(
                    min_np=min_workers or 1, max_np=max_workers, reset_limit=reset_limit,
                    cooldown_range=cooldown_range, elastic_timeout=elastic_timeout,
                    timeout_s=settings.timeout_s, nics=settings.nics,
                    verbose=getattr(settings, "verbose", 1)),
                use_gpu=use_gpu, cpus_per_slot=cpus_per_worker, gpus_per_slot=gpus_per_worker)
            self.settings = settings
            self.workers = []
            return
        if not (num_workers or num_hosts):
            raise ValueError("one of num_workers and num_hosts must be set")
        if num_workers and num_hosts:
            raise ValueError("only one of num_workers and num_hosts may be set")
        check_positive_ints(num_workers=num_workers, num_hosts=num_hosts,
                            num_workers_per_host=num_workers_per_host)
        if cpus_per_worker is None or cpus_per_worker <= 0:
            raise ValueError("cpus_per_worker must be positive, got %r" % (cpus_per_worker,))
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False")
        self.settings = settings or Settings()
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = num_workers or num_hosts * num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers = []  # in rank order once started
        self.ranks = {}    # worker index -> rank
        self._where = []   # (node ip, hostname, pid) per rank
        self._pg = None
        self._server = None
        self._runs = 0

    # ---- start and stop ------------------------------------------------------------------

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Starts the workers (all at once, or a clear error) and sets up their ranks. In
        elastic mode: connects to the cluster (the workers start with each run)."""
        if self._elastic is not None:
            if executable_cls is not None:
                raise NotImplementedError("RayExecutor: executable_cls in elastic mode "
                                          "(min_workers/max_workers), as in Horovod")
            self._elastic.env_vars.update({k: str(v) for k, v in
                                           (extra_env_vars or {}).items()})
            return self._elastic.start()
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.workers:
            raise RuntimeError("RayExecutor.start: already started (shutdown() first)")
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
        self._check_resources(ray.cluster_resources())
        per_bundle = self.num_workers_per_host if self.num_hosts else 1
        bundle = {"CPU": self.cpus_per_worker * per_bundle}
        if self.gpus_per_worker:
            bundle["GPU"] = self.gpus_per_worker * per_bundle
        bundles = [dict(bundle) for _ in range(self.num_hosts or self.num_workers)]
        pg = placement_group(bundles, strategy="STRICT_SPREAD" if self.num_hosts else "PACK")
        if not pg.wait(self.settings.placement_group_timeout_s):
            remove_placement_group(pg)
            raise TimeoutError(
                "RayExecutor.start: the Ray cluster did not give the %d workers their resources "
                "(%s each%s) within placement_group_timeout_s=%g s; free resources now: %s"
                % (self.num_workers, _describe(bundle, per_bundle),
                   ", %d nodes" % self.num_hosts if self.num_hosts else "",
                   self.settings.placement_group_timeout_s,
                   _describe(ray.available_resources())))
        self._pg = pg
        actor = ray.remote(_Worker)
        workers = []
        for i in range(self.num_workers):
            workers.append(actor.options(
                num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg,
                    placement_group_bundle_index=i // per_bundle)).remote())
        try:
            # Their resources are placed; each actor's process still has to start (seconds on
            # a loaded node): bounded by timeout_s, as the workers' rendezvous is.
            started = [w.where.remote() for w in workers]
            ready, _ = ray.wait(started, num_returns=len(started),
                                timeout=self.settings.timeout_s)
            if len(ready) < len(started):
                raise TimeoutError(
                    "RayExecutor.start: %d of the %d workers had their resources but their "
                    "processes did not start within timeout_s=%g s"
                    % (len(started) - len(ready), len(started), self.settings.timeout_s))
            where = ray.get(started)
            layout = _layout([ip for ip, _, _ in where])
            self.workers = [workers[worker] for worker, *_ in layout]
            self._where = [where[worker] for worker, *_ in layout]
            secret, address = new_secret(), facing_address([ip for ip, _, _ in where])
            self._server = RendezvousServer(secret, bind=address)
            env = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
                   "HOROVOD_SIZE": str(self.num_workers),
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
                   "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self._server.port),
                   "HOROVOD_GLOO_SECRET": secret,
                   "HOROVOD_GLOO_TIMEOUT_SECONDS": str(self.settings.timeout_s)}
            nics = self.settings.nics
            if nics:
                env["HOROVOD_GLOO_IFACE"] = nics if isinstance(nics, str) else sorted(nics)[0]
            env.update({k: str(v) for k, v in (extra_env_vars or {}).items()})
            calls = []
            for (worker, rank, local_rank, local_size, cross_rank, cross_size), w in zip(
                    layout, self.workers):
                rank_env = dict(env, HOROVOD_RANK=str(rank), HOROVOD_LOCAL_RANK=str(local_rank),
                                HOROVOD_LOCAL_SIZE=str(local_size),
                                HOROVOD_CROSS_RANK=str(cross_rank),
                                HOROVOD_CROSS_SIZE=str(cross_size),
                                HOROVOD_HOSTNAME=where[worker][0])
                calls.append(w.setup.remote(rank_env, executable_cls, executable_args,
                                            executable_kwargs))
            self._get(calls)
        except BaseException:
            self.shutdown()
            raise

    def _check_resources(self, total):
        need_cpu = self.cpus_per_worker * self.num_workers
        have_cpu = total.get("CPU", 0)
        if have_cpu < need_cpu:
            raise ValueError("RayExecutor: %d workers x %g CPUs need %g CPUs; the Ray cluster has "
                             "%g (use fewer workers or cpus_per_worker, or add nodes)"
                             % (self.num_workers, self.cpus_per_worker, need_cpu, have_cpu))
        need_gpu = self.gpus_per_worker * self.num_workers
        if need_gpu and total.get("GPU", 0) < need_gpu:
            raise ValueError("RayExecutor: %d workers x %g GPUs need %g GPUs; the Ray cluster has "
                             "%g" % (self.num_workers, self.gpus_per_worker, need_gpu,
                                     total.get("GPU", 0)))

    def shutdown(self):
        """Stops the workers (killing any still busy) and frees their resources."""
        if self._elastic is not None:
            return  # (each elastic run stops its workers when it ends)
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:
                pass
        self.workers, self._where, self.ranks = [], [], {}
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:
                pass
            self._pg = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    # ---- running -------------------------------------------------------------------------

    def run(self, fn, args=None, kwargs=None, callbacks=None):
        """``fn(*args, **kwargs)`` on every worker; the list of their values, in rank order.
        In elastic mode: an elastic job (``ElasticRayExecutor.run``), the last round's values."""
        if self._elastic is not None:
            return self._elastic.run(fn, callbacks, args=args, kwargs=kwargs)
        return self._get(self.run_remote(fn, args, kwargs, _wrapped=True))

    def run_remote(self, fn, args=None, kwargs=None, _wrapped=False):
        """Starts ``fn(*args, **kwargs)`` on every worker; the ObjectRefs, in rank order (each
        gives ("ok", value) or ("error", (type, message, traceback, exception)))."""
        self._started()
        self._runs += 1
        return [w.run.remote(self._runs, fn, args, kwargs) for w in self.workers]

    def execute(self, fn, callbacks=None):
        """``fn(executable)`` on every worker (``executable``: its instance of start's
        ``executable_cls``, or None); the values, in rank order."""
        self._started()
        self._runs += 1
        return self._get([w.execute.remote(self._runs, fn) for w in self.workers])

    def execute_single(self, fn):
        """``fn(executable)`` on rank 0 alone; its value."""
        self._started()
        self._runs += 1
        return self._get([self.workers[0].execute.remote(self._runs, fn)])[0]

    def _started(self):
        if self._elastic is not None:
            raise NotImplementedError("RayExecutor: run_remote, execute and execute_single "
                                      "in elastic mode (min_workers/max_workers), as in "
                                      "Horovod: use run")
        if not self.workers:
            raise RuntimeError("RayExecutor: start() first")

    # After a worker's error, how long the others get to show whether one of them died (the
    # cause: a survivor's collective fails first when its peer's node goes away).
    DEATH_GRACE = 5.0

    def _get(self, refs):
        """The values of ``refs`` (one per rank, in rank order); the first failure as a clear
        error, as soon as it is known: a worker or node that died before a worker's exception
        (which is often what the death caused in the others)."""
        import time

        import ray
        import ray.exceptions

        index = {ref: i for i, ref in enumerate(refs)}
        pending, values = list(refs), {}
        first_error = None
        give_up_at = None
        while pending:
            timeout = None if give_up_at is None else max(0.0, give_up_at - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:
                break  # the grace is over: the worker's exception it is
            ref = done[0]
            rank = index[ref]
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                ip, host, pid = self._where[rank] if rank < len(self._where) else ("?", "?", 0)
                text = "rank %d (process %d on node %s, %s) died: %s" % (
                    rank, pid, host, ip, str(e).strip().splitlines()[0])
                if first_error is not None:
                    text += "\n(then %s)" % str(first_error).splitlines()[0]
                raise HorovodRunnerError(text) from None
            if isinstance(outcome, tuple) and len(outcome) == 2 and outcome[0] in ("ok", "error"):
                if outcome[0] == "error":
                    exc_type, message, text, exc = outcome[1]
                    if first_error is None:
                        first_error = RankError(rank, exc_type, message, text)
                        first_error.__cause__ = exc
                        give_up_at = time.monotonic() + self.DEATH_GRACE
                    continue
                outcome = outcome[1]
            values[rank] = outcome
        if first_error is not None:
            raise first_error
        return [values[i] for i in range(len(refs))]


def _describe(resources, times=1):
    return ", ".join("%s %g" % (k, v / times) for k, v in sorted(resources.items())
                     if k in ("CPU", "GPU") or not k.startswith("node:"))


from horovod_cpp.ray.elastic import ElasticRayExecutor, ElasticSettings  # noqa: E402

__all__ = ["ElasticRayExecutor", "ElasticSettings", "RayExecutor", "Settings"]
