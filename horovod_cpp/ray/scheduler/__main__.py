"""The goodput scheduler's command line: ``python -m horovod_cpp.ray.scheduler {start,submit,
status,cancel,wait,stop}`` (docs/scheduling.md)."""
import argparse
import json
import sys

from horovod_cpp.ray.scheduler import NAME, SUCCEEDED, Scheduler, SchedulerError


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m horovod_cpp.ray.scheduler",
        description="The goodput scheduler of horovod_cpp jobs on a Ray cluster "
                    "(docs/scheduling.md).")
    parser.add_argument("--address", help="the Ray cluster (default: RAY_ADDRESS)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="start the scheduler actor (detached)")
    p.add_argument("--interval", type=float, default=60.0,
                   help="seconds between plans (also made on arrivals, ends and node changes)")
    p.add_argument("--cpus-per-slot", type=float, default=1)
    p.add_argument("--restart-cost", type=float, default=None,
                   help="seconds a resize costs (default: measured, the time changes take "
                        "to come into effect)")
    p.add_argument("--drain-seconds", type=float, default=30.0,
                   help="how long a shrinking job has to reach a commit")
    p.add_argument("--policy", choices=["goodput", "fcfs"], default="goodput",
                   help="goodput (Pollux's objective) or fcfs (each job at its max-np, in "
                        "submission order: the static baseline)")
    p = sub.add_parser("submit", help="submit a script as an elastic job")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    p.add_argument("--min-np", type=int, default=1)
    p.add_argument("--max-np", type=int, default=None)
    p.add_argument("--name")
    p = sub.add_parser("status", help="one job's status, or every job's")
    p.add_argument("job", nargs="?")
    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job")
    p = sub.add_parser("wait", help="wait for a job to end")
    p.add_argument("job")
    p.add_argument("--timeout", type=float, default=None)
    sub.add_parser("stop", help="cancel every job and end the scheduler")
    args = parser.parse_args(argv)
    if args.command == "start":
        Scheduler(args.address, interval=args.interval, cpus_per_slot=args.cpus_per_slot,
                  restart_cost=args.restart_cost, drain_seconds=args.drain_seconds,
                  policy=args.policy)
        print("scheduler %s running" % NAME)
        return 0
    try:
        sched = Scheduler(args.address, create=False)
    except SchedulerError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        if args.command == "submit":
            print(sched.submit(script=args.script, script_args=args.script_args,
                               min_np=args.min_np, max_np=args.max_np, name=args.name))
        elif args.command == "status":
            print(json.dumps(sched.status(args.job), indent=1, default=str))
        elif args.command == "cancel":
            print(sched.cancel(args.job))
        elif args.command == "wait":
            sched.wait(args.job, args.timeout)
            print(SUCCEEDED)
        elif args.command == "stop":
            sched.shutdown()
            print("stopped")
    except (KeyError, SchedulerError, TimeoutError) as e:
        print("error: %s" % (e.args[0] if isinstance(e, KeyError) else e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
