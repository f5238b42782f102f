"""``horovod_cpp.runner.run``: run a Python function on N ranks and get every rank's return
value, like ``horovod.run`` (the ``horovod.runner.run`` of Horovod 0.28).

The function and its arguments travel with cloudpickle, as with HorovodRunner: every rank
fetches them from a small authenticated service in the calling process, calls
``func(*args, **kwargs)`` and sends its return value back. The ranks are started as hvdrun
would start them for the same options: with mpirun (hosts over ssh, the environment
forwarded, --start-timeout checked first), with ``use_gloo=True`` by hvdrun's Gloo launcher,
and with any of ``min_np``, ``max_np`` or ``host_discovery_script`` as an elastic Gloo job
(the function then uses ``hvd.elastic``; workers that fail are dropped and hosts that appear
are added, and the values returned are those of the last round's ranks).
"""
import functools
import os
import socket
import sys

from horovod_cpp.job import mpirun
from horovod_cpp.job.remote import facing_address, is_local
from horovod_cpp.runner import launch

# horovod.run's parameters that horovod_cpp does not have.
_NOT_YET = ("disable_cache",)


def driver_address(hosts, discovery):
    """The address the ranks reach this process at, hosts being [(host, slots)]. Remote hosts
    known: job.remote.facing_address's (the source address of the route to them; also right
    where this machine's name resolves to Debian's 127.0.1.1 or to nothing). Every rank here:
    loopback. Hosts from a discovery script, not known yet: the address this machine's name
    resolves to; where it resolves to nothing, loopback, with a warning: ranks on other hosts
    could not reach this process."""
    if any(not is_local(h) for h, _ in hosts):
        return facing_address(hosts)
    if not discovery:
        return "127.0.0.1"
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as e:
        print("horovod_cpp.runner.run: WARNING: this machine's name %r resolves to no address "
              "(%s); ranks on other hosts could not reach this process: add it to DNS or "
              "/etc/hosts. Using 127.0.0.1." % (socket.gethostname(), e), file=sys.stderr,
              flush=True)
        return "127.0.0.1"


def run(func, args=(), kwargs=None, np=1, min_np=None, max_np=None, slots=None,
        reset_limit=None, hosts=None, hostfile=None, start_timeout=None, ssh_port=None,
        ssh_identity_file=None, disable_cache=None, output_filename=None, verbose=None,
        use_gloo=None, use_mpi=None, mpi_args=None, network_interface=None, executable=None,
        host_discovery_script=None, elastic_timeout=None, **others):
    """Runs ``func(*args, **kwargs)`` on ``np`` ranks; returns the list of their return
    values, in rank order.

    hosts: "host1:2,host2:2" (or hostfile, one "host slots=N" per line); none: this machine.
    start_timeout: seconds every remote host has to answer ssh (default 30). ssh_port,
    ssh_identity_file, network_interface ("eth0[,eth1]"), output_filename (a directory),
    mpi_args (a string) and verbose are hvdrun's options of the same names; executable is the
    ranks' Python (default this one). use_gloo=True (or use_mpi=False): the Gloo backend,
    ranks started by hvdrun's own launcher, no mpirun.

    Elastic (as ``horovod.run``): min_np, max_np, host_discovery_script (a script printing
    "host:slots" lines; or hosts/hostfile for a fixed list), slots (slots per discovered host
    printed without ":slots"), reset_limit and elastic_timeout (seconds to wait for enough
    hosts) make it an elastic Gloo job; ``np`` is the number of ranks to start with. The
    function uses ``hvd.elastic.run`` and ``hvd.elastic.TorchState``; the list returned holds
    the values of the ranks of the last round.

    A rank's exception is raised here as ``horovod_cpp.job.service.RankError`` (also
    ``horovod_cpp.spark.RankError``) with that rank's traceback; a job that fails otherwise
    raises ``HorovodRunnerError`` (same module) saying how the launcher ended. In an elastic
    job a worker's exception ends only that worker (as in Horovod); it is raised here if the
    job fails."""
    from horovod_cpp.job import network
    from horovod_cpp.job.service import HorovodRunnerError, JobService, pickle_main

    unknown = sorted(set(others))
    if unknown:
        raise TypeError("run() got unexpected keyword arguments: %s" % ", ".join(unknown))
    if disable_cache:
        raise NotImplementedError("horovod_cpp.runner.run has no disable_cache: it keeps no "
                                  "cache of host checks between runs")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError("np must be a positive int, got %r" % (np,))
    if use_gloo and use_mpi:
        raise ValueError("use_gloo and use_mpi cannot both be True")
    elastic = (min_np is not None or max_np is not None or host_discovery_script is not None)
    gloo = bool(use_gloo) or use_mpi is False or elastic
    if elastic and use_mpi:
        raise ValueError("an elastic job runs on Gloo; use_mpi=True does not go with min_np, "
                         "max_np or host_discovery_script")
    if mpi_args and gloo:
        raise ValueError("mpi_args is for mpirun; a Gloo job has none")
    argv = ["-np", str(np)]
    if hosts:
        argv += ["-H", hosts]
    if hostfile:
        argv += ["--hostfile", hostfile]
    if start_timeout is not None:
        argv += ["--start-timeout", str(start_timeout)]
    if ssh_port is not None:
        argv += ["--ssh-port", str(ssh_port)]
    if ssh_identity_file:
        argv += ["--ssh-identity-file", ssh_identity_file]
    if network_interface:
        argv += ["--network-interface", network_interface]
    if output_filename:
        argv += ["--output-filename", output_filename]
    if gloo:
        argv += ["--gloo"]
    for flag, value in (("--min-np", min_np), ("--max-np", max_np),
                        ("--host-discovery-script", host_discovery_script),
                        ("--slots-per-host", slots), ("--reset-limit", reset_limit),
                        ("--elastic-timeout", elastic_timeout)):
        if value is not None:
            argv += [flag, str(value)]
    if not gloo:
        # The job's address and key reach every rank from mpirun's environment, never argv.
        passed = "-x HVD_SPARK_JOB -x HVD_SPARK_KEY -x HVD_SPARK_ALL_RESULTS"
        argv += ["--mpi-args", passed + (" " + mpi_args if mpi_args else "")]
    rank_command = [executable or sys.executable, "-m", "horovod_cpp.job.rank_main"]
    argv += rank_command
    options = launch._parser().parse_args(argv)
    if gloo:
        # hvdrun's own launchers, in a process of their own (they take over signals and
        # output); the ranks get this process's environment (HVD_SPARK_* included).
        # (They check that the hosts answer ssh, and say which do not.)
        command = [sys.executable, "-m", "horovod_cpp.runner"] + argv
        host_list = launch.job_settings(options)[1]
    else:
        command, host_list = launch.make_command(options)
        command[0] = mpirun.find_mpirun()
    if verbose:
        print("horovod_cpp.runner.run: %s" % mpirun.quote(command), file=sys.stderr, flush=True)
    if not gloo:
        unreachable = launch.unreachable_error(options, host_list)
        if unreachable:
            raise HorovodRunnerError(unreachable)

    payload = pickle_main(functools.partial(func, *args), dict(kwargs or {}),
                          caller="horovod_cpp.runner.run")
    key = network.new_key()
    job = JobService(key, payload, stream=True, ranks=None if elastic else np, elastic=elastic)
    try:
        address = driver_address(host_list or [], bool(host_discovery_script))
        env = dict(os.environ, HVD_SPARK_JOB="%s:%d" % (address, job.port),
                   HVD_SPARK_KEY=key.hex(), HVD_SPARK_ALL_RESULTS="1")
        job.launch(command, env)
        return job.outcome()
    finally:
        job.stop()
