"""horovod_cpp's scheduling policy (horovod_cpp/adaptive/policy.py) in Pollux's own simulator
(petuum/adaptdl, branch osdi21-artifact, simulator/), in place of its genetic algorithm.

The simulator is not part of this repository: scripts/setup_pollux_sim.sh fetches it at the
commit docs/scheduling.md names and makes the venv it runs in. Then, for the 8 workloads:

    .venv-pollux/bin/python examples/scheduling/pollux_sim_adapter.py \\
        --simulator .pollux-sim/simulator --restart-seconds 30 --output out-30s
    .venv-pollux/bin/python examples/scheduling/pollux_sim_adapter.py \\
        --simulator .pollux-sim/simulator --restart-seconds 0.5 --output out-0.5s

``--restart-seconds`` is both what a reallocation costs the job in the simulation (its
``rescale_time``; the simulator's own is 30 s) and the cost the policy weighs a restart with.
``--events`` re-plans when a job arrives or ends as well as every 60 s, as horovod_cpp's
scheduler does (the default is Pollux's cadence, every 60 s only). ``--compare-ga N`` also
runs Pollux's genetic algorithm on every Nth round's inputs and prints both allocations'
values under Pollux's own objective (``pollux.Problem._evaluate``), and that of the policy
run on exactly that objective (``charge_start``: a queued job's start charged, at 30 s).
``--workloads DIR`` (default: the simulator's ``workloads``), ``--only NAME`` runs one.

The adapter gives the policy, for each job, the speedup the genetic algorithm optimises: the
job's goodput at (hosts, replicas) over its goodput at a fair share of the cluster, from the
simulator's own goodput functions (Pollux's Problem rebases them the same way). Without the
simulator on the path (the unit test) ``PolicyAdapter`` still runs: it needs only objects with
the simulator's JobInfo and NodeInfo attributes.
"""
import argparse
import copy
import glob
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from horovod_cpp.adaptive.policy import JobInfo, Policy  # noqa: E402

GPU = "nvidia.com/gpu"
INTERVAL = 60  # seconds between rounds, as in Pollux's evaluation


class RebasedSpeedup(object):
    """speedup(hosts, replicas) of one simulator job: its goodput over the goodput at a fair
    share (``fair_hosts`` hosts, ``fair_replicas`` replicas), memoised; ``prefill`` evaluates
    many pairs in one vectorised call of the simulator's goodput function."""

    def __init__(self, speedup_fn, fair_hosts, fair_replicas):
        self._fn = getattr(speedup_fn, "_goodput_fn", None)
        self._fair_replicas = fair_replicas
        self._cache = {}
        if self._fn is not None:
            self._kwargs = dict(max_batch_size=speedup_fn._max_batch_size,
                                atomic_bsz_range=speedup_fn._atomic_bsz_range,
                                accumulation=speedup_fn._accumulation)
            base = self._goodput([fair_hosts], [fair_replicas])[0]
            if not base > 0:  # (a fair share too small to run the job: one replica's)
                base = self._goodput([1], [1])[0]
            self._base = base

    def _goodput(self, hosts, replicas):
        import numpy as np
        goodput, _, _ = self._fn.optimize(np.array(hosts), np.array(replicas), **self._kwargs)
        return [float(g) for g in np.atleast_1d(goodput)]

    def prefill(self, pairs):
        todo = [p for p in pairs if p not in self._cache and p[1] > 0]
        if not todo or self._fn is None:
            return
        values = self._goodput([h for h, _ in todo], [r for _, r in todo])
        for pair, g in zip(todo, values):
            self._cache[pair] = g / self._base

    def __call__(self, hosts, replicas):
        if replicas <= 0:
            return 0.0
        if self._fn is None:  # no profile yet: linear, as the simulator's placeholder
            return replicas / float(self._fair_replicas)
        key = (int(hosts), int(replicas))
        if key not in self._cache:
            self.prefill([key])
        return self._cache[key]


class PolicyAdapter(object):
    """The simulator's policy interface, ``optimize(jobs, nodes, prev_allocations,
    node_template) -> (allocations, desired_nodes)``, over horovod_cpp's policy."""

    def __init__(self, restart_seconds=30.0, compare_ga=0, log=None):
        self.policy = Policy(p=-1.0, restart_cost=restart_seconds)
        self.compare_ga = int(compare_ga)
        self.rounds = 0
        self.seconds = []       # the policy's time per round
        self.comparisons = []   # (ours, the genetic algorithm's) under Pollux's objective
        self.log = log

    def inputs(self, jobs, nodes, prev_allocations):
        """(JobInfo per job, free slots per host, current allocation) for the policy."""
        slots = {k: n.resources.get(GPU, 0) for k, n in nodes.items()}
        total = sum(slots.values())
        fair_replicas = max(1, math.ceil(total / max(1, len(jobs))))
        fair_hosts = max(1, math.ceil(len(nodes) / float(total))) if total else 1
        widest = max(slots.values()) if slots else 1
        infos = {}
        for key, job in jobs.items():
            speedup = RebasedSpeedup(job.speedup_fn, fair_hosts, fair_replicas)
            top = min(job.max_replicas, widest * min(16, len(slots)))
            speedup.prefill([(-(-r // widest), r) for r in range(1, top + 1)])
            infos[key] = JobInfo(speedup, min_replicas=job.min_replicas,
                                 max_replicas=job.max_replicas,
                                 submitted=job.creation_timestamp,
                                 attained_service=job.attained_service,
                                 restarts=getattr(job, "num_restarts", 0) or 0,
                                 age=getattr(job, "age", 0.0) or 0.0)
        current = {k: list(v) for k, v in prev_allocations.items() if k in jobs}
        return infos, slots, current

    def optimize(self, jobs, nodes, prev_allocations, node_template=None):
        start = time.perf_counter()
        infos, slots, current = self.inputs(jobs, nodes, prev_allocations)
        allocation = self.policy.optimize(infos, slots, current)
        self.seconds.append(time.perf_counter() - start)
        self.rounds += 1
        if self.compare_ga and self.rounds % self.compare_ga == 0 and jobs:
            self._compare(jobs, nodes, prev_allocations, allocation,
                          (infos, slots, current))
        return {k: v for k, v in allocation.items() if v}, len(nodes)

    def _compare(self, jobs, nodes, prev_allocations, ours, inputs):
        """Pollux's genetic algorithm on the same inputs; both allocations valued by Pollux's
        own objective (its Problem, with its restart cost of 30 s). ``inputs``: the policy's, as
        optimize made them."""
        import pollux
        ga = pollux.PolluxPolicy()
        start = time.perf_counter()
        theirs, _ = ga.optimize(copy.deepcopy(jobs), copy.deepcopy(nodes),
                                copy.deepcopy(prev_allocations), None)
        ga_seconds = time.perf_counter() - start
        # The search alone, on the GA's exact objective: the policy charging a queued job's
        # start as Pollux does (charge_start), at the GA's 30 s.
        start = time.perf_counter()
        exact = Policy(p=-1.0, restart_cost=30.0, charge_start=True).optimize(*inputs)
        exact_seconds = time.perf_counter() - start
        value_ours = pollux_value(jobs, nodes, prev_allocations, ours)
        value_ga = pollux_value(jobs, nodes, prev_allocations, theirs)
        value_exact = pollux_value(jobs, nodes, prev_allocations,
                                   {k: v for k, v in exact.items() if v})
        self.comparisons.append((value_ours, value_ga, ga_seconds, value_exact, exact_seconds))
        if self.log:
            self.log("GA comparison round %d: %d jobs, ours %.6f, genetic algorithm %.6f "
                     "(%.1f s), ours on its objective %.6f (%.2f s)"
                     % (self.rounds, len(jobs), value_ours, value_ga, ga_seconds, value_exact,
                        exact_seconds))


def pollux_value(jobs, nodes, prev_allocations, allocation):
    """The power mean Pollux's genetic algorithm maximises, for one allocation."""
    import collections
    import pollux
    jobs = collections.OrderedDict(sorted(copy.deepcopy(jobs).items()))
    nodes = collections.OrderedDict(sorted(nodes.items()))
    helper = pollux.PolluxPolicy()
    base = helper._allocations_to_state(prev_allocations, jobs, nodes)
    state = helper._allocations_to_state(allocation, jobs, nodes)
    problem = pollux.Problem(list(jobs.values()), list(nodes.values()), base)
    out = {}
    problem._evaluate(state.reshape(1, -1), out)
    return float(-out["F"][0, 0])


def run_workload(args):
    """One workload through the simulator with the adapter: its JCTs and the adapter's
    round times and comparisons."""
    path, opts = args
    sys.path.insert(0, opts["simulator"])
    import pandas
    import simulator
    restart = opts["restart_seconds"]
    original = simulator.Job.reallocate

    def reallocate(self, placement):
        original(self, placement)
        if placement:
            self.rescale_time = restart  # the simulator's own is 30 s

    simulator.Job.reallocate = reallocate
    # The simulator refits a job's throughput model whenever it sees a new configuration;
    # --events' probes (next_event) meet each one first. The same profile gives the same fit:
    # memoised, the job's own step reuses the probe's (exact: PerfParams is immutable).
    fit, fits = simulator.fit_perf_params, {}

    def fit_perf_params(*arrays):
        key = tuple((a.dtype.str, a.shape, a.tobytes()) for a in arrays)
        if key not in fits:
            if len(fits) > 1024:
                fits.clear()
            fits[key] = fit(*arrays)
        return fits[key]

    simulator.fit_perf_params = fit_perf_params
    name = os.path.basename(path)[:-4]
    messages = []

    def log(message):
        messages.append("%s: %s" % (name, message))
        if opts.get("progress"):
            print(messages[-1], flush=True)

    adapter = PolicyAdapter(restart, opts["compare_ga"], log=log)
    # The simulator builds Pollux-style jobs for a PolluxPolicy: the adapter takes its place.
    simulator.PolluxPolicy = PolicyAdapter
    cluster = simulator.Cluster(pandas.read_csv(path), adapter, 16, num_gpus=4)
    next_plan = INTERVAL
    while not cluster.all_complete():
        # Each step ends with a round of the policy: every INTERVAL seconds (Pollux), and
        # with --events also at the next arrival or completion (horovod_cpp's scheduler).
        until = next_event(cluster, next_plan) if opts.get("events") else next_plan
        cluster.step(until - cluster.current_time)
        next_plan = cluster.current_time + INTERVAL
        if opts.get("progress") and adapter.rounds % 100 == 0:
            done = sum(job.completion_time is not None for job in cluster.jobs)
            print("%s: %d s simulated, %d of %d jobs done, policy %.3f s a round" % (
                name, cluster.current_time, done, len(cluster.jobs),
                statistics.mean(adapter.seconds) if adapter.seconds else 0.0), flush=True)
    jcts = cluster.get_jcts()
    return name, jcts, adapter.seconds, adapter.comparisons, messages


def next_event(cluster, until):
    """The simulated time of the first arrival or completion before ``until`` (else
    ``until``). A completion is found by stepping a copy of each running job (the simulator
    is deterministic); the step ends a second after it, past the simulator's rounding."""
    now = cluster.current_time
    for job in cluster.jobs:
        if job.submission_time > now:
            until = min(until, job.submission_time)
        elif job.completion_time is None and job.placement:
            probe = copy.copy(job)
            probe.profile = dict(job.profile)  # (the one container a step changes in place)
            probe.step(until - now)
            if probe.completion_time is not None:
                until = min(until, probe.completion_time + 1)
    return max(until, now + 1)


def percentile(values, q):
    values = sorted(values)
    if not values:
        return None
    index = min(len(values) - 1, max(0, int(math.ceil(q / 100.0 * len(values))) - 1))
    return values[index]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--simulator", required=True, help="the simulator/ directory of "
                   "petuum/adaptdl's osdi21-artifact branch")
    p.add_argument("--workloads", help="a directory of workload CSVs (default: the "
                   "simulator's workloads/)")
    p.add_argument("--only", help="one workload by name (workload-6)")
    p.add_argument("--restart-seconds", type=float, default=30.0)
    p.add_argument("--compare-ga", type=int, default=0, metavar="N",
                   help="every Nth round, also run Pollux's genetic algorithm on its inputs")
    p.add_argument("--events", action="store_true",
                   help="also re-plan when a job arrives or ends, as horovod_cpp's scheduler "
                   "does (default: every 60 s only, as Pollux)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--progress", action="store_true", help="a line every 100 rounds")
    p.add_argument("--output", help="a directory for summary.json")
    args = p.parse_args()
    folder = args.workloads or os.path.join(args.simulator, "workloads")
    paths = sorted(glob.glob(os.path.join(folder, "*.csv")))
    if args.only:
        paths = [x for x in paths if os.path.basename(x)[:-4] == args.only]
    if not paths:
        sys.exit("no workloads in %s" % folder)
    simulator_dir = os.path.abspath(args.simulator)
    paths = [os.path.abspath(x) for x in paths]
    output = os.path.abspath(args.output) if args.output else None
    sys.path.insert(0, simulator_dir)
    os.chdir(simulator_dir)  # (the simulator reads its traces relative to itself)
    opts = {"simulator": simulator_dir,
            "restart_seconds": args.restart_seconds, "compare_ga": args.compare_ga,
            "progress": args.progress, "events": args.events}
    work = [(x, opts) for x in paths]
    if args.processes > 1 and len(work) > 1:
        import multiprocessing
        with multiprocessing.Pool(min(args.processes, len(work))) as pool:
            results = pool.map(run_workload, work)
    else:
        results = [run_workload(w) for w in work]
    summary = {"jcts": {}, "avgs": {}, "p99": {}, "policy_seconds": {}, "ga_comparison": {}}
    for name, jcts, seconds, comparisons, messages in sorted(results):
        if not args.progress:
            for m in messages:
                print(m)
        summary["jcts"][name] = jcts
        summary["avgs"][name] = sum(jcts.values()) / len(jcts)
        summary["p99"][name] = percentile(list(jcts.values()), 99)
        summary["policy_seconds"][name] = {"mean": statistics.mean(seconds),
                                           "max": max(seconds), "rounds": len(seconds)}
        if comparisons:
            summary["ga_comparison"][name] = comparisons
        print("%s: average JCT %.0f s, p99 %.0f s, policy %.3f s a round on average, "
              "%.3f s at most (%d rounds)" % (name, summary["avgs"][name],
                                               summary["p99"][name],
                                               statistics.mean(seconds), max(seconds),
                                               len(seconds)))
    summary["mean"] = sum(summary["avgs"].values()) / len(summary["avgs"])
    print("mean of the average JCTs: %.0f s (restart %.1f s)" % (summary["mean"],
                                                                  args.restart_seconds))
    if output:
        os.makedirs(output, exist_ok=True)
        with open(os.path.join(output, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
