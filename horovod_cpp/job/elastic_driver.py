"""The elastic driver: hvdrun --min-np/--max-np/--host-discovery-script (Gloo only), and
Spark's run_elastic (horovod_cpp/spark/elastic.py, through its hooks).

Workers are processes started once per slot (``host:slot`` is a worker's id) and kept across
resets; a round is one communicator over some of them (horovod_cpp/elastic/__init__.py has the
protocol in the rendezvous store). The driver forms a new round when

* a worker ends with a failure: its host is blacklisted (for a time drawn from
  --blacklist-cooldown-range, else for good) and the host's other workers are stopped;
* a host disappears from the discovery script's output: its workers are stopped; with
  ``drain_seconds`` (the Ray scheduler's shrinks: the host is fine, the job just gets fewer
  slots on it) the removed slots' workers are drained instead: the hosts version is bumped, and
  once every member has asked for a reset at its next commit the round forms without them and
  they are told to leave, so no step is lost (they are stopped if that takes longer than
  ``drain_seconds``);
* hosts (or slots) appear: new workers start; once every one of them is up (has arrived at the
  rendezvous, or ARRIVAL_LIMIT passed) the hosts version is bumped, and the round forms once
  every member of the current round has asked for a reset (at its next ``state.commit()`` /
  ``check_host_updates()``). The members train on meanwhile instead of waiting in a reset for
  the newcomers' start (Python, torch), and slots that appear one after the other while those
  start (Spark's tasks on a new executor) join in one reset, not one each;
* a member asks for a reset on its own (a collective failed without any worker ending).

A round needs at least --min-np workers: with fewer, the driver waits --elastic-timeout for hosts
to appear and then fails the job. Survivors keep their order (rank 0 stays rank 0 while it lives,
so the state is synced from a rank that has it); new workers come last. --reset-limit caps the
number of rounds after the first. The job ends when its workers end: 0 when they all succeed.
"""
import json
import random
import subprocess
import sys
import threading
import time

from horovod_cpp.job import proc, remote
from horovod_cpp.job.hosts import HostError, parse_hosts
from horovod_cpp.job.rendezvous import RendezvousServer, new_secret

DISCOVERY_INTERVAL = 1.0
SUCCESS_GRACE = 30.0  # after one worker succeeds, how long the others have to finish
ARRIVAL_LIMIT = 60.0  # at most this long (and --elastic-timeout) the members train on while
# newcomers start; then the round forms anyway and waits for them as for any member


class ElasticError(RuntimeError):
    pass


def _error_text(worker_proc):
    """': Type: message' of what a worker's function raised, where its process knows (a Ray
    worker's does: ``error`` = (type, message, traceback, exception)); '' otherwise."""
    error = getattr(worker_proc, "error", None)
    if not error:
        return ""
    message = (str(error[1]).strip().splitlines() or [""])[0]
    return ": %s: %s" % (error[0], message[:300])


def run_discovery(script, default_slots, timeout=10.0):
    """{host: slots} from the discovery script's output (lines 'host' or 'host:slots')."""
    out = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise ElasticError("--host-discovery-script %s exited with %d: %s"
                           % (script, out.returncode, out.stderr.strip()[-300:]))
    hosts = {}
    for line in out.stdout.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            (name, slots), = parse_hosts(line if ":" in line else "%s:%d" % (line, default_slots))
        except HostError as e:
            raise ElasticError("--host-discovery-script printed %r: %s" % (line, e))
        hosts[name] = slots
    return hosts


class Worker(object):
    def __init__(self, host, slot, proc, start=0):
        self.host, self.slot, self.proc = host, slot, proc
        self.id = "%s:%d" % (host, slot)
        self.start = start  # which start among the driver's workers (a slot's id repeats)
        self.rank = None  # in the latest round it belongs to
        self.ended = None  # exit status once it ended
        self.removed = False  # stopped by the driver (its host went away or was blacklisted)
        self.leaving = None  # when the driver began draining it (its slot was removed)
        self.failed = None  # why, if it exited with a failure of its own (a status, not a
        # signal; not lost with its host), or was stopped because a worker of its host did

    def live(self):
        return self.ended is None and not self.removed


class ElasticDriver(object):
    """The driver of one elastic job. For launchers other than hvdrun's ssh (Spark's
    run_elastic): ``discover()`` returns the hosts {name: slots} instead of a discovery script;
    ``spawn(host, env, command, secret)`` starts a worker (a Popen-like object, as
    remote.spawn); ``hostname(host)`` is the address its workers listen on
    (HOROVOD_HOSTNAME); ``lost(worker)`` says whether a worker that failed went down with its
    host (then it is not blacklisted: its host left, and may come back; a number instead of
    True: the host gets no new workers for that many seconds, its other workers go on);
    ``address`` is the rendezvous server's address facing the workers; ``stop(p)`` stops a
    worker that ``spawn`` started (default: remote.stop_process). A worker object without
    ``stdout`` (None) has no output to read (Ray's actors: Ray forwards it)."""

    def __init__(self, command, np, min_np, max_np, hosts=None, discovery_script=None,
                 slots_per_host=1, elastic_timeout=600.0, reset_limit=None,
                 cooldown_range=None, env=None, on_line=None, ssh_args=(), ssh="ssh",
                 log=None, discover=None, spawn=None, hostname=None, lost=None, address=None,
                 stop=None, drain_seconds=0.0):
        self.command = list(command)
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.fixed_hosts = dict(hosts) if hosts else None
        self.discovery_script = discovery_script
        self.discover_fn, self.spawn_fn = discover, spawn
        self.hostname_fn, self.lost_fn = hostname, lost
        self.stop_fn = stop or remote.stop_process
        self.drain_seconds = float(drain_seconds or 0.0)
        self.drain_since = None  # when the members were told of the slots being drained
        self.cancelled = None  # why cancel() ended the job
        self.address = address
        self.slots_per_host = slots_per_host
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.cooldown_range = cooldown_range
        self.env = dict(env or {})
        self.on_line = on_line or (lambda tag, stream, text: None)
        self.log = log or (lambda text: None)
        self.ssh_args, self.ssh = list(ssh_args), ssh
        self.secret = new_secret()
        self.server = None
        self.workers = []  # every worker ever started, in start order
        self.blacklist = {}  # host -> monotonic time it may return (inf: never)
        self.lost = {}  # host -> monotonic time until which it sits out (its worker died)
        self.failures = {}  # host -> failures seen
        self.round = -1
        self.members = []  # of the latest round, in rank order
        self.forming = None  # (round, deadline) while waiting for the members' readiness
        self.hosts_version = 0
        self.pending_add = False
        self.arriving = []  # workers started for added hosts, before the hosts version bump
        self.short_since = None  # when the live workers fell below --min-np
        self.resets = 0
        self.history = []  # (round, [worker ids], reason) for tests and the closing report
        self.lock = threading.Lock()

    # ---- hosts ---------------------------------------------------------------------------
    def discover(self):
        if self.discover_fn is not None:
            return dict(self.discover_fn())
        if self.discovery_script is None:
            return dict(self.fixed_hosts or {"localhost": self.max_np})
        return run_discovery(self.discovery_script, self.slots_per_host)

    def discovering(self):
        return self.discover_fn is not None or self.discovery_script is not None

    def usable(self, host, now):
        return self.blacklist.get(host, 0) <= now

    def blacklist_host(self, host, why, failed=False):
        self.failures[host] = self.failures.get(host, 0) + 1
        if self.cooldown_range:
            lo, hi = self.cooldown_range
            until = time.monotonic() + random.uniform(lo, hi)
            text = "for %.0f s" % (until - time.monotonic())
        else:
            until, text = float("inf"), "for the rest of the job"
        self.blacklist[host] = until
        self.log("blacklisted %s %s (%s)" % (host, text, why))
        for w in self.workers:
            if w.host == host and w.live():
                self.stop_worker(w)
                if failed:
                    w.failed = why

    # ---- workers -------------------------------------------------------------------------
    def worker_env(self, w):
        env = dict(self.env)
        env.update({
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "ccl" if self.env.get("HOROVOD_CPU_OPERATIONS") == "ccl"
                                      else "gloo",
            "HOROVOD_ELASTIC": "1", "HOROVOD_ELASTIC_WORKER_ID": w.id,
            "HOROVOD_ELASTIC_WORKER_START": str(w.start),
            "HOROVOD_ELASTIC_TIMEOUT": str(self.elastic_timeout),
            "HOROVOD_HOSTNAME": (self.hostname_fn(w.host) if self.hostname_fn is not None
                                 else "127.0.0.1" if self.address == "127.0.0.1" else w.host),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.server.port),
        })
        return env

    def start_worker(self, host, slot):
        w = Worker(host, slot, None, start=len(self.workers))
        if self.spawn_fn is not None:
            w.proc = self.spawn_fn(host, self.worker_env(w), self.command, self.secret)
        else:
            w.proc = remote.spawn(host, self.worker_env(w), self.command, self.secret,
                                    self.ssh_args, self.ssh)
        if getattr(w.proc, "stdout", None) is not None:
            remote.read_output(w.proc, w.id, self.on_line)
        self.workers.append(w)
        return w

    def cancel(self, why="cancelled"):
        """Ends the job from another thread: run() stops every worker and raises
        ElasticError(why)."""
        self.cancelled = why

    def bump_hosts_version(self, now):
        """Tells the members that hosts changed: each asks for a reset at its next commit."""
        self.hosts_version += 1
        self.server.put("elastic/hosts_version", str(self.hosts_version).encode())
        self.pending_add = True
        if any(w.leaving is not None for w in self.live_workers()):
            self.drain_since = now

    def stop_worker(self, w):
        w.removed = True
        self.stop_fn(w.proc)
        w.ended = w.proc.returncode

    def live_workers(self):
        return [w for w in self.workers if w.live()]

    def up(self, w):
        """Whether worker ``w``'s process is up (it has reached the rendezvous once)."""
        return self.server.get("elastic/arrived/%s" % w.id) == str(w.start).encode()

    def grow(self, hosts, now):
        """Starts workers on the free slots of usable hosts, up to --max-np (at start: -np)."""
        limit = self.np if self.round < 0 else self.max_np
        started = []
        for host, slots in hosts.items():
            if not self.usable(host, now):
                continue
            used = {w.slot for w in self.live_workers() if w.host == host}
            for slot in range(slots):
                if len([w for w in self.live_workers() if w.leaving is None]) >= limit:
                    return started
                if slot not in used:
                    started.append(self.start_worker(host, slot))
        return started

    # ---- rounds --------------------------------------------------------------------------
    def form_round(self, reason):
        # (Workers started for added hosts and not up yet stay out: they join the round after,
        # when they are up; a round formed to let removed slots go does not wait for them.)
        starting = self.starting()
        live = self.joinable(starting)
        leaving = [w for w in self.live_workers() if w.leaving is not None]
        if self.round >= 0:
            if self.reset_limit is not None and self.resets >= self.reset_limit:
                raise ElasticError("the job needed another reset (%s) but --reset-limit %d was "
                                   "reached" % (reason, self.reset_limit))
            self.resets += 1
        previous = [w for w in self.members if w in live]
        newcomers = [w for w in live if w not in previous]
        members = (previous + newcomers)[:self.max_np]
        self.round += 1
        k = self.round
        for rank, w in enumerate(members):
            w.rank = rank
            self.server.put("elastic/%d/assign/%s" % (k, w.id), json.dumps({
                "rank": rank, "size": len(members), "hosts_version": self.hosts_version,
                "start": w.start}).encode())
        for w in live[len(members):] + leaving:  # (drained ones wait in a reset for a round)
            self.server.put("elastic/%d/assign/%s" % (k, w.id), b"stop:%d" % w.start)
        for w in leaving:
            self.stop_worker(w)
        self.server.put("elastic/round", str(k).encode())
        self.members = members
        self.forming = (k, time.monotonic() + self.elastic_timeout)
        self.pending_add = False
        self.arriving = [(w, t) for w, t in self.arriving if w in starting]
        self.drain_since = None
        self.history.append((k, [w.id for w in members], reason))
        self.log("round %d: %d ranks (%s): %s" % (k, len(members),
                                                ", ".join(w.id for w in members), reason))

    def check_forming(self, now):
        k, deadline = self.forming
        missing = [w for w in self.members
                   if self.server.get("elastic/%d/ready/%s" % (k, w.id)) is None]
        if not missing:
            self.server.put("elastic/%d/go" % k, b"1")
            self.forming = None
            return None
        dead = [w for w in missing if not w.live()]
        if dead:
            return "worker %s ended before joining round %d" % (dead[0].id, k)
        if now >= deadline:
            for w in missing:
                self.blacklist_host(w.host, "worker %s did not join round %d within "
                                            "--elastic-timeout" % (w.id, k))
            return "workers %s did not join round %d" % (", ".join(w.id for w in missing), k)
        return None

    def starting(self):
        """The workers started for added hosts that are not up yet."""
        return [w for w, _ in self.arriving if w.live() and not self.up(w)]

    def joinable(self, starting):
        """The live workers that can be members of the next round: not draining from a
        removed slot, and not among ``starting`` (newcomers not up yet)."""
        return [w for w in self.live_workers() if w.leaving is None and w not in starting]

    def arrived(self, now):
        """Whether the workers started for added hosts are up (or ARRIVAL_LIMIT passed)."""
        waiting = self.starting()
        if not waiting:
            return True
        first = min(t for _, t in self.arriving)
        if now - first < min(ARRIVAL_LIMIT, self.elastic_timeout):
            return False
        self.log("%s not up %g s after starting: forming the round anyway"
                 % (", ".join(w.id for w in waiting), now - first))
        return True

    # ---- the loop ------------------------------------------------------------------------
    def run(self):
        hosts = self.discover()
        if self.address is None:
            self.address = remote.facing_address(list(hosts.items()))
        self.server = RendezvousServer(self.secret, bind=self.address)
        try:
            return self._run(hosts)
        finally:
            for w in self.workers:
                if w.ended is None:
                    self.stop_fn(w.proc)
            self.server.stop()

    def _run(self, hosts):
        now = time.monotonic()
        self.grow(hosts, now)
        if len(self.live_workers()) < self.min_np:
            raise ElasticError("only %d slots on the usable hosts (%s), fewer than --min-np %d"
                               % (len(self.live_workers()), ", ".join(hosts) or "none",
                                  self.min_np))
        self.form_round("start")
        next_discovery = now + DISCOVERY_INTERVAL
        first_success = None
        need = None
        while True:
            time.sleep(0.05)
            if self.cancelled is not None:
                raise ElasticError(self.cancelled)
            now = time.monotonic()
            for w in self.workers:
                if w.ended is None and not w.removed and w.proc.poll() is not None:
                    w.ended = w.proc.returncode
                    rest = (self.lost_fn(w) if w.ended != 0 and self.lost_fn is not None
                            else False)
                    if w.ended == 0:
                        first_success = first_success or now
                    elif rest:
                        why = "worker %s's host %s is gone" % (w.id, w.host)
                        self.log(why)
                        w.removed = True
                        need = need or why
                        if not isinstance(rest, bool):
                            self.blacklist[w.host] = max(self.blacklist.get(w.host, 0),
                                                         now + rest)
                            self.lost[w.host] = self.blacklist[w.host]
                    else:
                        why = "worker %s ended with %s%s" % (
                            w.id, proc.describe_exit(w.ended), _error_text(w.proc))
                        self.log(why)
                        if w.ended > 0:
                            w.failed = why
                        self.blacklist_host(w.host, why, failed=w.ended > 0)
                        need = need or why
            ended_ok = [w for w in self.members if w.ended == 0]
            if ended_ok:
                if all(w.ended is not None for w in self.members):
                    return 0 if all(w.ended == 0 for w in self.members) else 1
                if now - first_success > SUCCESS_GRACE:
                    self.log("stopping the workers still running %g s after %s succeeded"
                             % (SUCCESS_GRACE, ended_ok[0].id))
                    return 1
                continue
            if self.discovering() and now >= next_discovery:
                next_discovery = now + DISCOVERY_INTERVAL
                try:
                    hosts = self.discover()
                except (ElasticError, subprocess.TimeoutExpired) as e:
                    self.log("host discovery failed, keeping the last hosts: %s" % e)
                drained = False
                for w in self.live_workers():
                    if w.host in hosts and w.slot < hosts[w.host]:
                        if w.leaving is not None and self.forming is None:
                            w.leaving = None  # (its slot came back before the round formed)
                            self.log("worker %s stays: its slot is back" % w.id)
                        continue
                    if w.leaving is not None:
                        continue
                    if self.drain_seconds > 0 and w in self.members and self.forming is None:
                        w.leaving = now
                        drained = True
                        self.log("slot %s was removed: draining its worker at the next commit"
                                 % w.id)
                        continue
                    self.log("host %s is gone from the discovered hosts" % w.host)
                    self.stop_worker(w)
                    need = need or "worker %s's host was removed" % w.id
                started = self.grow(hosts, now)
                if started:
                    self.arriving.extend((w, now) for w in started)
                    self.log("started %s for added hosts; the round forms once they are up"
                             % ", ".join(w.id for w in started))
                # Removed slots go first, without waiting for the newcomers, if the members
                # that stay can train on: the plan gave those slots to another job, whose own
                # newcomers may be waiting for them (two jobs trading hosts waited on each
                # other until ARRIVAL_LIMIT on the test bed). Else the newcomers' arrival
                # bumps the version.
                staying = [w for w in self.members if w.live() and w.leaving is None]
                if drained and (not self.arriving or len(staying) >= max(1, self.min_np)):
                    self.bump_hosts_version(now)
            late = [w for w in self.live_workers() if w.leaving is not None and
                    self.drain_since is not None and now - self.drain_since > self.drain_seconds]
            for w in late:
                self.log("worker %s did not reach a commit within %g s of its slot's removal: "
                         "stopping it" % (w.id, self.drain_seconds))
                self.stop_worker(w)
                need = need or "worker %s's slot was removed" % w.id
            if self.arriving and self.arrived(now):
                self.arriving = []
                self.bump_hosts_version(now)
            if self.forming is not None and need is None:
                need = self.check_forming(now)
                if self.forming is not None or need is not None:
                    continue
            k = self.round
            resets = [w for w in self.members
                      if self.server.get("elastic/%d/reset/%s" % (k, w.id)) is not None]
            if need is None and resets:
                live_members = [w for w in self.members if w.live()]
                if self.pending_add:
                    if all(w in resets for w in live_members):
                        need = "hosts added"
                else:
                    why = self.server.get("elastic/%d/reset/%s" % (k, resets[0].id)) or b""
                    need = "worker %s asked for a reset (%s)" % (
                        resets[0].id, why.decode("utf-8", "replace")[:300])
            if need is None:
                continue
            # (A worker draining from a removed slot is no member of the next round: counting
            # it formed rounds of 0 ranks, which no newcomer could join. Newcomers still
            # starting join the round after, once they are up.)
            starting = self.starting()
            joinable = self.joinable(starting)
            if len(joinable) < self.min_np:
                live = self.live_workers()
                remain = "only %d ranks remain (%s), fewer than --min-np %d" % (
                    len(live), ", ".join(w.id for w in live) or "none", self.min_np)
                if not self.discovering() and not starting:
                    # Fixed hosts (-H, no discovery): no worker is started after the first
                    # round, so waiting --elastic-timeout could change nothing.
                    raise ElasticError("%s, and the hosts are fixed (-H without "
                                       "--host-discovery-script): none can come (%s)"
                                       % (remain, need))
                failed = [w.failed for w in self.members if w.failed]
                if not live and not starting and len(failed) == len(self.members) > 0:
                    # Every member of the round exited with an error of its own (a user's
                    # exception raised on every rank): the program's failure, not its hosts',
                    # which new hosts would only repeat. (Horovod waits --elastic-timeout.)
                    raise ElasticError("every worker of round %d ended with a failure of its "
                                       "own, so the job fails without waiting "
                                       "--elastic-timeout for hosts (first: %s)"
                                       % (self.round, failed[0]))
                if self.short_since is None:
                    self.short_since = now
                    self.log("%d workers left, fewer than --min-np %d: waiting up to %g s for "
                             "hosts" % (len(joinable), self.min_np, self.elastic_timeout))
                if now - self.short_since > self.elastic_timeout:
                    raise ElasticError("%s, and no host came within --elastic-timeout %g s "
                                       "(%s)" % (remain, self.elastic_timeout, need))
                continue
            self.short_since = None
            self.form_round(need)
            need = None


def run(args, command, hosts, env):
    """hvdrun's elastic path: the job's exit code."""
    def on_line(tag, stream, text):
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write("[%s]<%s>:%s\n" % (tag, stream, text))
        out.flush()

    def log(text):
        print("hvdrun: elastic: %s" % text, file=sys.stderr, flush=True)

    min_np = args.min_np or args.np
    max_np = args.max_np or max(args.np or 0, min_np)
    np = args.np or min_np
    driver = ElasticDriver(
        command, np, min_np, max_np, hosts=hosts, discovery_script=args.host_discovery_script,
        slots_per_host=args.slots_per_host, elastic_timeout=args.elastic_timeout,
        reset_limit=args.reset_limit, cooldown_range=args.blacklist_cooldown_range, env=env,
        on_line=on_line, ssh_args=remote.mpirun.ssh_options(args.ssh_port,
                                                             args.ssh_identity_file),
        log=log)
    try:
        return driver.run()
    except ElasticError as e:
        print("hvdrun: error: %s" % e, file=sys.stderr, flush=True)
        return 1
