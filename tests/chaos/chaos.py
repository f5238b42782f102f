"""A randomized fault campaign: jobs that break in every way we know of, at random moments, and
the invariant that none of them hangs.

    chaos.py --runs N [--seed S]       N scenarios drawn from seed S (each from its own seed)
    chaos.py --ci                      the CI subset: every fault kind (most twice), a fixed
                                       list (test.sh)
    chaos.py --replay SEED             one scenario again, with its whole output
    chaos.py ... --report FILE         also write the campaign's table (Markdown) to FILE

A scenario combines a backend (MPI, Gloo, elastic Gloo, HorovodRunner on the test bed's Spark
cluster when HVD_SPARK_MASTER names it), np 2-4 and a host layout (this machine; on the test
bed, scripts/testbed.sh, 2 hosts x 2 ranks or 3 x 1; Spark's placement), a workload
(worker.py: the training check or a mix of every collective, grouped ops and a process set)
and one fault at a random step (FAULTS below). Every run must satisfy the invariant:

* the job completes with correct results (the worker checks exact values, or one process on
  the full batch; elastic jobs their accuracy bar), where the fault allows it; or
* it fails: every process of the job, on every host, gone within BOUND s of the fault (the
  collective timeout, TIMEOUT s here, plus 30 s), the exit non-zero, and the output naming the
  culprit (the rank and its host, or what each rank was blocked in, with its call site);
* and nothing left running anywhere (ranks, mpirun, orted, the launcher, the ssh sessions).

The timeouts are short here: --collective-timeout-seconds 3, --deadlock-grace-seconds 2.
Outcomes: ok, wrong (a violated expectation: completed where it must fail, failed where it
must complete, a wrong result, a culprit not named), hang (a process still running after the
bound: killed by the campaign), leftover (the job ended, something of it did not).
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "worker.py")
ELASTIC_TRAIN = os.path.join(ROOT, "examples", "elastic_train.py")
TESTBED = os.path.join(ROOT, "scripts", "testbed.sh")
TIMEOUT = 3   # --collective-timeout-seconds
GRACE = 2     # --deadlock-grace-seconds
PROBE = 5     # the collective watchdog's probe (common/loop/collective_watchdog.h)
BOUND = TIMEOUT + 30
RUN_LIMIT = 120  # a job without a fault (or whose fault lets it complete) ends within this
ACCURACY_BAR = 0.93  # examples/elastic_train.py at 6 epochs (tests/launch/test_elastic.py)
BED_HOSTS = ("hvd-h1", "hvd-h2", "hvd-h3")

# kind -> (backends, workloads, outcome, needs the test bed). outcome: "complete" (with correct
# results) or "fail" (bounded, culprit named).
FAULTS = collections.OrderedDict([
    ("none",          (("mpi", "gloo"), ("mix", "train"), "complete", False)),
    ("kill",          (("mpi", "gloo"), ("mix", "train"), "fail", False)),
    ("stop_resume",   (("mpi", "gloo"), ("mix", "train"), "fail", False)),
    ("stop_kill",     (("mpi", "gloo"), ("mix", "train"), "fail", False)),
    ("raise",         (("mpi", "gloo"), ("mix", "train"), "fail", False)),
    ("exit0",         (("mpi", "gloo"), ("mix", "train"), "fail", False)),
    ("shutdown",      (("mpi", "gloo"), ("mix", "train"), "fail", False)),
    ("skip",          (("mpi", "gloo"), ("mix",), "fail", False)),
    ("shape",         (("mpi", "gloo"), ("mix",), "fail", False)),
    ("dtype",         (("mpi", "gloo"), ("mix",), "fail", False)),
    ("op",            (("mpi", "gloo"), ("mix",), "fail", False)),
    ("root",          (("mpi", "gloo"), ("mix",), "fail", False)),
    ("duplicate",     (("mpi", "gloo"), ("mix",), "fail", False)),
    ("uneven",        (("mpi", "gloo"), ("mix", "train"), "fail", False)),
    ("timeline_full", (("mpi", "gloo"), ("mix", "train"), "complete", False)),
    ("store_kill",    (("gloo",), ("mix", "train"), "fail", False)),
    ("link_down",     (("mpi", "gloo"), ("mix", "train"), "fail", True)),
    ("throttle",      (("mpi", "gloo"), ("mix", "train"), "complete", True)),
    ("elastic_kill",  (("elastic",), ("digits",), "complete", False)),
    ("elastic_kill2", (("elastic",), ("digits",), "complete", False)),
    ("elastic_reset_kill", (("elastic",), ("digits",), "complete", False)),
    ("elastic_init_kill", (("elastic",), ("digits",), "complete", False)),
    # HorovodRunner on the test bed's Spark cluster (HVD_SPARK_MASTER): a rank killed, and the
    # executor (JVM) of a rank's host killed
    ("spark_kill",    (("spark",), ("mix", "train"), "fail", True)),
    ("spark_executor_kill", (("spark",), ("mix", "train"), "fail", True)),
])
SPARK_MASTER = os.environ.get("HVD_SPARK_MASTER", "")
SPARK_DRIVER = os.path.join(HERE, "spark_driver.py")


def bed_is_up():
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    except OSError:
        return False
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    return all(h in names for h in BED_HOSTS)


class Scenario(object):
    def __init__(self, seed, bed, kind=None, backend=None, layout=None):
        rng = random.Random(seed)
        self.seed = seed
        kinds = [k for k, v in FAULTS.items() if (bed or not v[3])
                 and (backend is None or backend in v[0])
                 and (SPARK_MASTER or "spark" not in v[0])]
        self.kind = kind or rng.choice(kinds)
        backends, workloads, self.outcome, needs_bed = FAULTS[self.kind]
        self.backend = rng.choice(backends)
        if backend is not None:
            if backend not in backends:
                raise SystemExit("chaos: %s does not apply to %s" % (self.kind, backend))
            self.backend = backend
        self.workload = rng.choice(workloads)
        if self.backend == "elastic":
            self.layout, self.np = "local", 3
        elif self.backend == "spark":  # 2 worker hosts x 2 cores; Spark places the ranks
            self.layout, self.np = "spark", rng.choice([2, 3, 4])
        elif needs_bed or (bed and layout != "local" and (layout or rng.random() < 0.4)):
            self.layout = layout if layout in ("2x2", "3x1") else rng.choice(["2x2", "3x1"])
            self.np = 4 if self.layout == "2x2" else 3
        else:
            self.layout, self.np = "local", rng.choice([2, 3, 4])
        self.steps = 40
        self.step = rng.randint(3, self.steps - 5)
        self.victim = rng.randrange(self.np)
        if self.kind in ("link_down", "throttle"):
            # a rank on another host than hvd-h1, where the job is launched
            self.victim = rng.choice([r for r in range(self.np) if self.host_of(r) != "hvd-h1"])
        self.step_delay = 0.05 if self.kind in ("store_kill", "link_down", "throttle",
                                                "spark_executor_kill") else 0.0

    def hosts_arg(self):
        return {"2x2": "hvd-h1:2,hvd-h2:2", "3x1": "hvd-h1:1,hvd-h2:1,hvd-h3:1"}.get(self.layout)

    def host_of(self, rank):
        if self.layout == "2x2":
            return BED_HOSTS[rank // 2]
        if self.layout == "3x1":
            return BED_HOSTS[rank]
        if self.layout == "spark":
            return None  # Spark's placement: the worker says where it runs
        return socket.gethostname()

    def describe(self):
        return ("seed %d: %s on %s np %d (%s), %s, rank %d at step %d"
                % (self.seed, self.kind, self.backend, self.np, self.layout, self.workload,
                   self.victim, self.step))

    def replay(self, bed):
        """The arguments that draw this scenario again."""
        return "--replay %d --kind %s --backend %s%s" % (self.seed, self.kind, self.backend,
                                                        "" if bed else " --no-bed")


# ---- processes ---------------------------------------------------------------------------------

def processes():
    """pid -> (ppid, cmdline, environ) of every process on this machine (the test hosts are
    network namespaces: their processes are visible here too)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            try:
                with open("/proc/%s/environ" % entry, "rb") as f:
                    env = f.read()
            except OSError:
                env = b""
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, cmd, env)
    return out


def job_processes(tag, baseline, bed):
    """What of the job is still running: processes naming its tag (the launcher, mpirun, every
    rank: the tag is in the worker's arguments or, for elastic workers, their environment) and,
    for a job on the test bed, Open MPI's daemons and ssh sessions (sshd children) on the test
    hosts that were not there before it."""
    found = []
    here = os.readlink("/proc/self/ns/net")

    def on_a_test_host(pid):  # (not this machine's own namespace: other work runs there)
        try:
            return os.readlink("/proc/%d/ns/net" % pid) != here
        except OSError:
            return False

    for pid, (ppid, cmd, env) in processes().items():
        if pid == os.getpid() or pid in baseline:
            continue
        if tag in cmd or tag.encode() in env:
            found.append((pid, cmd))
        elif not bed or not on_a_test_host(pid):
            continue
        elif re.match(r"(\S*/)?(orted|prted)\b", cmd):
            found.append((pid, cmd))
        elif cmd.startswith("sshd: ") and "[listener]" not in cmd:
            found.append((pid, cmd))
        elif any(m in cmd for m in ("horovod_cpp.job.rank_main",
                                    "horovod_cpp.spark.rsh_agent")):
            found.append((pid, cmd))
    return found


def host_pids(host):
    """The pids of a test host's processes (its network namespace)."""
    out = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_all(found):
    for pid, _ in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def pids_of(tag, predicate):
    return [pid for pid, (ppid, cmd, env) in processes().items()
            if pid != os.getpid() and predicate(cmd, env) and (tag in cmd or tag.encode() in env)]


# ---- one run -----------------------------------------------------------------------------------

class Run(object):
    def __init__(self, sc, python, discovery_dir):
        self.sc = sc
        self.python = python
        self.discovery_dir = discovery_dir
        self.tag = "chaos-%d-%d." % (sc.seed, os.getpid())  # (no tag a prefix of another)
        self.lines = []  # (monotonic, text)
        self.lock = threading.Lock()
        self.fault_at = None
        self.actions = []  # (when, callable, name): the campaign's own faults and follow-ups
        self.notes = []
        self.victim_host = None

    def command(self):
        sc = self.sc
        hvdrun = [self.python, "-m", "horovod_cpp.runner"]
        knobs = ["--collective-timeout-seconds", str(TIMEOUT),
                 "--deadlock-grace-seconds", str(GRACE)]
        if sc.backend == "elastic":
            script = os.path.join(self.discovery_dir, "discover.sh")
            if sc.kind == "elastic_init_kill":
                knobs = knobs + ["--log-level", "info"]
            return hvdrun + ["-np", "3", "--min-np", "1", "--max-np", "3",
                             "--host-discovery-script", script] + knobs + [
                self.python, ELASTIC_TRAIN, "--epochs", "6", "--step-delay", "0.01"]
        spec = {"tag": self.tag, "workload": sc.workload, "steps": sc.steps,
                "fault": "kill" if sc.kind == "spark_kill" else sc.kind,
                "victim": sc.victim, "step": sc.step, "step_delay": sc.step_delay}
        if sc.backend == "spark":
            return [TESTBED, "exec", "hvd-h1", self.python, SPARK_DRIVER, SPARK_MASTER,
                    str(sc.np), json.dumps(spec, sort_keys=True)]
        cmd = hvdrun + (["--gloo"] if sc.backend == "gloo" else []) + ["-np", str(sc.np)]
        if sc.hosts_arg():
            cmd += ["-H", sc.hosts_arg()]
        cmd += knobs
        if sc.kind == "timeline_full":
            cmd += ["--timeline-filename", "/dev/full"]
        cmd += [self.python, WORKER, json.dumps(spec, sort_keys=True)]
        if sc.layout != "local":
            cmd = [TESTBED, "exec", "hvd-h1"] + cmd
        return cmd

    def read(self, pipe):
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")
            now = time.monotonic()
            with self.lock:
                self.lines.append((now, text))
            self.on_line(now, text)
        pipe.close()

    def on_line(self, now, text):
        sc = self.sc
        if sc.backend == "elastic":
            self.on_elastic_line(now, text)
            return
        if self.fault_at is None and "chaos: FAULT " in text:
            self.fault_at = now
            self.schedule_fault(now, text)
        if (self.fault_at is None and sc.kind in ("store_kill", "link_down", "throttle",
                                                  "spark_executor_kill")
                and ("chaos: step %d " % sc.step) in text):
            self.fault_at = now
            self.schedule_fault(now, text)

    def schedule_fault(self, now, text):
        sc = self.sc
        m = re.search(r"pid (\d+)", text)
        pid = int(m.group(1)) if m else None
        m = re.search(r"host (\S+)", text)
        self.victim_host = m.group(1) if m else sc.host_of(sc.victim)
        host = sc.host_of(sc.victim) or self.victim_host
        if sc.kind == "stop_resume" and pid:
            # Resumed once the others' timeout and probe are over (it was silent throughout).
            self.actions.append((now + TIMEOUT + PROBE + 2, lambda: self.signal(pid, signal.SIGCONT),
                                 "SIGCONT rank %d" % sc.victim))
        elif sc.kind == "stop_kill" and pid:
            self.actions.append((now + TIMEOUT + PROBE + 2, lambda: self.signal(pid, signal.SIGKILL),
                                 "SIGKILL the stopped rank %d" % sc.victim))
        elif sc.kind == "store_kill":
            def kill_launcher():
                for p in pids_of(self.tag, lambda cmd, env: "horovod_cpp.runner" in cmd):
                    os.kill(p, signal.SIGKILL)
            self.actions.append((now, kill_launcher, "SIGKILL the launcher (rendezvous store)"))
        elif sc.kind == "link_down":
            self.actions.append((now, lambda: testbed("link", host, "down"),
                                 "%s's link down" % host))
        elif sc.kind == "throttle":
            self.actions.append((now, lambda: testbed("rate", host, "1mbit"),
                                 "%s's link at 1 Mbit/s" % host))
        elif sc.kind == "spark_executor_kill":
            def kill_executor():
                for p in host_pids(host):
                    if "CoarseGrainedExecutorBackend" in processes().get(p, (0, "", b""))[1]:
                        os.kill(p, signal.SIGKILL)
            self.actions.append((now, kill_executor, "SIGKILL %s's Spark executor" % host))

    def on_elastic_line(self, now, text):
        kind = self.sc.kind
        if kind == "elastic_init_kill":
            # A worker killed in the middle of the first round's Init (its watchdog's line,
            # --log-level info, comes after the Gloo context is up and before the endpoint
            # exchange): the others' Init fails, and they must join the next round.
            if self.fault_at is None and text.startswith("[127.0.0.1:0]") and \
                    "answers the others' probes" in text:
                self.fault_at = now
                self.actions.append((now, lambda: self.kill_workers(["127.0.0.1:0"]),
                                     "SIGKILL worker 127.0.0.1:0 during Init"))
            return
        if self.fault_at is None and "epoch  1/6" in text:
            self.fault_at = now
            victims = ["127.0.0.1:0", socket.gethostname() + ":0"]
            if kind == "elastic_kill":
                self.actions.append((now, lambda: self.kill_workers(victims[:1]),
                                     "SIGKILL worker %s" % victims[0]))
            elif kind == "elastic_kill2":
                self.actions.append((now, lambda: self.kill_workers(victims),
                                     "SIGKILL workers %s at once" % ", ".join(victims)))
            else:
                self.actions.append((now, lambda: self.kill_workers(victims[:1]),
                                     "SIGKILL worker %s" % victims[0]))
        elif (kind == "elastic_reset_kill" and self.fault_at is not None
              and not any(n.startswith("second") for n in self.notes)
              and "elastic: round 1" in text):
            self.notes.append("second kill during the reset")
            victim = socket.gethostname() + ":0"
            self.actions.append((now, lambda: self.kill_workers([victim]),
                                 "SIGKILL worker %s during the reset" % victim))

    def signal(self, pid, sig):
        """Signals `pid` if it is still this job's: pids are reused within seconds here
        (pid_max 32768), and a SIGKILL by number once hit another campaign's elastic worker."""
        if pid in pids_of(self.tag, lambda cmd, env: True):
            os.kill(pid, sig)
        else:
            self.notes.append("pid %d had already ended" % pid)

    def kill_workers(self, worker_ids):
        for pid in pids_of(self.tag, lambda cmd, env: any(
                ("HOROVOD_ELASTIC_WORKER_ID=%s" % w).encode() in env for w in worker_ids)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def execute(self):
        sc = self.sc
        baseline = set(processes())
        start = time.monotonic()
        # The tag in every process's environment too (elastic workers have no spec argument).
        env = dict(os.environ, PYTHONUNBUFFERED="1", CHAOS_TAG=self.tag)
        # From a directory of its own: the installed horovod_cpp, not the source tree, is run.
        proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd=self.discovery_dir)
        reader = threading.Thread(target=self.read, args=(proc.stdout,), daemon=True)
        reader.start()
        ended = None
        hang = False
        while True:
            now = time.monotonic()
            for action in [a for a in self.actions if a[0] <= now]:
                self.actions.remove(action)
                self.notes.append(action[2])
                try:
                    action[1]()
                except OSError as e:
                    self.notes.append("%s failed: %s" % (action[2], e))
            if proc.poll() is not None and not self.actions:
                ended = time.monotonic()
                break
            limit = (self.fault_at + BOUND if self.fault_at is not None and sc.outcome == "fail"
                     else start + RUN_LIMIT)
            if now > limit:
                hang = True
                break
            time.sleep(0.02)
        # Everything of the job must be gone within the bound of the fault (or of the end).
        deadline = max(time.monotonic(), (self.fault_at or ended or start) +
                       (BOUND if sc.outcome == "fail" else 10))
        left = job_processes(self.tag, baseline, sc.layout != "local")
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = job_processes(self.tag, baseline, sc.layout != "local")
        all_gone = time.monotonic() if not left else None
        if hang:
            left = job_processes(self.tag, baseline, sc.layout != "local")
            os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        kill_all(left)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
        reader.join(5)
        self.restore()
        return self.judge(proc.returncode, start, ended, all_gone, hang, left)

    def restore(self):
        sc = self.sc
        if sc.kind == "link_down":
            testbed("link", sc.host_of(sc.victim), "up")
        elif sc.kind == "throttle":
            testbed("rate", sc.host_of(sc.victim), "off")

    # ---- the invariant -------------------------------------------------------------------------

    def judge(self, rc, start, ended, all_gone, hang, left):
        sc = self.sc
        text = "\n".join(t for _, t in self.lines)
        r = {"seed": sc.seed, "kind": sc.kind, "backend": sc.backend, "layout": sc.layout,
             "np": sc.np, "workload": sc.workload, "victim": sc.victim, "step": sc.step,
             "rc": rc, "notes": self.notes, "leftovers": [c for _, c in left][:5],
             "culprit": None, "detect_s": None, "gone_s": None,
             "wall_s": round(time.monotonic() - start, 1)}
        ref = self.fault_at if self.fault_at is not None else start
        if ended is not None:
            r["detect_s"] = round(ended - ref, 2)
        if all_gone is not None:
            r["gone_s"] = round(all_gone - ref, 2)
        problems = []
        if hang:
            r["outcome"] = "hang"
            problems.append("still running %d s after the %s" % (
                BOUND if self.fault_at is not None else RUN_LIMIT,
                "fault" if self.fault_at is not None else "start"))
        elif left:
            r["outcome"] = "leftover"
            problems.append("left running: %s" % "; ".join(c[:120] for _, c in left[:3]))
        if sc.outcome == "complete":
            problems += self.check_completed(rc, text)
        else:
            if self.fault_at is None:
                problems.append("the fault was never injected")
            if rc == 0:
                problems.append("exit 0 after a fault that must fail the job")
            culprit = self.culprit(text)
            if culprit:
                r["culprit"] = culprit
            else:
                problems.append("no message naming the culprit")
            if all_gone is not None and self.fault_at is not None and all_gone - ref > BOUND:
                problems.append("processes lived %.1f s after the fault" % (all_gone - ref))
        if "outcome" not in r:
            r["outcome"] = "wrong" if problems else "ok"
        r["problems"] = problems
        self.result = r
        return r

    def check_completed(self, rc, text):
        sc = self.sc
        problems = []
        if rc != 0:
            problems.append("exit %d where the job must complete" % rc)
        if sc.backend == "elastic":
            m = re.search(r"final test accuracy: ([0-9.]+) \((\d+) ranks at the end\)", text)
            if not m or float(m.group(1)) < ACCURACY_BAR:
                problems.append("no final accuracy >= %.2f" % ACCURACY_BAR)
            want = {"elastic_kill": 2, "elastic_kill2": 1, "elastic_reset_kill": 1,
                    "elastic_init_kill": 2}[sc.kind]
            if m and int(m.group(2)) != want:
                problems.append("%s ranks at the end, expected %d" % (m.group(2), want))
            if self.fault_at is None:
                problems.append("the fault was never injected")
            return problems
        oks = len(re.findall(r"chaos: rank \d+ OK ", text))
        if oks != sc.np:
            problems.append("%d of %d ranks checked their results OK" % (oks, sc.np))
        if sc.kind == "timeline_full":
            warnings = len(re.findall(r"WARNING: timeline: cannot write to '/dev/full'", text))
            if warnings != 1:
                problems.append("%d timeline warnings, expected exactly 1" % warnings)
        if sc.kind == "throttle" and self.fault_at is None:
            problems.append("the link was never throttled")
        return problems

    def culprit(self, text):
        """The line naming the culprit, or None."""
        sc = self.sc
        v, host = sc.victim, sc.host_of(sc.victim) or self.victim_host or "?"
        hosts = "(%s|localhost|127\\.0\\.0\\.1)" % re.escape(host) if sc.layout == "local" \
            else re.escape(host)
        patterns = {
            "kill": [r"rank %d exited with signal 9 \(Killed\) on node %s" % (v, hosts),
                     r"rank %d \(on %s\) ended with signal 9" % (v, hosts)],
            "stop_resume": [r"no answer within \d+ s from ranks? [\d, ]*\b%d\b[\d, ]* on host %s"
                            % (v, hosts)],
            "raise": [r"shutdown requested by rank %d \(%s\)" % (v, hosts)],
            "skip": [r"rank %d \(%s\) waits for [^;]*called at \S*worker\.py:\d+" % (v, hosts)],
            "shape": [r"rank %d sent [^;.]*.*Called from: .*worker\.py:\d+" % v],
            "duplicate": [r"rank %d \(on %s\) ended with exit code 1" % (v, hosts),
                          r"rank %d exited with exit code 1" % v,
                          r"shutdown requested by rank %d \(%s\)" % (v, hosts)],
            "link_down": [r"no answer within \d+ s from ranks? [\d, ]*\b%d\b[\d, ]* on host %s"
                          % (v, hosts)],
            "store_kill": [r"."],  # the launcher itself was killed: nothing can name it
            "spark_kill": [r"chaos: driver error: .*rank %d\b.*%s" % (v, hosts),
                           r"chaos: driver error: .*%s.*rank %d\b" % (hosts, v)],
            "spark_executor_kill": [r"chaos: driver error: .*lost host %s" % hosts],
        }
        # One batch fewer: the short rank waits in the final barrier while the others wait for
        # its last step's collectives (a deadlock naming each rank's wait and call site), or,
        # when it gets that far, its exit shuts the job down.
        patterns["uneven"] = patterns["raise"] + [
            r"rank %d \(%s\) waits for barrier called at \S*worker\.py:\d+" % (v, hosts)]
        for same, like in (("stop_kill", "stop_resume"), ("exit0", "raise"),
                           ("shutdown", "raise"), ("dtype", "shape"),
                           ("op", "shape"), ("root", "shape")):
            patterns[same] = patterns[like]
        if sc.kind == "stop_kill":
            patterns["stop_kill"] = patterns["stop_resume"] + patterns["kill"]
        if sc.kind == "duplicate" and "already in flight" not in text:
            return None
        for line in text.splitlines():
            for p in patterns[sc.kind]:
                m = re.search(p, line)
                if m:
                    return m.group(0)[:200] if sc.kind != "store_kill" else "(launcher killed)"
        return None


def testbed(*args):
    subprocess.run([TESTBED] + list(args), check=False, capture_output=True, timeout=60)


# ---- campaigns ---------------------------------------------------------------------------------

# The CI subset's second scenario of these kinds runs across test hosts (the first on this
# host): the faults whose culprit is a rank on another host.
CI_ACROSS_HOSTS = ("kill", "stop_kill", "raise", "skip", "dtype", "exit0", "store_kill")
# The kinds that mostly wait run once in the CI subset (a frozen rank stays frozen for the
# timeout and the probe, 10 s; a link down ends by hvdrun's 10 s grace after the abort, 25-31 s
# a run): 41 scenarios in 335 s here alone. With the test bed up, stop_kill's run is the one
# across hosts.
CI_ONCE = ("stop_resume", "stop_kill", "link_down")


def ci_scenarios(bed):
    """The CI subset: every fault kind twice (different backends, moments and, where the test
    bed is up, hosts), but CI_ONCE's kinds once."""
    out = []
    seed = 29000
    for kind, (backends, _, _, needs_bed) in FAULTS.items():
        if (needs_bed and not bed) or ("spark" in backends and not SPARK_MASTER):
            continue
        for i in range(2):
            across = bed and i == 1 and kind in CI_ACROSS_HOSTS
            keep = kind not in CI_ONCE or i == (1 if bed and kind in CI_ACROSS_HOSTS else 0)
            if keep:
                out.append(Scenario(seed, bed, kind, layout=None if needs_bed else
                                    ("2x2" if seed % 2 else "3x1") if across else "local"))
            seed += 1
    return out


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100.0 * (len(values) - 1))))]


def table(results):
    lines = ["| fault | runs | ok | wrong | hangs | leftovers | culprit named | "
             "detect p50 / p99 / max (s) |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    by_kind = collections.OrderedDict((k, []) for k in FAULTS)
    for r in results:
        by_kind[r["kind"]].append(r)
    total = collections.Counter()
    for kind, rs in by_kind.items():
        if not rs:
            continue
        c = collections.Counter(r["outcome"] for r in rs)
        # (store_kill: the launcher itself is killed, nothing is left to name it)
        fails = [r for r in rs if FAULTS[kind][2] == "fail" and kind != "store_kill"]
        named = sum(1 for r in fails if r["culprit"])
        det = [r["detect_s"] for r in rs if r["detect_s"] is not None]
        fmt = lambda x: "-" if x is None else "%.1f" % x  # noqa: E731
        lines.append("| %s | %d | %d | %d | %d | %d | %s | %s / %s / %s |" % (
            kind, len(rs), c["ok"], c["wrong"], c["hang"], c["leftover"],
            ("%d/%d" % (named, len(fails))) if fails else "n/a",
            fmt(percentile(det, 50)), fmt(percentile(det, 99)), fmt(max(det) if det else None)))
        total.update(c)
        total["runs"] += len(rs)
    lines.append("| **all** | %d | %d | %d | %d | %d | | |" % (
        total["runs"], total["ok"], total["wrong"], total["hang"], total["leftover"]))
    return "\n".join(lines)


# The kinds whose bounds are tight for a machine shared with another job (a stopped rank is
# resumed or killed 10 s after its fault, 2 s after the others' timeout and probe; a link down
# is found by the probes): they run alone, whatever --jobs says.
ALONE = ("stop_resume", "stop_kill", "link_down")


def may_start(sc, running, jobs):
    """Whether `sc` may start beside the scenarios running now: at most `jobs` at once, ALONE's
    kinds by themselves, and one at a time on the test bed (a job there counts the test hosts'
    new processes as its own: another's would read as left behind)."""
    if not running:
        return True
    if len(running) >= jobs or sc.kind in ALONE or any(r.kind in ALONE for r in running):
        return False
    return sc.layout == "local" or all(r.layout == "local" for r in running)


def run_all(scenarios, args, discovery_dir, results):
    """Runs the scenarios, up to args.jobs at once (may_start), in their order except that one
    may start before a test-bed scenario that has to wait; never before an ALONE one. Fills
    results[i] for each scenario run (None for those --stop-file left out)."""
    lock = threading.Condition()
    pending = list(range(len(scenarios)))
    running = {}  # index -> Scenario

    def one(i):
        sc = scenarios[i]
        run = Run(sc, args.python, discovery_dir)
        try:
            r = run.execute()
        except Exception as e:  # the campaign's own failure: reported as this run's, not hung
            r = {"seed": sc.seed, "kind": sc.kind, "outcome": "wrong", "culprit": None,
                 "detect_s": None, "wall_s": 0.0, "problems": ["chaos.py raised %r" % e]}
        with lock:
            results[i] = r
            print("chaos: %4d %-8s %s%s; %.0f s in all%s" % (
                i + 1, r["outcome"], sc.describe(),
                "; detected in %.1f s" % r["detect_s"] if r["detect_s"] is not None else "",
                r["wall_s"],
                ("; " + "; ".join(r["problems"])) if r["problems"] else ""), flush=True)
            if r["outcome"] != "ok" or args.replay is not None:
                for _, text in run.lines[-60 if args.replay is None else 0:]:
                    print("    | " + text[:300])
            if args.results:
                with open(args.results, "a") as f:
                    f.write(json.dumps(r, sort_keys=True) + "\n")
            del running[i]
            lock.notify_all()

    threads = []
    with lock:
        while pending:
            if args.stop_file and os.path.exists(args.stop_file):
                print("chaos: stopped (%s exists)" % args.stop_file, flush=True)
                break
            chosen = None
            for i in pending:
                if may_start(scenarios[i], list(running.values()), args.jobs):
                    chosen = i
                    break
                if scenarios[i].kind in ALONE:
                    break
            if chosen is None:
                lock.wait()
                continue
            pending.remove(chosen)
            running[chosen] = scenarios[chosen]
            t = threading.Thread(target=one, args=(chosen,), daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--runs", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ci", action="store_true")
    p.add_argument("--replay", type=int)
    p.add_argument("--kind", choices=list(FAULTS), help="only this fault kind")
    p.add_argument("--backend", choices=["mpi", "gloo", "elastic", "spark"],
                   help="only this backend")
    p.add_argument("--report", help="write the table (Markdown) here")
    p.add_argument("--results", help="append every run's record (JSON lines) here")
    p.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    p.add_argument("--stop-file", help="stop before the next run once this file exists")
    p.add_argument("--table-from", nargs="+", metavar="RESULTS",
                   help="only print the table of these --results files (JSON lines)")
    p.add_argument("--no-bed", action="store_true", help="never use the test bed")
    p.add_argument("--jobs", type=int, default=1,
                   help="scenarios at once (default 1; the ALONE kinds, and those on the test "
                        "bed among themselves, still one at a time)")
    args = p.parse_args()
    if args.table_from:
        results = []
        for name in args.table_from:
            with open(name) as f:
                results += [json.loads(line) for line in f if line.strip()]
        print(table(results))
        if args.report:
            with open(args.report, "w") as f:
                f.write(table(results) + "\n")
        return 0
    bed = bed_is_up() and not args.no_bed
    if args.replay is not None:
        scenarios = [Scenario(args.replay, bed, args.kind, args.backend)]
    elif args.ci:
        scenarios = [sc for sc in ci_scenarios(bed)
                     if args.backend is None or sc.backend == args.backend]
    else:
        rng = random.Random(args.seed)
        scenarios = [Scenario(rng.randrange(1 << 30), bed, args.kind, args.backend)
                     for _ in range(args.runs)]
    discovery_dir = tempfile.mkdtemp(prefix="hvd-chaos-")
    with open(os.path.join(discovery_dir, "hosts.txt"), "w") as f:
        f.write("localhost:1\n127.0.0.1:1\n%s:1\n" % socket.gethostname())
    script = os.path.join(discovery_dir, "discover.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\ncat %s\n" % os.path.join(discovery_dir, "hosts.txt"))
    os.chmod(script, 0o755)
    print("chaos: %d scenarios%s; collective timeout %d s, deadlock grace %d s, bound %d s"
          % (len(scenarios), " (test bed up)" if bed else "", TIMEOUT, GRACE, BOUND), flush=True)
    results = [None] * len(scenarios)
    start = time.monotonic()
    try:
        run_all(scenarios, args, discovery_dir, results)
    finally:
        shutil.rmtree(discovery_dir, ignore_errors=True)
    ran = [i for i, r in enumerate(results) if r is not None]
    scenarios = [scenarios[i] for i in ran]
    results = [results[i] for i in ran]
    report = table(results)
    print(report)
    print("chaos: %d runs in %.0f s" % (len(results), time.monotonic() - start))
    if args.report:
        with open(args.report, "w") as f:
            f.write(report + "\n")
    bad = [(r, sc) for r, sc in zip(results, scenarios) if r["outcome"] != "ok"]
    if bad:
        print("chaos: %d of %d runs broke the invariant; replay each with tests/chaos/chaos.py %s"
              % (len(bad), len(results), ", ".join(sc.replay(bed) for _, sc in bad)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
