"""``horovod_cpp.runner.run``: run a Python function on N ranks and get every rank's return
value, like ``horovod.run`` (the ``horovod.runner.run`` of Horovod 0.28).

The function and its arguments travel with cloudpickle, as with HorovodRunner: every rank
fetches them from a small authenticated service in the calling process, calls
``func(*args, **kwargs)`` and sends its return value back. The ranks are started with the
mpirun command hvdrun would build for the same options (hosts over ssh, the environment
forwarded, --start-timeout checked first).
"""
import functools
import os
import socket
import sys

from horovod_cpp.job import mpirun
from horovod_cpp.runner import launch

# horovod.run's parameters that horovod_cpp does not have yet (elastic: issue 18; Gloo).
_NOT_YET = ("min_np", "max_np", "slots", "reset_limit", "use_gloo", "disable_cache")


def run(func, args=(), kwargs=None, np=1, hosts=None, hostfile=None, start_timeout=None,
        ssh_port=None, ssh_identity_file=None, output_filename=None, verbose=None,
        use_mpi=None, mpi_args=None, network_interface=None, executable=None, **others):
    """Runs ``func(*args, **kwargs)`` on ``np`` ranks; returns the list of their return
    values, in rank order.

    hosts: "host1:2,host2:2" (or hostfile, one "host slots=N" per line); none: this machine.
    start_timeout: seconds every remote host has to answer ssh (default 30). ssh_port,
    ssh_identity_file, network_interface ("eth0[,eth1]"), output_filename (a directory),
    mpi_args (a string) and verbose are hvdrun's options of the same names; executable is the
    ranks' Python (default this one). A rank's exception is raised here as
    ``horovod_cpp.job.service.RankError`` (also ``horovod_cpp.spark.RankError``) with that
    rank's traceback; a job that fails otherwise raises ``HorovodRunnerError`` (same module)
    saying how mpirun ended."""
    from horovod_cpp.job import network
    from horovod_cpp.job.service import HorovodRunnerError, JobService, pickle_main

    unknown = sorted(set(others) - set(_NOT_YET))
    if unknown:
        raise TypeError("run() got unexpected keyword arguments: %s" % ", ".join(unknown))
    given = sorted(k for k, v in others.items() if v not in (None, False))
    if given:
        raise NotImplementedError("horovod_cpp.runner.run does not support %s yet"
                                  % ", ".join(given))
    if use_mpi is False:
        raise NotImplementedError("horovod_cpp.runner.run runs over MPI only (use_mpi=False)")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError("np must be a positive int, got %r" % (np,))
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
    # The job's address and key reach every rank from mpirun's environment, never argv.
    passed = "-x HVD_SPARK_JOB -x HVD_SPARK_KEY -x HVD_SPARK_ALL_RESULTS"
    argv += ["--mpi-args", passed + (" " + mpi_args if mpi_args else "")]
    argv += [executable or sys.executable, "-m", "horovod_cpp.job.rank_main"]
    options = launch._parser().parse_args(argv)
    command, host_list = launch.make_command(options)
    command[0] = mpirun.find_mpirun()
    if verbose:
        print("horovod_cpp.runner.run: %s" % mpirun.quote(command), file=sys.stderr, flush=True)
    unreachable = launch.unreachable_error(options, host_list)
    if unreachable:
        raise HorovodRunnerError(unreachable)
    remote = [h for h, _ in host_list or [] if not mpirun.is_this_host(h)]

    payload = pickle_main(functools.partial(func, *args), dict(kwargs or {}),
                          caller="horovod_cpp.runner.run")
    key = network.new_key()
    job = JobService(key, payload, stream=True, ranks=np)
    try:
        # Remote ranks reach this process at the address its host name resolves to.
        address = socket.gethostbyname(socket.gethostname()) if remote else "127.0.0.1"
        env = dict(os.environ, HVD_SPARK_JOB="%s:%d" % (address, job.port),
                   HVD_SPARK_KEY=key.hex(), HVD_SPARK_ALL_RESULTS="1")
        job.launch(command, env)
        return job.outcome()
    finally:
        job.stop()
