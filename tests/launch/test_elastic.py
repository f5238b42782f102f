"""The elastic driver with simulated ranks (its rounds, the order of ranks across resets,
blacklisting, --min-np, --reset-limit, growth from the discovery script), and real elastic
training on this host (examples/elastic_train.py) that loses a rank and gains one."""
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from horovod_cpp import _core
from horovod_cpp.job.elastic_driver import ElasticDriver, ElasticError
from pytest_deadline import ON_EXPIRE, descendants

pytestmark = pytest.mark.skipif(not _core.gloo_built(), reason="built without Gloo")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SIM = [sys.executable, os.path.join(HERE, "elastic_sim_worker.py")]
# Three names of this machine: hosts of their own for the driver (a failure blacklists one).
A, B, C = "localhost", "127.0.0.1", socket.gethostname()


def discovery(tmp_path, hosts):
    listing = tmp_path / "hosts.txt"
    listing.write_text("".join(h + "\n" for h in hosts))
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % listing)
    script.chmod(0o755)
    return str(script), listing


def driver(command, np, min_np, max_np, script, lines, **kw):
    def on_line(tag, stream, text):
        lines.append((tag, stream, text))
    return ElasticDriver(command, np, min_np, max_np, discovery_script=script,
                         on_line=on_line, log=lambda t: lines.append((None, "log", t)), **kw)


def rounds_of(lines, worker):
    return [text for tag, stream, text in lines if tag == worker and stream == "stdout"]


def run_adding_hosts(d, lines, add_hosts):
    """Runs the driver; add_hosts() once A's worker is in its first round."""
    def go():
        deadline = time.monotonic() + 20
        while not rounds_of(lines, A + ":0") and time.monotonic() < deadline:
            time.sleep(0.05)
        add_hosts()
    t = threading.Thread(target=go)
    t.start()
    assert d.run() == 0, lines
    t.join()


def test_a_failed_worker_is_dropped_and_survivors_keep_their_order(tmp_path):
    script, _ = discovery(tmp_path, [A + ":1", B + ":1", C + ":1"])
    lines = []
    d = driver(SIM + ["2", B + ":0"], 3, 2, 3, script, lines, elastic_timeout=20)
    assert d.run() == 0, lines
    assert [(k, ids) for k, ids, _ in d.history] == [
        (0, [A + ":0", B + ":0", C + ":0"]), (1, [A + ":0", C + ":0"])]
    assert "worker %s:0 ended with exit code 3" % B in d.history[1][2]
    assert d.blacklist[B] == float("inf") and A not in d.blacklist
    assert rounds_of(lines, A + ":0") == ["round 0 rank 0 size 3", "round 1 rank 0 size 2"]
    assert rounds_of(lines, C + ":0") == ["round 0 rank 2 size 3", "round 1 rank 1 size 2"]


def test_hosts_added_by_discovery_join_at_the_next_reset(tmp_path):
    script, listing = discovery(tmp_path, [A + ":1"])
    lines = []
    d = driver(SIM + ["3"], 1, 1, 3, script, lines, elastic_timeout=20)

    def add_hosts():
        listing.write_text("%s:1\n%s:2\n" % (A, B))
    run_adding_hosts(d, lines, add_hosts)
    assert [(k, ids) for k, ids, _ in d.history] == [
        (0, [A + ":0"]), (1, [A + ":0", B + ":0", B + ":1"])]
    assert d.history[1][2] == "hosts added" and d.hosts_version == 1
    assert rounds_of(lines, B + ":1") == ["round 1 rank 2 size 3"]


def test_slots_added_one_after_another_while_newcomers_start_join_in_one_reset(tmp_path):
    # B's first slot is discovered, then its second one 1.5 s later (Spark's tasks on a new
    # executor register one by one): the workers take 3 s to start, the driver tells the members
    # of the added hosts only once they are up, so A resets once, to 3 ranks (not to 2, then 3),
    # and trains on in its round 0 while they start.
    script, listing = discovery(tmp_path, [A + ":1"])
    lines = []
    d = driver(SIM + ["3"], 1, 1, 3, script, lines, elastic_timeout=20,
               env={"HVD_SIM_START_DELAY": "3"})

    def add_hosts():
        listing.write_text("%s:1\n%s:1\n" % (A, B))
        time.sleep(1.5)
        listing.write_text("%s:1\n%s:2\n" % (A, B))
    run_adding_hosts(d, lines, add_hosts)
    assert [(k, ids) for k, ids, _ in d.history] == [
        (0, [A + ":0"]), (1, [A + ":0", B + ":0", B + ":1"])], lines
    assert d.history[1][2] == "hosts added" and d.hosts_version == 1
    assert rounds_of(lines, A + ":0") == ["round 0 rank 0 size 1", "round 1 rank 0 size 3"]
    started = [t for tag, stream, t in lines if stream == "log" and t.startswith("started")]
    assert started == ["started %s:0 for added hosts; the round forms once they are up" % B,
                       "started %s:1 for added hosts; the round forms once they are up" % B]


def test_a_job_drained_of_its_last_slot_waits_and_a_newcomer_forms_the_next_round(tmp_path):
    # Discovery drops A's only slot: A:0 drains at its next reset, and, being the last member,
    # leaves no round behind it (a round of 0 ranks would have none to reset it: the newcomer
    # would wait for a round until its timeout). The job waits for hosts; B comes: B:0 forms
    # round 1 alone.
    script, listing = discovery(tmp_path, [A + ":1"])
    lines = []
    d = driver(SIM + ["1"], 1, 1, 1, script, lines, elastic_timeout=20, drain_seconds=30,
               env={"HVD_SIM_FROM_ROUND": "1"})

    def move():
        listing.write_text("")
        deadline = time.monotonic() + 20
        while not any(s == "log" and "waiting up to" in t for _, s, t in lines) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        listing.write_text(B + ":1\n")
    run_adding_hosts(d, lines, move)
    assert [(k, ids) for k, ids, _ in d.history] == [(0, [A + ":0"]), (1, [B + ":0"])], lines
    assert rounds_of(lines, B + ":0") == ["round 1 rank 0 size 1"]


def test_a_removed_slot_goes_before_the_newcomer_on_an_added_one_is_up(tmp_path):
    # Discovery moves B's slot to C (the scheduler gave B's slot to another job and this one a
    # slot on C). B:0 drains at once: round 1 is A:0 alone, formed while C:0 is still starting
    # (3 s), and C:0 joins in round 2. (Waiting for C:0 first held B's slot: two jobs trading
    # hosts waited on each other's slots for 60 s on the test bed.)
    script, listing = discovery(tmp_path, [A + ":1", B + ":1"])
    lines = []
    d = driver(SIM + ["2"], 2, 1, 2, script, lines, elastic_timeout=20, drain_seconds=30,
               env={"HVD_SIM_START_DELAY": "3", "HVD_SIM_FROM_ROUND": "2"})
    moved = []

    def move():
        moved.append(time.monotonic())
        listing.write_text("%s:1\n%s:1\n" % (A, C))
    run_adding_hosts(d, lines, move)
    assert [(k, ids) for k, ids, _ in d.history] == [
        (0, [A + ":0", B + ":0"]), (1, [A + ":0"]), (2, [A + ":0", C + ":0"])], lines
    assert rounds_of(lines, A + ":0") == ["round 0 rank 0 size 2", "round 1 rank 0 size 1",
                                          "round 2 rank 0 size 2"]
    assert rounds_of(lines, C + ":0") == ["round 2 rank 1 size 2"]


def test_fewer_than_min_np_fails_after_the_elastic_timeout(tmp_path):
    script, _ = discovery(tmp_path, [A + ":1", B + ":1"])
    lines = []
    d = driver(SIM + ["1", B + ":0"], 2, 2, 2, script, lines, elastic_timeout=2)
    start = time.monotonic()
    with pytest.raises(ElasticError, match=r"only 1 ranks remain \(localhost:0\), fewer than "
                                           r"--min-np 2, and no host came within "
                                           r"--elastic-timeout 2 s"):
        d.run()
    assert 2 <= time.monotonic() - start < 15
    assert not any(w.proc.poll() is None for w in d.workers)  # nothing left running


def test_fewer_than_min_np_on_fixed_hosts_fails_at_once(tmp_path):
    # No discovery script: no worker starts after the first round, so the driver does not
    # wait --elastic-timeout for a host that cannot come.
    lines = []
    d = driver(SIM + ["1", B + ":0"], 2, 2, 2, None, lines, hosts={A: 1, B: 1},
               elastic_timeout=120)
    start = time.monotonic()
    with pytest.raises(ElasticError, match=r"only 1 ranks remain \(localhost:0\), fewer than "
                                           r"--min-np 2, and the hosts are fixed .* none can "
                                           r"come \(worker 127.0.0.1:0 ended with exit code 3"):
        d.run()
    assert time.monotonic() - start < 15
    assert not any(w.proc.poll() is None for w in d.workers)  # nothing left running


def test_every_member_failing_on_its_own_fails_the_job_at_once(tmp_path):
    # Each worker exits 3 in round 0 (a user's exception on every rank): new hosts would only
    # repeat it, so the driver does not wait --elastic-timeout for them.
    script, _ = discovery(tmp_path, [A + ":1", B + ":1"])
    lines = []
    d = driver(SIM + ["2", "*"], 2, 1, 2, script, lines, elastic_timeout=120)
    start = time.monotonic()
    with pytest.raises(ElasticError, match=r"every worker of round 0 ended with a failure of its "
                                           r"own, .* \(first: worker .*:0 ended with exit code 3"):
        d.run()
    assert time.monotonic() - start < 60  # (the timeout is 120 s; ~1 s alone)
    assert not any(w.proc.poll() is None for w in d.workers)


def test_a_worker_stopped_with_its_failed_host_counts_as_failed(tmp_path):
    # localhost:0 fails; localhost:1 is stopped with its blacklisted host: nobody is left who
    # failed for another reason, so the job ends at once too.
    script, _ = discovery(tmp_path, [A + ":2"])
    lines = []
    d = driver(SIM + ["2", A + ":0"], 2, 1, 2, script, lines, elastic_timeout=120)
    start = time.monotonic()
    with pytest.raises(ElasticError, match=r"every worker of round 0 .* \(first: worker "
                                           r"localhost:0 ended with exit code 3"):
        d.run()
    assert time.monotonic() - start < 60


def test_reset_limit(tmp_path):
    script, _ = discovery(tmp_path, [A + ":1", B + ":1", C + ":1"])
    lines = []
    d = driver(SIM + ["2", C + ":0"], 3, 2, 3, script, lines, elastic_timeout=20, reset_limit=0)
    with pytest.raises(ElasticError, match="--reset-limit 0 was reached"):
        d.run()


def elastic_train(args, script_args, env=None, example="elastic_train.py"):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "horovod_cpp.runner"] + args +
                            [sys.executable, os.path.join(ROOT, "examples", example)]
                            + script_args,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full, cwd=HERE)


def worker_pids(worker_id, example="elastic_train.py"):
    """The processes of this test's job that run ``example`` as worker ``worker_id``: only
    those below this process (a child subreaper, tests/launch/conftest.py, so a worker whose
    parent died is still below it). Other jobs on the machine run the same examples with the
    same worker ids: the chaos campaign's elastic runs, beside which test.sh runs this file,
    once had a worker killed by this test (its fault then seen as never injected)."""
    pids = []
    for entry in descendants(os.getpid()):
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (example.encode() in cmd
                and ("HOROVOD_ELASTIC_WORKER_ID=%s" % worker_id).encode() in env):
            pids.append(int(entry))
    return pids


ACCURACY_BAR = 0.93  # examples/elastic_train.py, 6 epochs: a fixed-size run reaches 0.95-0.97
POWERSGD_BAR = 0.90


@pytest.mark.parametrize("sharded", [0, 2, 3, "powersgd"],
                         ids=["distributed", "sharded2", "sharded3", "powersgd"])
def test_training_survives_a_killed_rank_and_resumes_from_the_last_commit(tmp_path, sharded):
    """With --sharded 2 the killed rank's slice of the optimizer state comes back from its
    replica, and the whole state after the reset equals the last commit's. With PowerSGD
    the 2 ranks left go on from the 3 ranks' committed state (errors: their mean)."""
    script, _ = discovery(tmp_path, [A + ":1", B + ":1", C + ":1"])
    powersgd = sharded == "powersgd"
    sharded = 0 if powersgd else sharded
    job = elastic_train(["-np", "3", "--min-np", "2", "--max-np", "3",
                         "--host-discovery-script", script],
                        ["--epochs", "6", "--step-delay", "0.01", "--sharded", str(sharded)]
                        + (["--powersgd", "2"] if powersgd else []))
    out = []
    ON_EXPIRE.append(lambda: "the job's output so far:\n" + "\n".join(out))
    killed_at = None
    deadline = time.monotonic() + 200
    for line in job.stdout:
        out.append(line.rstrip("\n"))
        if killed_at is None and "epoch  2/6  3 ranks" in line:
            time.sleep(0.5)
            for pid in worker_pids(B + ":0"):
                os.kill(pid, signal.SIGKILL)
            killed_at = time.time()
        if time.monotonic() > deadline:
            job.kill()
            break
    assert job.wait(30) == 0, "\n".join(out)
    text = "\n".join(out)
    assert killed_at is not None, text
    final = re.search(r"final test accuracy: ([0-9.]+) \(2 ranks at the end\)", text)
    # PowerSGD: its own bar. Measured with this kill: 0.922-0.942 over 8 runs (exact averaging
    # 0.942-0.947); at 2 ranks without a kill both reach 0.9417, the last epochs moving by +-2 %
    # at this learning rate. Its accuracy bar proper is the digits example's (0.95, ctest
    # python_example_train_powersgd); here what counts is the state across the resize (below).
    assert final and float(final.group(1)) >= (POWERSGD_BAR if powersgd else ACCURACY_BAR), text
    resize = re.search(r"resize: 2 ranks at ([0-9.]+); rolled back to epoch \d+ batch \d+ \((\d+) "
                       r"steps since the last commit are redone\)", text)
    assert resize, text
    assert float(resize.group(1)) - killed_at < 10, text
    # --commit-every 10: at most 10 steps redone (10 when the kill lands inside a commit, which
    # then does not count).
    assert int(resize.group(2)) <= 10, text
    # Every survivor holds a commit that a rank made (rank 0's) after the reset, and all agree.
    checks = [l for l in out if "sync check: rank" in l and "of 2 params" in l]
    assert len(checks) == 2, text
    assert all("equal on every rank True, equal to a rank's commit True" in l for l in checks), \
        text
    if powersgd:  # every rank of the new world holds the same PowerSGD state, errors included
        pchecks = [l for l in out if re.search(r"powersgd check: rank \d step \d+, [1-9]\d* "
                                               r"errors, state \w+ equal on every rank True", l)]
        assert len(pchecks) == 2, text
    if sharded:
        assert all("equal to the last commit True" in l for l in checks), text
        assert re.search(r"resharded the optimizer state( and the parameters)? over 2 ranks in "
                         r"[0-9.]+ s", text), text


def run_adaptive(job, on_line, seconds=200):
    out = []
    deadline = time.monotonic() + seconds
    for line in job.stdout:
        out.append(line.rstrip("\n"))
        on_line(line)
        if time.monotonic() > deadline:
            job.kill()
            break
    assert job.wait(30) == 0, "\n".join(out)
    return "\n".join(out)


RESIZE = (r"resize: (\d+) -> (\d+) ranks at ([0-9.]+), pause ([0-9.na]+) s from the last step at "
          r"the old size, first step at the new size ended at ([0-9.]+) with batch (\d+) "
          r"\(micro (\d+) x (\d+)(; the epoch's short last step)?\)")


@pytest.mark.parametrize("change", ["lose", "gain"])
def test_adaptive_training_resizes_in_process_and_chooses_its_batch_again(tmp_path, change):
    """examples/adaptive_train.py --elastic: a rank killed (3 -> 2) or a host added (2 -> 3);
    the job goes on in process, chooses its batch for the new size on the first step there,
    and still learns."""
    hosts = [A + ":1", B + ":1"] + ([C + ":1"] if change == "lose" else [])
    script, listing = discovery(tmp_path, hosts)
    np_ = len(hosts)
    job = elastic_train(["-np", str(np_), "--min-np", "2", "--max-np", "3",
                         "--host-discovery-script", script],
                        ["--elastic", "--epochs", "30", "--step-delay", "0.02",
                         "--max-batch-size", "128", "--commit-every", "5", "--accumulation",
                         "--optimizer", "adam", "--ledger"],
                        example="adaptive_train.py")
    event = {}

    def on_line(line):
        if "at" in event or ("epoch   2  %d ranks" % np_) not in line:
            return
        time.sleep(0.3)
        event["at"] = time.time()
        if change == "lose":
            for pid in worker_pids(B + ":0", example="adaptive_train.py"):
                os.kill(pid, signal.SIGKILL)
        else:
            listing.write_text("".join(h + "\n" for h in hosts + [C + ":1"]))

    text = run_adaptive(job, on_line)
    print("\n".join(l for l in text.splitlines() if "resize" in l or "final" in l))
    print("event at %.3f" % event.get("at", float("nan")))
    assert "at" in event, text
    after = 2 if change == "lose" else 3
    final = re.search(r"final test accuracy: ([0-9.]+) \(%d ranks at the end" % after, text)
    assert final and float(final.group(1)) >= 0.9, text
    resizes = re.findall(RESIZE, text)
    assert resizes, text
    frm, to, noticed, pause, first, batch, micro, passes, short = resizes[-1]
    assert (int(frm), int(to)) == (np_, after), text
    # The first step at the new size ran a configuration chosen for it: its global batch is
    # the new size's ranks x micro-batch x micro-batches (less in an epoch's short last step).
    if short:
        assert int(batch) < after * int(micro) * int(passes), text
    else:
        assert int(batch) == after * int(micro) * int(passes), text
    if change == "gain":  # the added host's round was the only reset (no rank asked for one)
        assert "asked for a reset" not in text, text
    # Adam's moments after the reset are the last commit's, on every rank that had them.
    moments = re.findall(r"moments check: rank \d+ of %d: optimizer state equal to the last "
                         r"commit (\w+)" % after, text)
    assert moments and all(m == "True" for m in moments), text
    # Every committed epoch saw each sample once (the last step's remainder aside).
    ledger = re.findall(r"ledger: epoch \d+: (\d+) samples, (\d+) seen twice, (\d+) missing "
                        r"\((\d+) ranks\)", text)
    assert len(ledger) >= 20, text
    assert all(int(twice) == 0 and int(missing) < int(ranks) for _, twice, missing, ranks
               in ledger), text
    assert float(first) - event["at"] < 30, text


@pytest.mark.parametrize("np_,oom_rank", [(2, 1), (3, -1)], ids=["one-rank", "every-rank"])
def test_adaptive_training_backs_off_in_process_when_a_micro_batch_runs_out_of_memory(
        tmp_path, np_, oom_rank):
    """examples/adaptive_train.py --elastic with a model that raises torch's out-of-memory
    error on micro-batches above LIMIT samples (on rank 1 alone, or on every rank): each time
    the job rolls back to its last commit in process, every rank learns the micro-batch that
    failed (rank 0, which never ran out with --oom-rank 1, included), and the job goes on below
    it, losing no committed state or sample."""
    limit = 24
    hosts = [A + ":1", B + ":1", C + ":1"][:np_]
    script, _ = discovery(tmp_path, hosts)
    job = elastic_train(["-np", str(np_), "--min-np", str(np_), "--max-np", str(np_),
                         "--host-discovery-script", script],
                        ["--elastic", "--epochs", "8", "--step-delay", "0.01",
                         "--max-batch-size", str(96 * np_), "--commit-every", "5",
                         "--accumulation", "--optimizer", "adam", "--ledger",
                         "--simulate-oom-above", str(limit), "--oom-rank", str(oom_rank)],
                        example="adaptive_train.py")
    text = run_adaptive(job, lambda line: None)
    print("\n".join(l for l in text.splitlines() if "back-off" in l or "final" in l))
    final = re.search(r"final test accuracy: ([0-9.]+) \(%d ranks at the end.*micro-batches of "
                      r"at most (\d+) after running out of memory at (\d+)\)" % np_, text)
    assert final and float(final.group(1)) >= 0.9, text
    allowed, ceiling = int(final.group(2)), int(final.group(3))
    # Rank 0 holds what the ranks agreed: the least micro-batch that failed is above the
    # model's limit (nothing that fit was forbidden), and what is allowed is below it.
    assert allowed < ceiling and ceiling > limit, text
    backoffs = re.findall(r"back-off: rank (\d+) ran out of memory at micro-batch (\d+) at step "
                          r"\d+; micro-batches of at most (\d+) from now on", text)
    failed = [int(m) for r, m, _ in backoffs if int(r) == (1 if oom_rank == 1 else 0)]
    # Every back-off tried a smaller micro-batch than the last one that failed (none failed
    # twice), each halving the gap between what fit and what failed: after the first, at most
    # log2 of that gap more.
    assert failed and all(m > limit for m in failed), text
    assert failed == sorted(set(failed), reverse=True), text
    assert len(failed) <= 1 + math.ceil(math.log2(failed[0] - 1)), text
    if oom_rank == 1:
        assert {r for r, _, _ in backoffs} == {"1"}, text
    # The driver was told why (the other ranks' collectives fail with the rank that shut down
    # named: "shutdown requested by rank 1", in their reset requests where the driver saw
    # one of those first).
    assert re.search(r"asked for a reset \(out of memory at micro-batch \d+ on rank \d", text), \
        text
    # Every rank's optimizer state after each reset is the last commit's.
    moments = re.findall(r"moments check: rank \d+ of %d: optimizer state equal to the last "
                         r"commit (\w+)" % np_, text)
    assert len(moments) >= np_ * len(failed) and all(m == "True" for m in moments), text
    # Every epoch's committed samples once each, every epoch reported once (one whose end was
    # committed is entered again when a back-off rolls back to that commit, with nothing left
    # to draw).
    ledger = re.findall(r"ledger: epoch (\d+): (\d+) samples, (\d+) seen twice, (\d+) missing "
                        r"\((\d+) ranks\)", text)
    assert [int(e) for e, _, _, _, _ in ledger] == list(range(8)), text
    assert all(int(twice) == 0 and int(missing) < int(ranks) for _, _, twice, missing, ranks
               in ledger), text
