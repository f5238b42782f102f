"""hvdrun: start a horovod_cpp job with mpirun (or, with --gloo, without it).

    hvdrun -np 4 python train.py
    hvdrun --gloo -np 4 -H server1:2,server2:2 python train.py
    hvdrun -np 8 -H server1:4,server2:4 --fusion-threshold-mb 32 python train.py
    hvdrun -np 2 --verbose --timeline-filename /tmp/t.json ./train --epochs 5
    hvdrun --check-build
"""
import argparse
import ctypes.util
import importlib.util
import os
import shlex
import sys

from horovod_cpp._build import __version__, import_core
from horovod_cpp.job import mpirun
from horovod_cpp.job.hosts import HostError, parse_hostfile, parse_hosts

EXIT_USAGE = 2
EXIT_NO_MPIRUN = 127
EXIT_UNREACHABLE = 3


def _parser():
    p = argparse.ArgumentParser(
        prog="hvdrun", allow_abbrev=False,
        description="Run a horovod_cpp training command on several ranks with mpirun (or, "
                    "with --gloo or the elastic options, with hvdrun's own launcher). Output "
                    "lines are prefixed with [rank]<stdout>: or [rank]<stderr>: ([host:slot] "
                    "in elastic jobs), and hvdrun exits with the job's exit code.",
        epilog="Without -H/--hostfile the ranks run on this machine (more ranks than cores "
               "oversubscribe automatically). Where a host runs several ranks and "
               "OMP_NUM_THREADS is not set, each rank gets OMP_NUM_THREADS = this machine's "
               "CPUs / its ranks (1 when ranks run on other hosts; torchrun sets 1), and "
               "hvdrun says so. Options after the command belong to the command.")
    p.add_argument("-np", "--num-proc", dest="np", type=int, metavar="N",
                   help="number of ranks (required to run a command)")
    p.add_argument("--version", action="version",
                   version="hvdrun (horovod_cpp) %s" % __version__,
                   help="print the version and exit")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="print what this horovod_cpp was built with (frameworks, controllers, "
                        "tensor operations) and exit")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. server1:4,server2:4 (no :SLOTS = 1)")
    where.add_argument("-hostfile", "--hostfile", dest="hostfile", metavar="FILE",
                       help="file of 'host slots=N' lines")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than the slots of -H/--hostfile")
    hosts = p.add_argument_group("several hosts")
    hosts.add_argument("--network-interface", "--network-interfaces", dest="network_interface",
                       metavar="IF[,IF]",
                       help="the network interfaces ranks talk over between hosts (sets Open "
                            "MPI's btl_tcp_if_include and oob_tcp_if_include, and "
                            "NCCL_SOCKET_IFNAME)")
    hosts.add_argument("-p", "--ssh-port", type=int, metavar="PORT",
                       help="ssh port of the hosts (default: ssh's own, usually 22)")
    hosts.add_argument("-i", "--ssh-identity-file", metavar="FILE",
                       help="ssh private key for the hosts")
    hosts.add_argument("--start-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="every host of -H/--hostfile other than this one must answer ssh "
                            "within this long before the job starts; the ones that do not are "
                            "named (default 30)")
    hosts.add_argument("--output-filename", metavar="DIR",
                       help="also write each rank's output to its own file under DIR "
                            "(Open MPI's layout: DIR/1/rank.N/stdout and stderr)")
    hosts.add_argument("--prefix-output-with-timestamp", action="store_true",
                       help="prefix every output line with the time it was written")
    for knob in mpirun.knobs():
        flags = (knob.flag,) + knob.aliases
        dest = knob.dest
        if knob.parse is None:
            p.add_argument(*flags, dest=dest, action="store_true", help=knob.help)
        elif knob.kind == "level":
            p.add_argument(*flags, dest=dest, type=str.lower, choices=mpirun.LOG_LEVELS,
                           help=knob.help)
        else:
            p.add_argument(*flags, dest=dest, type=_typed(knob), help=knob.help,
                           metavar="VALUE")
    backend = p.add_argument_group("backend").add_mutually_exclusive_group()
    backend.add_argument("--gloo", action="store_true",
                         help="run on the Gloo backend: hvdrun starts the ranks itself (over "
                              "ssh on other hosts) and serves their rendezvous; no mpirun")
    backend.add_argument("--mpi", action="store_true",
                         help="run on the MPI backend with mpirun (the default)")
    p.add_argument("--cpu-operations", choices=("mpi", "gloo", "ccl"), type=str.lower,
                   help="what reduces CPU tensors: the controller's own backend (mpi under "
                        "mpirun, gloo with --gloo; the default) or ccl, Intel's oneCCL, beside "
                        "either (sets HOROVOD_CPU_OPERATIONS; see docs/ccl.md)")
    el = p.add_argument_group(
        "elastic training (Gloo; the script uses hvd.elastic)",
        "Any of --min-np, --max-np or --host-discovery-script makes the job elastic: ranks that "
        "fail are dropped and the job re-forms on the rest; hosts that appear are added.")
    el.add_argument("--min-np", type=int, metavar="N",
                    help="fewest ranks the job runs on (default: -np)")
    el.add_argument("--max-np", type=int, metavar="N",
                    help="most ranks the job grows to (default: -np)")
    el.add_argument("--host-discovery-script", metavar="SCRIPT",
                    help="prints the usable hosts, one 'host' or 'host:slots' a line; run "
                         "every second (default: the hosts of -H, fixed)")
    el.add_argument("--slots-per-host", "--slots", type=int, default=1, metavar="N",
                    help="slots of a discovered host printed without ':slots' (default 1)")
    el.add_argument("--elastic-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="how long the job waits for --min-np ranks (and for a round's members "
                         "to join it) before it fails (default 600; on fixed hosts, without "
                         "--host-discovery-script, it fails at once: no host can come)")
    el.add_argument("--reset-limit", type=int, metavar="N",
                    help="most resets (re-formed rounds) before the job fails (default: none)")
    el.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                    help="a failed host may return after a time drawn from MIN..MAX seconds "
                         "(default: never)")
    p.add_argument("--mpi-args", default="", metavar="'ARGS'",
                   help="extra arguments for mpirun, as one quoted string")
    p.add_argument("--verbose", action="store_true",
                   help="print the exact mpirun command before running it")
    p.add_argument("--dry-run", action="store_true",
                   help="print the mpirun command and exit without running it")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def _typed(knob):
    def parse(text):
        try:
            return knob.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e))
    parse.__name__ = knob.flag.lstrip("-")
    return parse


def check_build():
    """What this installation was built with, in the shape of ``horovodrun --check-build``."""
    def box(on):
        return "[X]" if on else "[ ]"
    try:
        _core = import_core()
        nccl, gloo, ccl = _core.nccl_built(), _core.gloo_built(), _core.ccl_built()
        core = "horovod_cpp._core"
    except ImportError as e:
        nccl, gloo, ccl, core = 0, False, False, "horovod_cpp._core does not import (%s)" % e
    torch = importlib.util.find_spec("torch") is not None
    libtorch_api = ctypes.util.find_library("horovod_cpp_torch") is not None
    nccl_text = "NCCL %d.%d.%d" % (nccl // 10000, nccl // 100 % 100, nccl % 100) if nccl else "NCCL"
    return "\n".join([
        "horovod_cpp v%s (%s):" % (__version__, core),
        "",
        "Available Frameworks:",
        "    [ ] TensorFlow",
        "    %s PyTorch (horovod_cpp.torch)" % box(torch),
        "    %s LibTorch C++ API (libhorovod_cpp_torch%s)"
        % (box(libtorch_api), "" if libtorch_api else ": not on the library path; built by "
           "CMake with -DHVD_WITH_TORCH"),
        "    [ ] MXNet",
        "",
        "Available Controllers:",
        "    [X] MPI",
        "    %s Gloo" % box(gloo),
        "",
        "Available Tensor Operations:",
        "    %s %s" % (box(nccl), nccl_text),
        "    [ ] DDL",
        "    %s CCL (oneCCL, HOROVOD_CPU_OPERATIONS=ccl)" % box(ccl),
        "    [X] MPI",
        "    %s Gloo" % box(gloo),
    ])


def job_settings(args, cpu_count=None):
    """(command, hosts, env, oversubscribe) for parsed ``args``: the user's command, the hosts
    ([(name, slots)] or None), the HOROVOD_* variables the flags set; raises ValueError for
    inconsistent arguments."""
    if args.np is None:
        raise ValueError("-np is required: the number of ranks to run")
    if args.np <= 0:
        raise ValueError("-np must be a positive number of ranks, got %d" % args.np)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("no command to run (e.g. hvdrun -np 2 python train.py)")
    hosts = None
    if args.hosts is not None:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile is not None:
        hosts = parse_hostfile(args.hostfile)
    if hosts is not None:
        slots = sum(s for _, s in hosts)
        if args.np > slots and not args.oversubscribe:
            raise ValueError("-np %d is more than the %d slots of the given hosts (%s); add "
                             "slots, or pass --oversubscribe" % (args.np, slots,
                                                                 ",".join(h for h, _ in hosts)))
        oversubscribe = args.oversubscribe
    else:
        cores = cpu_count or os.cpu_count() or 1
        oversubscribe = args.oversubscribe or args.np > cores
    env = {}
    for knob in mpirun.knobs():
        value = getattr(args, knob.dest)
        if value is not None and value is not False:
            env[knob.env] = knob.to_env(value)
    cpu_ops = getattr(args, "cpu_operations", None)
    if cpu_ops == "ccl":
        env["HOROVOD_CPU_OPERATIONS"] = "ccl"
    elif cpu_ops is not None and cpu_ops != ("gloo" if getattr(args, "gloo", False) else "mpi"):
        raise ValueError("--cpu-operations %s needs %s: MPI and Gloo each run both the "
                         "negotiation and the CPU collectives (ccl runs beside either)"
                         % (cpu_ops, "--gloo" if cpu_ops == "gloo" else "mpirun (no --gloo)"))
    threads = default_threads(args, hosts, cpu_count)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads[0])
    if args.start_timeout <= 0:
        raise ValueError("--start-timeout must be positive, got %s" % args.start_timeout)
    return command, hosts, env, oversubscribe


def default_threads(args, hosts, cpu_count=None, environ=None):
    """(OMP_NUM_THREADS for every rank, why) when some host runs several ranks and ``environ``
    (default os.environ) sets no OMP_NUM_THREADS; None otherwise. Each rank's torch would start
    a thread per core, so N ranks on a host would run N times as many threads as it has cores:
    measured with PyPI's torch at 2 ranks on 2 cores, its idle OpenMP threads spinning slowed a
    training step over Gloo from 36 to 86 ms. A job on this machine alone gets its CPUs divided
    among its ranks; one with ranks elsewhere gets 1 (their core counts are not known here),
    as torchrun gives with several processes per node."""
    environ = os.environ if environ is None else environ
    if "OMP_NUM_THREADS" in environ:
        return None
    if getattr(args, "host_discovery_script", None) is not None:
        per_host, here = getattr(args, "slots_per_host", 1) or 1, False
    elif hosts is None:
        per_host, here = args.np, True
    else:
        from horovod_cpp.runner.gloo_run import assign  # the order both launchers fill slots
        names = [name for _, name, *_ in assign(hosts, args.np)]
        per_host = max(names.count(name) for name in set(names))
        here = all(mpirun.is_this_host(name) for name in set(names))
    if per_host <= 1:
        return None
    if not here:
        return 1, "up to %d ranks share a host" % per_host
    cpus = cpu_count or len(os.sched_getaffinity(0)) or 1
    return max(1, cpus // per_host), "%d ranks share this machine's %d CPUs" % (per_host, cpus)


def say_threads(args, hosts):
    """Tells the user the OMP_NUM_THREADS hvdrun chose (default_threads), when it chose one."""
    threads = default_threads(args, hosts)
    if threads is not None and not args.dry_run:
        print("hvdrun: each rank runs with OMP_NUM_THREADS=%d (%s); set OMP_NUM_THREADS to "
              "choose" % threads, file=sys.stderr, flush=True)


def make_command(args, mpirun_path="mpirun", cpu_count=None):
    """(mpirun argv, hosts) for parsed ``args``; raises ValueError for inconsistent arguments."""
    command, hosts, env, oversubscribe = job_settings(args, cpu_count)
    # Options for several hosts come before the user's own --mpi-args.
    host_args = []
    if args.prefix_output_with_timestamp:
        host_args += ["--timestamp-output"]
    if args.output_filename:
        host_args += ["--output-filename", os.path.abspath(args.output_filename)]
    ssh_args = mpirun.ssh_options(args.ssh_port, args.ssh_identity_file)
    rsh_agent = None
    if hosts and "plm_rsh_agent" not in args.mpi_args and not all(
            mpirun.is_this_host(h) for h, _ in hosts):
        # ssh with the remote orted under a guard that ends it, and its ranks, when the session
        # ends (runner/ssh_agent.py: a host whose link went down keeps nothing of the job).
        rsh_agent = " ".join([sys.executable, "-m", "horovod_cpp.runner.ssh_agent"] +
                             ssh_args + ["--"])
    elif ssh_args:
        host_args += ["-mca", "plm_rsh_args", " ".join(ssh_args)]
    if args.network_interface:
        env["NCCL_SOCKET_IFNAME"] = args.network_interface
        host_args += ["-mca", "btl_tcp_if_include", args.network_interface,
                      "-mca", "oob_tcp_if_include", args.network_interface]
    # The environment reaches every rank on every host (what the flags set wins).
    passthrough = [n for n in mpirun.forwarded_env() if n not in env]
    try:
        mpi_args = host_args + shlex.split(args.mpi_args)
    except ValueError as e:
        raise ValueError("--mpi-args: %s" % e)
    argv = mpirun.build_command(args.np, command, hosts=hosts, env=env, passthrough=passthrough,
                                mpi_args=mpi_args, oversubscribe=oversubscribe,
                                rsh_agent=rsh_agent, mpirun=mpirun_path)
    return argv, hosts


def unreachable_error(args, hosts):
    """Why the job cannot start: the hosts of ``hosts`` (make_command's) other than this one
    that do not answer ssh within ``args.start_timeout``, each with ssh's reason; None when
    all do."""
    if not hosts:
        return None
    unreachable = mpirun.unreachable_hosts(
        [h for h, _ in hosts], args.start_timeout,
        mpirun.ssh_options(args.ssh_port, args.ssh_identity_file))
    if not unreachable:
        return None
    return "%d host(s) did not answer ssh within --start-timeout %g s:\n  %s" % (
        len(unreachable), args.start_timeout, "\n  ".join("%s: %s" % hw for hw in unreachable))


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.check_build:
        print(check_build())
        return 0
    elastic = (args.min_np is not None or args.max_np is not None
               or args.host_discovery_script is not None)
    if elastic:
        return _run_elastic(args)
    if args.gloo:
        return _run_gloo(args)
    try:
        command, hosts = make_command(args)
    except (ValueError, HostError) as e:
        print("hvdrun: error: %s (see hvdrun --help)" % e, file=sys.stderr)
        return EXIT_USAGE
    try:
        command[0] = mpirun.find_mpirun()
    except mpirun.MpirunNotFound as e:
        if not args.dry_run:
            print("hvdrun: %s" % e, file=sys.stderr)
            return EXIT_NO_MPIRUN
    if args.verbose or args.dry_run:
        print("hvdrun: %s" % mpirun.quote(command), file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    unreachable = unreachable_error(args, hosts)
    if unreachable:
        print("hvdrun: error: %s" % unreachable, file=sys.stderr)
        return EXIT_UNREACHABLE
    say_threads(args, hosts)

    def on_line(rank, stream, text):
        out = sys.stdout if stream == "stdout" else sys.stderr
        if rank is None:
            out.write(text + "\n")
        else:
            out.write("[%d]<%s>:%s\n" % (rank, stream, text))
        out.flush()

    launch = mpirun.Launch(command, on_line)
    mpirun.forward_signals(launch)
    result = launch.wait()
    code = result.returncode
    if code < 0:  # mpirun itself was killed by a signal
        code = 128 - code
    if code != 0:
        print("hvdrun: %s" % result.describe().split("\n", 1)[0], file=sys.stderr)
    return code


def _run_elastic(args):
    from horovod_cpp.job import elastic_driver
    try:
        if args.mpi:
            raise ValueError("elastic jobs run on Gloo; drop --mpi")
        if args.np is None and args.min_np is None:
            raise ValueError("an elastic job needs -np or --min-np")
        if args.host_discovery_script is not None and (args.hosts or args.hostfile):
            raise ValueError("give the hosts by -H/--hostfile or by --host-discovery-script, "
                             "not both")
        for name in ("np", "min_np", "max_np"):
            value = getattr(args, name)
            if value is not None and value <= 0:
                raise ValueError("--%s must be positive, got %d" % (name.replace("_", "-"),
                                                                   value))
        min_np = args.min_np or args.np
        max_np = args.max_np or max(args.np or 0, min_np)
        if not min_np <= (args.np or min_np) <= max_np:
            raise ValueError("need --min-np <= -np <= --max-np, got %s <= %s <= %s"
                             % (min_np, args.np, max_np))
        if args.blacklist_cooldown_range and not (
                0 <= args.blacklist_cooldown_range[0] <= args.blacklist_cooldown_range[1]):
            raise ValueError("--blacklist-cooldown-range MIN MAX needs 0 <= MIN <= MAX")
        if args.np is None:
            args.np = min_np
        command, hosts, env, _ = job_settings(args)
    except (ValueError, HostError) as e:
        print("hvdrun: error: %s (see hvdrun --help)" % e, file=sys.stderr)
        return EXIT_USAGE
    say_threads(args, hosts)
    return elastic_driver.run(args, command, hosts, env)


def _run_gloo(args):
    from horovod_cpp.runner import gloo_run
    try:
        command, hosts, env, _ = job_settings(args)
        if args.mpi_args:
            raise ValueError("--mpi-args is for mpirun; a --gloo job has none")
        if args.output_filename or args.prefix_output_with_timestamp:
            raise ValueError("--output-filename and --prefix-output-with-timestamp are mpirun's; "
                             "not available with --gloo yet")
    except (ValueError, HostError) as e:
        print("hvdrun: error: %s (see hvdrun --help)" % e, file=sys.stderr)
        return EXIT_USAGE
    if not args.dry_run:
        unreachable = unreachable_error(args, hosts)
        if unreachable:
            print("hvdrun: error: %s" % unreachable, file=sys.stderr)
            return EXIT_UNREACHABLE
    say_threads(args, hosts)
    return gloo_run.run(args, command, hosts, env)


if __name__ == "__main__":
    sys.exit(main())
