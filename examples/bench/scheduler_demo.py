"""The goodput scheduler (horovod_cpp.ray.scheduler) against a static baseline on one Ray
cluster, with the same job arrivals: small adaptive jobs (examples/scheduling/jobs.py) arrive by
a Poisson process; under the scheduler each may use 1..--max-np ranks and is grown and shrunk in
process; under the baseline (the scheduler's ``fcfs`` policy) each runs at its requested size
(--max-np ranks, its batch fixed at B0) from start to end, in arrival order. Prints each job's
completion time (JCT: end - arrival) under both, the average JCT ratio, whether any node ever
had more workers up (their processes running) than slots, and failures; --kill-host CMD runs CMD (e.g. ``testbed.sh kill
hvd-h3``) --kill-at seconds into each run and --restore-host CMD after the run (the baseline
then runs on the whole cluster again). --plot draws the slots each job held over time under
both (AdaptDL's cluster-trace figure). Run on the test bed by bench.sh (FIGURE SCHED1) and, with
3 jobs, by tests/multihost/run.sh.

    python examples/bench/scheduler_demo.py --address RAY_ADDRESS [--jobs 12] \\
        [--mean-interarrival 50] [--plot trace.png] [--json out.json]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scheduling"))
import jobs  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"))
    p.add_argument("--jobs", type=int, default=12)
    p.add_argument("--mean-interarrival", type=float, default=50.0, help="seconds")
    p.add_argument("--progress", type=float, nargs=2, default=(1500.0, 12000.0),
                   help="each job's target progress (steps at B0), log-uniform in [lo, hi]")
    p.add_argument("--max-np", type=int, default=2,
                   help="the ranks each job asks for (the baseline's fixed size)")
    p.add_argument("--sample-delay", type=float, default=5e-4,
                   help="seconds of emulated compute per sample (jobs.py)")
    p.add_argument("--interval", type=float, default=60.0, help="the scheduler's re-plan time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill-host", help="a command that kills a host, run --kill-at s into a run")
    p.add_argument("--kill-at", type=float, default=120.0)
    p.add_argument("--restore-host", help="a command that brings the host back after a run")
    p.add_argument("--timeout", type=float, default=3600.0, help="per run")
    p.add_argument("--only", choices=["goodput", "fcfs"], help="run one policy only")
    p.add_argument("--plot")
    p.add_argument("--json")
    p.add_argument("--verbose", type=int, default=0,
                   help="the scheduler's and its jobs' logs (in the Ray session's worker logs)")
    return p.parse_args(argv)


def arrivals(args):
    rng = random.Random(args.seed)
    t, out = 0.0, []
    lo, hi = args.progress
    for i in range(args.jobs):
        target = lo * (hi / lo) ** rng.random()
        out.append((t, "job%02d" % i, round(target)))
        t += rng.expovariate(1.0 / args.mean_interarrival)
    return out


def run_policy(args, policy, plan):
    from horovod_cpp.ray.scheduler import Scheduler, SchedulerError
    sched = Scheduler(args.address, name="demo-%s" % policy, policy=policy,
                      interval=args.interval, drain_seconds=60, timeout_s=30,
                      elastic_timeout=300, verbose=args.verbose)
    t0 = time.time()
    ids = {}
    killer = None
    if args.kill_host:
        killer = threading.Timer(args.kill_at, lambda: subprocess.run(
            args.kill_host, shell=True, timeout=120))
        killer.start()
    try:
        for at, name, target in plan:
            delay = t0 + at - time.time()
            if delay > 0:
                time.sleep(delay)
            fixed = policy == "fcfs"
            ids[name] = sched.submit(
                jobs.train_job, kwargs=dict(target=target, seed=int(name[3:]), fixed=fixed,
                                            sample_delay=args.sample_delay),
                min_np=args.max_np if fixed else 1, max_np=args.max_np if fixed else None,
                name=name)
        results = {}
        for name, job in ids.items():
            left = max(1.0, t0 + args.timeout - time.time())
            try:
                results[name] = sched.wait(job, timeout=left)[0]
            except (SchedulerError, TimeoutError) as e:
                results[name] = {"error": str(e)}
        status = {s["name"]: s for s in sched.status()}
        cluster = sched.cluster()
    finally:
        if killer is not None:
            killer.cancel()
        sched.shutdown()
    over = 0
    for _, live in cluster["trace"]:
        for node, slots in cluster["nodes"].items():
            over += sum(c.get(node, 0) for c in live.values()) > slots
    jct = {n: status[n]["ended"] - status[n]["submitted"] for n in status
           if status[n]["state"] == "SUCCEEDED"}
    failed = [n for n in status if status[n]["state"] != "SUCCEEDED"]
    return {"policy": policy, "t0": t0, "jct": jct, "failed": failed, "over_allocated": over,
            "results": results, "sizes": {n: status[n]["sizes"] for n in status},
            "restarts": {n: status[n]["restarts"] for n in status},
            "plan_seconds": [p[2] for p in cluster["plans"]],
            "restart_cost": cluster["restart_cost"], "settle_seconds": cluster["settle_seconds"]}


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3 * len(runs)), sharex=True)
    axes = axes if len(runs) > 1 else [axes]
    for ax, run in zip(axes, runs):
        names = sorted(run["sizes"])
        horizon = max(t for s in run["sizes"].values() for t, _ in s) - run["t0"]
        grid = [i * horizon / 400 for i in range(401)]
        stacks = []
        for n in names:
            series = sorted((t - run["t0"], k) for t, k in run["sizes"][n])
            row, j, cur = [], 0, 0
            for g in grid:
                while j < len(series) and series[j][0] <= g:
                    cur = series[j][1]
                    j += 1
                row.append(cur)
            stacks.append(row)
        ax.stackplot(grid, stacks, labels=names, step="post")
        ax.set_ylabel("slots (%s)" % run["policy"])
    axes[-1].set_xlabel("seconds")
    axes[0].legend(fontsize=6, ncol=6, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    args = parse_args(argv)
    if os.environ.get("HVD_RAY_TOKEN_FILE"):  # (the test bed's cluster; read before Ray's
        with open(os.environ["HVD_RAY_TOKEN_FILE"]) as f:  # import, which reads them)
            os.environ["RAY_AUTH_TOKEN"] = f.read().strip()
        os.environ["RAY_AUTH_MODE"] = "token"
    import ray
    import ray.cloudpickle
    ray.cloudpickle.register_pickle_by_value(jobs)  # (the workers need not import it)
    ray.init(address=args.address, namespace="horovod_cpp", logging_level="ERROR",
             log_to_driver=False)
    plan = arrivals(args)
    runs = []
    for policy in ("goodput", "fcfs"):
        if args.only and policy != args.only:
            continue
        run = run_policy(args, policy, plan)
        runs.append(run)
        mean = sum(run["jct"].values()) / max(1, len(run["jct"]))
        print("%s: average JCT %.1f s over %d jobs; failed %s; over-allocated samples %d; "
              "restart cost %.2f s; policy %.3f s a round at most" % (
                  policy, mean, len(run["jct"]), run["failed"] or "none",
                  run["over_allocated"], run["restart_cost"],
                  max(run["plan_seconds"] or [0])), flush=True)
        for name in sorted(run["jct"]):
            r = run["results"].get(name, {})
            print("  %s  JCT %7.1f s  sizes %s  restarts %d  lost steps %s" % (
                name, run["jct"][name], r.get("sizes"), run["restarts"][name],
                r.get("lost_steps")), flush=True)
        if args.restore_host:
            subprocess.run(args.restore_host, shell=True, timeout=300)
            time.sleep(5)
    ok = all(not r["failed"] and r["over_allocated"] == 0 for r in runs)
    if len(runs) == 2:
        means = [sum(r["jct"].values()) / max(1, len(r["jct"])) for r in runs]
        print("SCHED: average JCT goodput/fcfs = %.3f (%.1f s / %.1f s), %d jobs" % (
            means[0] / means[1], means[0], means[1], args.jobs), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, default=str)
    if args.plot:
        plot(runs, args.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
