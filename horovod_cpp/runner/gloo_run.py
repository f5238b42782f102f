"""hvdrun --gloo: start the ranks of a Gloo job directly (no mpirun).

Ranks on this host are child processes; ranks on other hosts run over ssh through
``python -m horovod_cpp.job.task_exec`` (same interpreter path and working directory there),
which takes the job's secret and environment on stdin and stops the rank when ssh goes away.
The launcher serves the rendezvous store (job/rendezvous.py) the ranks meet through, on the
address of this host that faces the others (loopback when every rank is local).

Ranks fill the hosts in order, as ``mpirun --map-by slot`` does. Output lines are tagged
``[rank]<stdout>:``. When a rank fails, the others get ``grace`` seconds to end on their own (a
Gloo peer sees the closed connections at once) and are then stopped; the job's exit code is
the first failed rank's.
"""
import shlex
import signal
import sys
import time

from horovod_cpp.job import mpirun, proc
from horovod_cpp.job.remote import (facing_address, is_local, read_output, remote_argv,
                                     spawn, stop_process)
from horovod_cpp.job.rendezvous import RendezvousServer, new_secret


def assign(hosts, np):
    """[(rank, host, local_rank, local_size, cross_rank, cross_size)] filling ``hosts``
    ([(name, slots)]) in order; more ranks than slots go round the hosts again."""
    names = []
    while len(names) < np:
        before = len(names)
        for name, slots in hosts:
            names += [name] * min(slots, np - len(names))
        if len(names) == before:
            raise ValueError("no slots to place %d ranks on" % np)
    names = sorted(names[:np], key=[h for h, _ in hosts].index)  # each host's ranks together
    out = []
    for rank, name in enumerate(names):
        local_rank = names[:rank].count(name)
        same_local = [r for r in range(np) if names[:r].count(names[r]) == local_rank]
        out.append((rank, name, local_rank, names.count(name), same_local.index(rank),
                    len(same_local)))
    return out


class GlooJob(object):
    """One run of ``command`` on the ranks of ``hosts``. ``on_line(rank, stream, text)``
    receives output (rank None: the launcher's own lines)."""

    def __init__(self, command, np, hosts=None, env=None, on_line=None, ssh_args=(),
                 network_interface=None, grace=10.0, ssh="ssh"):
        self.command = list(command)
        self.hosts = hosts or [("localhost", np)]
        self.placement = assign(self.hosts, np)
        self.env = dict(env or {})
        user_on_line = on_line or (lambda rank, stream, text: None)
        self.shut_down_by = None  # (rank, host) of the rank that shut the job down, if one did

        def on_line_(rank, stream, text):
            if self.shut_down_by is None and rank is not None:
                self.shut_down_by = mpirun.shut_down_by(text)
            user_on_line(rank, stream, text)
        self.on_line = on_line_
        self.ssh_args = list(ssh_args)
        self.network_interface = network_interface
        self.grace = grace
        self.ssh = ssh
        self.secret = new_secret()
        self.all_local = all(is_local(h) for h, _ in self.hosts)
        self.address = facing_address(self.hosts)
        self.server = None
        self.procs = {}    # rank -> Popen
        self.hosts_of = {}  # rank -> host name
        self._readers = []
        self._stopping = False

    def rank_env(self, rank, host, local_rank, local_size, cross_rank, cross_size):
        env = dict(self.env)
        env.update({
            "HOROVOD_CONTROLLER": "gloo",
            # (oneCCL's data plane, --cpu-operations ccl, runs beside the Gloo controller)
            "HOROVOD_CPU_OPERATIONS": "ccl" if self.env.get("HOROVOD_CPU_OPERATIONS") == "ccl"
                                      else "gloo",
            "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(len(self.placement)),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(cross_rank), "HOROVOD_CROSS_SIZE": str(cross_size),
            # What Gloo listens on: loopback for a job on this host only, else the host's name
            # as given (it resolves there to the address the others reach).
            "HOROVOD_HOSTNAME": "127.0.0.1" if self.all_local else host,
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.server.port),
        })
        if self.network_interface:
            env["HOROVOD_GLOO_IFACE"] = self.network_interface.split(",")[0]
        return env

    def remote_argv(self, host):
        return remote_argv(host, self.command, self.ssh_args, self.ssh)

    def describe(self):
        """The commands this job runs, one line per rank (--dry-run, --verbose)."""
        lines = []
        for rank, host, *_ in self.placement:
            where = "local" if is_local(host) else " ".join(shlex.quote(a) for a in
                                                             self.remote_argv(host))
            lines.append("rank %d on %s: %s" % (rank, host, where if not is_local(host)
                                                else mpirun.quote(self.command)))
        return lines

    def start(self):
        self.server = RendezvousServer(self.secret, bind=self.address)
        for rank, host, lr, ls, cr, cs in self.placement:
            self.hosts_of[rank] = host
            p = spawn(host, self.rank_env(rank, host, lr, ls, cr, cs), self.command, self.secret,
                      self.ssh_args, self.ssh)
            self.procs[rank] = p
            self._readers += read_output(p, rank, self.on_line)

    def stop(self):
        """Stops every rank still running (SIGTERM, then SIGKILL)."""
        self._stopping = True
        for p in self.procs.values():
            if p.stdin is not None and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        for p in self.procs.values():
            stop_process(p)

    def wait(self):
        """Waits for the job; returns (exit code, message or None)."""
        first_failure = None
        deadline = None
        interrupted = False
        try:
            while True:
                codes = {r: p.poll() for r, p in self.procs.items()}
                for r in sorted(codes):
                    c = codes[r]
                    if c not in (None, 0) and first_failure is None:
                        first_failure = (r, c)
                        deadline = time.monotonic() + self.grace
                if all(c is not None for c in codes.values()):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    self.on_line(None, "stderr",
                                 "hvdrun: stopping the ranks still running %g s after rank "
                                 "%d failed" % (self.grace, first_failure[0]))
                    break
                if self._stopping:
                    interrupted = True
                    break
                time.sleep(0.05)
        finally:
            self.stop()
            for t in self._readers:
                t.join(5)
            if self.server is not None:
                self.server.stop()
        if first_failure is None:
            return (128 + signal.SIGTERM, "stopped by a signal") if interrupted else (0, None)
        rank, code = first_failure
        host = self.hosts_of[rank]
        if not is_local(host) and code == 255:
            why = "ssh to %s failed (exit code 255)" % host
        elif not is_local(host) and code > 128:
            why = proc.describe_exit(128 - code)  # task_exec reports signal N as 128 + N
        else:
            why = proc.describe_exit(code)
        message = "rank %d (on %s) ended with %s" % (rank, host, why)
        if self.shut_down_by is not None and self.shut_down_by[0] != rank:
            message += "; rank %d (on %s) shut the job down" % self.shut_down_by
        return (128 - code if code < 0 else code, message)


def run(args, command, hosts, env):
    """hvdrun's --gloo path: the exit code of the job."""
    def on_line(rank, stream, text):
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(text + "\n" if rank is None else "[%d]<%s>:%s\n" % (rank, stream, text))
        out.flush()

    job = GlooJob(command, args.np, hosts=hosts, env=env, on_line=on_line,
                  ssh_args=mpirun.ssh_options(args.ssh_port, args.ssh_identity_file),
                  network_interface=args.network_interface)
    if args.verbose or args.dry_run:
        for line in job.describe():
            print("hvdrun: %s" % line, file=sys.stderr, flush=True)
    if args.dry_run:
        return 0

    def handler(signum, frame):
        job._stopping = True
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    job.start()
    code, message = job.wait()
    if message:
        print("hvdrun: %s" % message, file=sys.stderr)
    return code
