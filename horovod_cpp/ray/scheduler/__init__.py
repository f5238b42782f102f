"""A goodput scheduler on a Ray 2.x cluster: many elastic horovod_cpp jobs share the cluster's
slots, and the scheduler grows and shrinks the running ones in process (Pollux's policy,
``horovod_cpp.adaptive.policy``, with the measured resize pause as its restart cost).

    from horovod_cpp.ray.scheduler import Scheduler

    sched = Scheduler()                          # connects to RAY_ADDRESS (or a local Ray)
    job = sched.submit(train, min_np=1, max_np=4, name="mnist")   # or script="train.py"
    sched.status(job)        # {"state": "RUNNING", "np": 2, "nodes": {...}, ...}
    sched.wait(job)          # the values of the last round's ranks, in rank order
    sched.cancel(job)

or from a shell: ``python -m horovod_cpp.ray.scheduler {start,submit,status,cancel,wait,stop}``
(``--help``).

**How it works.** The scheduler is a detached, named Ray actor (``SchedulerCore`` in it), so
that every client (Python or the CLI) talks to the same one. Each job runs as an
``ElasticRayExecutor`` run inside the actor's process, on one thread per job, whose
``allotment()`` is the job's current slots in the plan: {Ray node id: slots}. A plan is made
when a job arrives or ends, when a job's model first arrives or it has measured a larger size,
when a Ray node joins or leaves (polled every second: a lost node
is out of the plan at once and its jobs shrink and go on from their last commit), and every
``interval`` seconds (default 60). A job that is shrunk drains the removed slots' workers at its
next ``state.commit()`` (no step lost; they are stopped after ``drain_seconds`` otherwise); one
that grows starts workers on its new slots and takes them in at a commit once they are up
(``horovod_cpp.job.elastic_driver``). A job that gets no slots waits in the queue.

The jobs' adaptive training (``horovod_cpp.torch.adaptive``) sends its goodput hints from rank
0, through Ray, to the actor's ``report`` (``horovod_cpp.adaptive.hints``); the policy's speedup
function of a job is made from them (``HintedSpeedup``). A job that has not reported yet gets
its minimum; a job is never given more than twice the ranks it has measured. The restart cost
is the median time the last changes of a running job's slots took to come into effect (from
the plan to the round at the new size: the new workers' start, or the drain at a commit),
during which a change brings the job nothing; before any, the median resize pause the jobs
report (``restart_cost`` fixes it instead).

A running job is never preempted to zero (it has no checkpoint to resume from): when the
cluster shrinks below the running jobs' minimums, the policy keeps the running ones first and
a job left short waits up to ``elastic_timeout`` for slots, as any elastic job does.
"""
import math
import os
import statistics
import sys
import threading
import time
import traceback
import uuid

from horovod_cpp.adaptive.hints import HintedSpeedup, replica_cap
from horovod_cpp.adaptive.policy import JobInfo, Policy
from horovod_cpp.ray.common import node_slots

NAME = "horovod_cpp_scheduler"
NAMESPACE = "horovod_cpp"
NODE_POLL = 1.0
DEFAULT_RESTART_COST = 2.0  # seconds, until a job has measured one
SETTLE_WINDOW = 20  # the restart cost: the median of the last this many changes' times
SETTLE_LIMIT = 60.0  # seconds a job in the middle of a change is kept out of new plans

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
DONE = (SUCCEEDED, FAILED, CANCELLED)


def run_script(path, source, argv):
    """A script job's body on a worker: ``source`` run as ``__main__`` with ``sys.argv``."""
    old_argv = sys.argv
    sys.argv = [path] + list(argv)
    try:
        code = compile(source, path, "exec")
        scope = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
        exec(code, scope)
        return scope.get("result")
    finally:
        sys.argv = old_argv


class _HintSink(object):
    """Where a job's workers send their goodput hints: the scheduler actor's ``report``."""

    def __init__(self, name, namespace, job_id):
        self.name, self.namespace, self.job_id = name, namespace, job_id
        self._actor = None

    def __call__(self, hints):
        import ray
        if self._actor is None:
            self._actor = ray.get_actor(self.name, namespace=self.namespace)
        self._actor.report.remote(self.job_id, hints)

    def __getstate__(self):
        return {"name": self.name, "namespace": self.namespace, "job_id": self.job_id}

    def __setstate__(self, state):
        self.__init__(state["name"], state["namespace"], state["job_id"])


class _Job(object):
    def __init__(self, job_id, name, fn, args, kwargs, min_np, max_np, env):
        self.id, self.name = job_id, name
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.min_np, self.max_np = min_np, max_np
        self.env = env
        self.state = QUEUED
        self.submitted = time.time()
        self.started = self.ended = None
        self.allocation = []  # a node id per replica (the plan's)
        self.restarts = 0
        self.attained = 0.0  # slot-seconds
        self.hints = None
        self.value = self.error = None
        self.executor = None
        self.thread = None
        self.sizes = []  # (time, np) whenever the plan changed the job's size
        self.settling = None  # (since when, np, round then): a change not in effect yet

    @property
    def driver(self):
        """The elastic driver of the job's run (None before it starts)."""
        return self.executor.driver if self.executor is not None else None

    def status(self):
        hints = self.hints or {}
        # (the ranks the job last reported training at; before any report, its round's)
        driver = self.driver
        ranks = 0
        if self.state == RUNNING:
            ranks = hints.get("ranks", len(driver.members) if driver is not None else 0)
        return {"id": self.id, "name": self.name, "state": self.state, "np": len(self.allocation),
                "ranks": ranks, "nodes": _count(self.allocation), "min_np": self.min_np, "max_np": self.max_np,
                "submitted": self.submitted, "started": self.started, "ended": self.ended,
                "restarts": self.restarts, "attained_service": self.attained,
                "batch_size": hints.get("batch_size"), "progress": hints.get("progress"),
                "error": self.error, "sizes": list(self.sizes)}


class SchedulerCore(object):
    """The scheduler itself (the actor's state; see the module's documentation). Runs in a Ray
    driver or actor process; ``start()`` begins the planning thread."""

    def __init__(self, interval=60.0, cpus_per_slot=1, restart_cost=None, p=-1.0,
                 drain_seconds=30.0, elastic_timeout=600.0, timeout_s=30.0, time_limit=0.5,
                 name=NAME, namespace=NAMESPACE, verbose=1, policy="goodput"):
        if not interval > 0:
            raise ValueError("interval must be positive, got %r" % (interval,))
        if policy not in ("goodput", "fcfs"):
            raise ValueError("policy must be 'goodput' or 'fcfs', got %r" % (policy,))
        self.policy = policy
        if not cpus_per_slot > 0:
            raise ValueError("cpus_per_slot must be positive, got %r" % (cpus_per_slot,))
        self.interval = float(interval)
        self.cpus_per_slot = cpus_per_slot
        self.fixed_restart_cost = restart_cost
        self.p = p
        self.drain_seconds = float(drain_seconds)
        self.elastic_timeout = float(elastic_timeout)
        self.timeout_s = float(timeout_s)
        self.time_limit = float(time_limit)
        self.name, self.namespace = name, namespace
        self.verbose = verbose
        self.jobs = {}  # id -> _Job, in submission order
        self.nodes = {}  # node id -> slots (live)
        self.excluded = {}  # node id -> monotonic time until which it gets no new slots
        self.lock = threading.RLock()
        self.wake = threading.Event()
        self.stopping = False
        self.plans = []  # (time, {job id: {node: slots}}, seconds the policy took)
        self.trace = []  # (time, {job id: {node: workers up}}) on each change (sampled 1/s)
        self.settle_seconds = []  # how long the last changes took to come into effect
        self.thread = None

    # ---- the client's calls ---------------------------------------------------------------

    def submit(self, fn, args=None, kwargs=None, min_np=1, max_np=None, name=None, env=None):
        if not callable(fn):
            raise TypeError("submit: fn must be callable, got %r" % (fn,))
        min_np = int(min_np)
        if min_np < 1:
            raise ValueError("min_np must be at least 1, got %d" % min_np)
        if max_np is not None and int(max_np) < min_np:
            raise ValueError("need min_np <= max_np, got %d > %d" % (min_np, int(max_np)))
        job_id = uuid.uuid4().hex[:8]
        job = _Job(job_id, name or job_id, fn, tuple(args or ()), dict(kwargs or {}), min_np,
                   int(max_np) if max_np is not None else None,
                   {k: str(v) for k, v in (env or {}).items()})
        with self.lock:
            self.jobs[job_id] = job
        self._log("job %s (%s) submitted: %d..%s ranks" % (job_id, job.name, min_np,
                                                           max_np or "any"))
        self.wake.set()
        return job_id

    def status(self, job_id=None):
        with self.lock:
            if job_id is None:
                return [j.status() for j in self.jobs.values()]
            return self._job(job_id).status()

    def cancel(self, job_id):
        with self.lock:
            job = self._job(job_id)
            if job.state in DONE:
                return job.state
            if job.state == QUEUED:
                self._finish(job, CANCELLED)
            else:
                job.state = CANCELLED
                driver = job.driver
                if driver is not None:
                    driver.cancel("job %s was cancelled" % job_id)
        self.wake.set()
        return CANCELLED

    def result(self, job_id):
        """(state, value or error text)."""
        with self.lock:
            job = self._job(job_id)
            return job.state, (job.value if job.state == SUCCEEDED else job.error)

    def report(self, job_id, hints):
        with self.lock:
            job = self.jobs.get(job_id)
            if job is not None and job.state == RUNNING:
                old, job.hints = job.hints or {}, hints
                # A plan at once when what the policy may do with the job changed: its model
                # became available, or it measured a larger size (its cap doubles).
                if _has_model(old) != _has_model(hints) or \
                        old.get("max_profiled_replicas") != hints.get("max_profiled_replicas"):
                    self._log("job %s (%s): model %s, measured up to %s ranks" % (
                        job.id, job.name, "in" if _has_model(hints) else "not yet in",
                        hints.get("max_profiled_replicas")))
                    self.wake.set()

    def cluster(self):
        with self.lock:
            return {"nodes": dict(self.nodes), "plans": list(self.plans),
                    "trace": list(self.trace), "restart_cost": self.restart_cost(),
                    "settle_seconds": list(self.settle_seconds)}

    def _job(self, job_id):
        if job_id not in self.jobs:
            raise KeyError("no job %r (jobs: %s)" % (job_id, ", ".join(self.jobs) or "none"))
        return self.jobs[job_id]

    # ---- the loop -------------------------------------------------------------------------

    def start(self):
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="horovod_cpp-scheduler",
                                           daemon=True)
            self.thread.start()

    def shutdown(self):
        with self.lock:
            self.stopping = True
            for job in self.jobs.values():
                if job.state in (QUEUED, RUNNING):
                    self.cancel(job.id)
        self.wake.set()
        for job in list(self.jobs.values()):
            if job.thread is not None:
                job.thread.join(timeout=60)

    def _log(self, text):
        if self.verbose:
            print("horovod_cpp.ray scheduler: %s %s" % (time.strftime("%H:%M:%S"), text),
                  flush=True)

    def _loop(self):
        last_plan = -math.inf
        last_tick = time.monotonic()
        while not self.stopping:
            woken = self.wake.wait(NODE_POLL)
            self.wake.clear()
            now = time.monotonic()
            try:
                with self.lock:
                    changed = self._poll_nodes(now)
                    ended = self._reap()
                    self._account(now - last_tick)
                    last_tick = now
                    if woken or changed or ended or now - last_plan >= self.interval:
                        self._plan()
                        last_plan = time.monotonic()
                    self._start_queued()
                    self._record()
            except Exception:  # the loop must go on: a bad plan is logged, not fatal
                self._log("planning failed:\n%s" % traceback.format_exc())

    def _poll_nodes(self, now):
        import ray
        nodes = {}
        for node in ray.nodes():
            slots = node_slots(node, self.cpus_per_slot)
            if slots > 0:
                nodes[node["NodeID"]] = slots
        # A node where one of our workers died is out until its cooldown passes (Ray's health
        # checks take a while to declare a killed node dead). (Not one where a job's function
        # raised: that job's driver keeps its own blacklist, the other jobs may use the node.)
        for job in self.jobs.values():
            driver = job.driver
            job_nodes = getattr(job.executor, "node_of_host", None)
            if driver is None or job_nodes is None:
                continue
            for host, until in list(driver.lost.items()):
                node = job_nodes(host)
                if node is not None and until > now:
                    self.excluded[node] = max(self.excluded.get(node, 0), until)
        self.excluded = {n: t for n, t in self.excluded.items() if t > now and n in nodes}
        for n in self.excluded:
            nodes.pop(n, None)
        changed = nodes != self.nodes
        if changed:
            gone = [n[:12] for n in self.nodes if n not in nodes]
            new = [n[:12] for n in nodes if n not in self.nodes]
            self._log("nodes: %d slots on %d nodes%s%s" % (
                sum(nodes.values()), len(nodes), "; gone: " + ", ".join(gone) if gone else "",
                "; new: " + ", ".join(new) if new else ""))
        self.nodes = nodes
        return changed

    def _reap(self):
        ended = False
        for job in self.jobs.values():
            if job.state in (RUNNING, CANCELLED) and job.thread is not None and \
                    not job.thread.is_alive() and job.ended is None:
                ended = True
                state = CANCELLED if job.state == CANCELLED else (
                    SUCCEEDED if job.error is None else FAILED)
                self._finish(job, state)
        return ended

    def _finish(self, job, state):
        job.state = state
        job.ended = time.time()
        job.allocation = []
        job.sizes.append((job.ended, 0))
        self._log("job %s (%s) %s%s" % (job.id, job.name, state.lower(),
                                       ": " + job.error.splitlines()[0] if job.error else ""))

    def _account(self, dt):
        for job in self.jobs.values():
            if job.state == RUNNING:
                job.attained += dt * len(job.allocation)

    def restart_cost(self):
        if self.fixed_restart_cost is not None:
            return float(self.fixed_restart_cost)
        if self.settle_seconds:
            return statistics.median(self.settle_seconds[-SETTLE_WINDOW:])
        pauses = [p for j in self.jobs.values() for p in (j.hints or {}).get("resize_pauses", ())
                  if p is not None and p >= 0]
        return statistics.median(pauses) if pauses else DEFAULT_RESTART_COST

    def _plan(self):
        active = [j for j in self.jobs.values() if j.state in (QUEUED, RUNNING)]
        if not active:
            return
        if self.policy == "fcfs":
            return self._plan_fcfs(active)
        total = sum(self.nodes.values())
        widest = max(self.nodes.values()) if self.nodes else 1
        fair_replicas = max(1, total // len(active))
        fair_hosts = -(-fair_replicas // widest)
        now = time.time()
        infos = {}
        for j in active:
            cap = max(j.min_np, replica_cap(j.hints, min(j.max_np or total, max(total, 1))))
            low = j.min_np
            if self._resizing(j):  # (not changed again until its last change is in effect)
                low = cap = len(j.allocation)
            infos[j.id] = JobInfo(HintedSpeedup(j.hints, fair_hosts, fair_replicas),
                                  min_replicas=low, max_replicas=cap,
                                  submitted=j.submitted, attained_service=j.attained,
                                  restarts=j.restarts, age=now - j.submitted,
                                  # (one that lost every slot with its nodes has no state
                                  # left to keep: it waits as a queued job does)
                                  preemptible=j.state != RUNNING or not any(
                                      n in self.nodes for n in j.allocation))
        current = {j.id: list(j.allocation) for j in active if j.allocation}
        policy = Policy(p=self.p, restart_cost=self.restart_cost(), time_limit=self.time_limit,
                        horizon=self.interval)
        began = time.perf_counter()
        plan = policy.optimize(infos, dict(self.nodes), current)
        took = time.perf_counter() - began
        if self.verbose >= 2:
            for j in active:
                info = infos[j.id]
                self._log("plan: job %s: %d..%d ranks, age %.0f s, restarts %d, restart cost "
                          "%.2f s, speedup %s -> %d" % (
                              j.name, info.min_replicas, info.max_replicas, info.age,
                              info.restarts, policy.restart_cost, " ".join(
                                  "%d:%.2f" % (r, info.speedup(-(-r // widest), r))
                                  for r in range(1, info.max_replicas + 1)),
                              len(plan.get(j.id, []))))
        for j in active:
            new = sorted(plan.get(j.id, []))
            if j.state == RUNNING and not new and j.allocation:
                # (only when the cluster lost the slots: the job waits for some)
                self._log("job %s (%s) has no slots left: it waits up to %g s for some"
                          % (j.id, j.name, self.elastic_timeout))
            if new != sorted(j.allocation):
                if j.state == RUNNING:
                    j.restarts += 1
                    # (a change on top of one not in effect yet counts from the first)
                    driver = j.driver
                    since, _, before = j.settling or (
                        time.monotonic(), None, driver.round if driver is not None else -1)
                    j.settling = (since, len(new), before)
                j.sizes.append((now, len(new)))
                self._log("job %s (%s): %d -> %d slots" % (j.id, j.name, len(j.allocation),
                                                           len(new)))
            j.allocation = new
        self.plans.append((now, {j.id: _count(j.allocation) for j in active}, took))

    def _resizing(self, job):
        """Whether ``job``'s last change of slots is still coming into effect (for at most
        SETTLE_LIMIT seconds) on nodes that are all still there: the plan keeps it as it is
        (a change on top of one in progress stops workers that are still starting, or
        draining, and the test bed saw jobs moved three times in four seconds)."""
        return (job.state == RUNNING and job.settling is not None and job.allocation and
                time.monotonic() - job.settling[0] < SETTLE_LIMIT and
                all(n in self.nodes for n in job.allocation))

    def _plan_fcfs(self, active):
        """The static baseline: a job runs at its requested size (``max_np``, else
        ``min_np``) from start to end, started in submission order when that many slots are
        free (a job that does not fit holds back the ones behind it), on the fewest nodes. A
        running job that lost slots with a node takes the next free ones first (it is ahead
        of every queued job)."""
        began = time.perf_counter()
        free = dict(self.nodes)
        for j in active:
            if j.state == RUNNING:
                j.allocation = [n for n in j.allocation if n in free]  # (live nodes only)
                for n in j.allocation:
                    free[n] -= 1
        for j in active:
            need = j.max_np or j.min_np
            if j.state == RUNNING:
                short = need - len(j.allocation)
                if short <= 0:
                    continue
                if sum(max(v, 0) for v in free.values()) < short:
                    break
                j.allocation = sorted(j.allocation + self._take_fewest(free, short))
                continue
            if j.state != QUEUED:
                continue
            if sum(max(v, 0) for v in free.values()) < need:
                break
            j.allocation = sorted(self._take_fewest(free, need))
            j.sizes.append((time.time(), need))
        self.plans.append((time.time(), {j.id: _count(j.allocation) for j in active},
                           time.perf_counter() - began))

    @staticmethod
    def _take_fewest(free, need):
        """``need`` slots from ``free`` ({node: free slots}, taken from), on the fewest nodes."""
        alloc = []
        for n in sorted(free, key=lambda n: -free[n]):
            take = max(min(free[n], need - len(alloc)), 0)
            alloc += [n] * take
            free[n] -= take
            if len(alloc) == need:
                break
        return alloc

    def _start_queued(self):
        for job in self.jobs.values():
            if job.state == QUEUED and len(job.allocation) >= job.min_np:
                self._launch(job)

    def _launch(self, job):
        from horovod_cpp.ray.elastic import ElasticRayExecutor
        settings = ElasticRayExecutor.create_settings(
            min_np=job.min_np, max_np=job.max_np, elastic_timeout=self.elastic_timeout,
            timeout_s=self.timeout_s, verbose=self.verbose)
        env = dict(job.env, HOROVOD_SCHEDULER_JOB=job.id)
        executor = ElasticRayExecutor(
            settings, cpus_per_slot=self.cpus_per_slot, env_vars=env,
            allotment=lambda job=job: _count(job.allocation), drain_seconds=self.drain_seconds,
            hints=_HintSink(self.name, self.namespace, job.id))
        executor._started = True  # (this process is connected to Ray already)
        executor.log_tag = job.name
        job.executor = executor
        job.state = RUNNING
        job.started = time.time()

        def body():
            try:
                job.value = executor.run(job.fn, args=job.args, kwargs=job.kwargs)
            except BaseException as e:  # noqa: BLE001 (reported as the job's error)
                if job.state != CANCELLED:
                    job.error = "%s: %s" % (type(e).__name__, e)
            finally:
                self.wake.set()

        job.thread = threading.Thread(target=body, name="horovod_cpp-job-%s" % job.id,
                                      daemon=True)
        job.thread.start()
        self._log("job %s (%s) started on %d slots" % (job.id, job.name, len(job.allocation)))

    def _record(self):
        now = time.time()
        live = {}
        for job in self.jobs.values():
            driver = job.driver
            if driver is None or job.state != RUNNING:
                continue
            if job.settling is not None and driver.forming is None and \
                    driver.round > job.settling[2] and len(driver.members) == job.settling[1]:
                self.settle_seconds.append(time.monotonic() - job.settling[0])
                job.settling = None
            counts = {}
            # (workers whose process is up: one just spawned may wait in Ray's queue for the
            # slot that a drained worker still holds, and holds nothing yet)
            for w in driver.live_workers():
                if not driver.up(w):
                    continue
                node = job.executor.node_of_host(w.host)
                counts[node] = counts.get(node, 0) + 1
            if counts:
                live[job.id] = counts
        if not self.trace or self.trace[-1][1] != live:  # (changes only: the actor lives long)
            self.trace.append((now, live))


def _has_model(hints):
    return hints.get("perf_params") is not None and hints.get("grad_params") is not None


def _count(allocation):
    counts = {}
    for n in allocation:
        counts[n] = counts.get(n, 0) + 1
    return counts


class _Actor(SchedulerCore):
    """The Ray actor: a SchedulerCore whose methods the clients call remotely."""

    def __init__(self, options):
        super().__init__(**options)
        self.start()

    def ping(self):
        return True

    def wait(self, job_id, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state, payload = self.result(job_id)
            if state in DONE:
                return state, payload
            if deadline is not None and time.monotonic() >= deadline:
                return state, None
            time.sleep(0.2)


class SchedulerError(RuntimeError):
    pass


class Scheduler(object):
    """A client of the cluster's scheduler actor (made, detached, if there is none yet, with
    ``options``: interval, cpus_per_slot, restart_cost, p, drain_seconds, elastic_timeout,
    timeout_s, verbose: 1 logs jobs' changes, 2 also each job's speedups at every plan).
    ``address``: the Ray cluster (default RAY_ADDRESS, else a local one)."""

    def __init__(self, address=None, name=NAME, namespace=NAMESPACE, create=True, **options):
        import ray
        if not ray.is_initialized():
            ray.init(address=address or os.environ.get("RAY_ADDRESS"), namespace=namespace,
                     logging_level="ERROR", log_to_driver=bool(options.get("verbose", 1)))
        self.name, self.namespace = name, namespace
        try:
            self.actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            if not create:
                raise SchedulerError("no scheduler %r in namespace %r on this Ray cluster "
                                     "(start one: python -m horovod_cpp.ray.scheduler start)"
                                     % (name, namespace)) from None
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            options = dict(options, name=name, namespace=namespace)
            # On this client's node (a cluster's head, typically), not on a worker node whose
            # loss would take the scheduler with it.
            here = NodeAffinitySchedulingStrategy(
                node_id=ray.get_runtime_context().get_node_id(), soft=False)
            self.actor = ray.remote(_Actor).options(
                name=name, namespace=namespace, lifetime="detached", num_cpus=0,
                max_concurrency=64, get_if_exists=True, scheduling_strategy=here).remote(options)
        ray.get(self.actor.ping.remote())

    def _call(self, method, *args):
        import ray
        return ray.get(getattr(self.actor, method).remote(*args))

    def submit(self, fn=None, script=None, script_args=(), args=None, kwargs=None, min_np=1,
               max_np=None, name=None, env=None):
        """A job: ``fn(*args, **kwargs)`` on every rank, or the Python file ``script`` run as
        ``__main__`` with ``script_args``; between ``min_np`` and ``max_np`` ranks. Returns its
        id."""
        if (fn is None) == (script is None):
            raise ValueError("submit: give fn or script, not %s" % ("both" if fn else "neither"))
        if script is not None:
            with open(script) as f:
                source = f.read()
            fn, args, kwargs = run_script, (os.path.abspath(script), source,
                                            list(script_args)), None
            name = name or os.path.basename(script)
        return self._call("submit", fn, args, kwargs, min_np, max_np, name, env)

    def status(self, job=None):
        return self._call("status", job)

    def cancel(self, job):
        return self._call("cancel", job)

    def cluster(self):
        """The live nodes' slots, every plan made and the trace of live workers."""
        return self._call("cluster")

    def wait(self, job, timeout=None):
        """The job's value (its last round's values, in rank order) once it ends; raises
        SchedulerError if it failed or was cancelled, TimeoutError past ``timeout``."""
        state, payload = self._call("wait", job, timeout)
        if state == SUCCEEDED:
            return payload
        if state in DONE:
            raise SchedulerError("job %s %s%s" % (job, state.lower(),
                                                  ": %s" % payload if payload else ""))
        raise TimeoutError("job %s still %s after %g s" % (job, state.lower(), timeout))

    def shutdown(self):
        """Cancels every job and ends the scheduler actor."""
        import ray
        try:
            self._call("shutdown")
        finally:
            ray.kill(self.actor)
