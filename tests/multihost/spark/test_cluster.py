"""HorovodRunner and horovod_cpp.spark.run on the test bed's Spark standalone cluster (2 workers
x 2 cores, the driver on hvd-h1): ranks on the worker hosts, results, output and errors at the
driver, np < 0 on the driver, training equal to one process on the full batch, settings
forwarded, waiting for task slots, a worker host lost in the middle of training, and
run_elastic shrinking when a worker host is lost and growing when it returns (last)."""
import glob
import io
import os
import socket
import sys
import threading
import time

import cloudpickle
import pytest

from conftest import (WORKERS, host_processes, run_testbed, start_session, wait_executors,
                      wait_no_launchers, wait_until)
from horovod_cpp.spark import HorovodRunner, HorovodRunnerError, RankError, log_to_driver
import horovod_cpp.spark
from horovod_cpp.spark import runner

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.deadline(240)
TIMINGS = []


@pytest.fixture(scope="module")
def cluster():
    session = start_session("horovod_cpp cluster tests")
    yield session
    session.stop()
    report = os.environ.get("HVD_SPARK_REPORT")  # tests/multihost/run.sh prints it
    if report:
        with open(report, "a") as f:
            f.writelines("spark cluster: %s\n" % line for line in TIMINGS)


def placement(started_at=None):
    import torch

    import horovod_cpp.torch as hvd
    began = time.time()
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    everyone = hvd.allgather_object((hvd.rank(), socket.gethostname(), hvd.local_rank(),
                                     hvd.local_size(), began))
    hvd.shutdown()
    return total, sorted(everyone)


def test_four_ranks_run_two_on_each_worker_host(cluster):
    start = time.time()
    total, everyone = HorovodRunner(np=4).run(placement)
    done = time.time()
    assert total == 6.0
    ranks = [e[0] for e in everyone]
    hosts = [e[1] for e in everyone]
    assert ranks == [0, 1, 2, 3]
    # mpirun maps by slot: each worker host runs two consecutive ranks, local ranks 0 and 1.
    assert sorted(set(hosts)) == sorted(WORKERS) and hosts[0] == hosts[1] and hosts[2] == hosts[3]
    assert [e[2] for e in everyone] == [0, 1, 0, 1] and {e[3] for e in everyone} == {2}
    TIMINGS.append("HorovodRunner(np=4).run: first rank started %.1f s after run(), result "
                   "%.1f s after" % (min(e[4] for e in everyone) - start, done - start))


def chatty():
    import horovod_cpp.torch as hvd
    hvd.init()
    rank = hvd.rank()
    log_to_driver("message from rank %d on %s" % (rank, socket.gethostname()))
    print("plain output of rank %d" % rank, flush=True)
    hvd.shutdown()
    return rank


def test_log_to_driver_and_all_output_reach_the_driver(cluster, capsys):
    assert HorovodRunner(np=4, driver_log_verbosity="all").run(chatty) == 0
    out = capsys.readouterr().out.splitlines()
    for rank in range(4):
        assert "[%d]<stdout>:plain output of rank %d" % (rank, rank) in out, out
        assert any(line.startswith("message from rank %d on hvd-h" % rank) for line in out)
        assert not any(line.endswith(" on hvd-h1") and "message from" in line for line in out)
    assert HorovodRunner(np=4).run(chatty) == 0
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("message from rank")]) == 4
    assert not any("plain output" in line for line in out)


def fail_on_rank_2():
    import horovod_cpp.torch as hvd
    hvd.init()
    if hvd.rank() == 2:
        raise KeyError("no shard for rank 2 on %s" % socket.gethostname())
    time.sleep(60)  # mpirun stops the others once rank 2 has failed


def test_an_exception_reaches_the_driver_with_its_traceback(cluster):
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        HorovodRunner(np=4).run(fail_on_rank_2)
    e = info.value
    assert e.rank == 2 and e.exc_type == "KeyError"
    assert "no shard for rank 2 on hvd-h" in str(e)
    assert "in fail_on_rank_2" in e.remote_traceback
    assert isinstance(e.__cause__, KeyError)
    assert time.monotonic() - start < 50


def test_negative_np_runs_on_the_driver_host(cluster):
    total, everyone = HorovodRunner(np=-2).run(placement)
    assert total == 1.0 and [e[1] for e in everyone] == [socket.gethostname()] * 2


def train(steps, lr):
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    features, target, model = problem()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    shard = slice(hvd.rank() * 16, (hvd.rank() + 1) * 16)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(features[shard]), target[shard]).backward()
        opt.step()
    out = [p.detach().clone() for p in model.parameters()]
    hvd.shutdown()
    return out


def problem():
    import torch
    g = torch.Generator().manual_seed(7)
    features = torch.randn(64, 5, generator=g)
    target = features @ torch.randn(5, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g)
    torch.manual_seed(3)
    return features, target, torch.nn.Linear(5, 1)


def test_training_equals_one_process_on_the_full_batch(cluster):
    import torch
    got = HorovodRunner(np=4).run(train, steps=20, lr=0.1)
    features, target, model = problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(features), target).backward()
        opt.step()
    for mine, ref in zip(got, model.parameters()):
        assert torch.allclose(mine, ref.detach(), atol=1e-5), (mine, ref)
    assert not torch.allclose(got[0], problem()[2].weight.detach())  # it did train


def settings(scale, offset=0):
    import horovod_cpp.torch as hvd
    hvd.init()
    out = (hvd.rank() * scale + offset, socket.gethostname(),
           {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")})
    print("rank %d says hello" % hvd.rank(), flush=True)
    hvd.shutdown()
    return out


def test_spark_run_returns_every_rank_with_the_drivers_settings(cluster, monkeypatch):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "4096")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "2.5")
    out, err = io.StringIO(), io.StringIO()
    results = horovod_cpp.spark.run(settings, args=(10,), kwargs={"offset": 1}, stdout=out,
                                    stderr=err, prefix_output_with_timestamp=True, verbose=2)
    assert [r[0] for r in results] == [1, 11, 21, 31]  # num_proc: defaultParallelism (4)
    assert {r[1] for r in results} == set(WORKERS)
    for _, _, env in results:
        assert env["HOROVOD_FUSION_THRESHOLD"] == "4096" and env["HOROVOD_CYCLE_TIME"] == "2.5"
    lines = out.getvalue().splitlines()
    for rank in range(4):
        said = [line for line in lines if line.endswith("rank %d says hello" % rank)]
        assert len(said) == 1 and time.strftime("%Y") in said[0], lines
    assert any("horovod_cpp: " in line and "mpirun" in line  # verbose=2: the command
               for line in err.getvalue().splitlines()), err.getvalue()
    # env= replaces the driver's HOROVOD_* variables.
    results = horovod_cpp.spark.run(settings, args=(1,), num_proc=2,
                                    env={"HOROVOD_FUSION_THRESHOLD": "8192"}, verbose=0)
    assert [r[0] for r in results] == [0, 1]
    assert all(r[2].get("HOROVOD_FUSION_THRESHOLD") == "8192" and
               "HOROVOD_CYCLE_TIME" not in r[2] for r in results)


def _blocker(sc, n, seconds, group):
    """A plain Spark job of n tasks holding n slots for ``seconds``, in a thread."""
    def hold(_):  # self-contained: PySpark pickles it with its own cloudpickle
        import time
        time.sleep(seconds)
        return [0]

    def job():
        sc.setJobGroup(group, "holds %d slots" % n, interruptOnCancel=True)
        try:
            sc.parallelize(range(n), n).mapPartitions(hold).collect()
        except Exception:
            pass  # cancelled
    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    assert wait_until(lambda: runner._busy_slots(sc) >= n, 60), "the blocking job did not start"
    return thread


def test_waits_for_task_slots_that_another_job_holds(cluster, capsys):
    sc = cluster.sparkContext
    blocker = _blocker(sc, 2, 12, "blocker-wait")
    held_until = time.monotonic() + 12
    total, _ = HorovodRunner(np=4).run(placement)
    blocker.join(30)
    assert total == 6.0
    assert time.monotonic() >= held_until - 2  # it did wait for the slots
    err = capsys.readouterr().err
    assert err.count("HorovodRunner(np=4): waiting for 4 task slots, 2 free") == 1, err


def test_gives_up_waiting_after_the_start_timeout(cluster, monkeypatch):
    sc = cluster.sparkContext
    blocker = _blocker(sc, 2, 90, "blocker-timeout")
    monkeypatch.setenv("HOROVOD_SPARK_START_TIMEOUT", "4")
    start = time.monotonic()
    try:
        with pytest.raises(HorovodRunnerError) as info:
            HorovodRunner(np=4).run(placement)
        took = time.monotonic() - start
    finally:
        sc.cancelJobGroup("blocker-timeout")
        blocker.join(30)
    assert str(info.value).startswith(
        "HorovodRunner(np=4): gave up after 4 s waiting for 4 task slots (2 of 4 free)")
    assert 3.5 <= took < 15


def test_more_ranks_than_the_cluster_has_slots_fails_at_once(cluster):
    # An application younger than spark.scheduler.maxRegisteredResourcesWaitingTime (30 s)
    # gives executors that long to register first, as Spark's scheduler does.
    young = 31 - (time.time() - cluster.sparkContext.startTime / 1000.0)
    if young > 0:
        time.sleep(young)
    start = time.monotonic()
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=5).run(placement)
    assert "needs 5 task slots at the same time (Spark barrier mode), but this Spark cluster " \
           "has 4" in str(info.value)
    assert time.monotonic() - start < 10


# ---- a worker host lost in the middle of training (these come last: they damage the cluster)

COLLECTIVE_TIMEOUT = 10


def train_until_stopped(marks):
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    with open(os.path.join(marks, "starts"), "a") as f:
        f.write("%d\n" % hvd.rank())
    t = torch.ones(1000)
    deadline_at = time.monotonic() + 300
    step = 0
    while time.monotonic() < deadline_at:
        hvd.allreduce(t, name="grad")
        step += 1
        if step == 50:
            with open(os.path.join(marks, "rank%d" % hvd.rank()), "w") as f:
                f.write(socket.gethostname())
        time.sleep(0.01)
    return step


def _lose_a_host(cluster, tmp_path, monkeypatch, which, fault):
    """Runs train_until_stopped on 4 ranks; once all train, applies ``fault(host)`` to the
    worker host that runs rank 0 (which="launcher") or the other one; returns (host, error,
    seconds from the fault to the error)."""
    monkeypatch.setenv("HOROVOD_COLLECTIVE_TIMEOUT_SECONDS", str(COLLECTIVE_TIMEOUT))
    marks = str(tmp_path)
    outcome = {}

    def go():
        try:
            outcome["value"] = HorovodRunner(np=4).run(train_until_stopped, marks=marks)
        except BaseException as e:
            outcome["error"] = e
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    assert wait_until(lambda: len(glob.glob(os.path.join(marks, "rank*"))) == 4 or
                      not thread.is_alive(), 120), "the ranks did not start training"
    assert thread.is_alive(), outcome
    hosts = {}
    for rank in range(4):
        with open(os.path.join(marks, "rank%d" % rank)) as f:
            hosts[rank] = f.read()
    host = hosts[0] if which == "launcher" else next(h for h in WORKERS if h != hosts[0])
    fault_at = time.monotonic()
    fault(host)
    thread.join(COLLECTIVE_TIMEOUT + 90)
    assert not thread.is_alive(), "run() did not return after %s was lost" % host
    survivors = [h for h in ("hvd-h1",) + WORKERS if h != host]
    left = wait_no_launchers(survivors, 20)
    assert not left, "left on the surviving hosts:\n" + "\n".join(left)
    time.sleep(3)  # a retried stage would start its ranks now
    with open(os.path.join(marks, "starts")) as f:
        starts = sorted(f.read().split())
    assert starts == ["0", "1", "2", "3"], "training started again: %s" % starts
    return host, outcome.get("error"), outcome["at"] - fault_at


def _clean_up_host(host):
    """After the link is back: whatever of the job was cut off on ``host`` ends (Spark kills
    its task once it can reach it again); if it does not within 60 s, it is killed here."""
    left = wait_no_launchers([host], 60)
    for line in left:
        try:
            os.kill(int(line.split()[1]), 9)
        except (OSError, ValueError, IndexError):
            pass


@pytest.mark.deadline(300)
def test_a_worker_hosts_link_down_mid_training(cluster, tmp_path, monkeypatch):
    def cut(host):
        run_testbed("link", host, "down")
    try:
        host, error, took = _lose_a_host(cluster, tmp_path, monkeypatch, "other", cut)
    finally:
        for h in WORKERS:
            run_testbed("link", h, "up", check=False)
    _clean_up_host(host)
    TIMINGS.append("%s's link down: run() raised %.1f s after the fault: %s"
                   % (host, took, " / ".join(str(error).splitlines()[:3])))
    assert isinstance(error, HorovodRunnerError), error
    assert host in str(error), str(error)
    survivor = next(h for h in WORKERS if h != host)
    assert "lost host %s" % survivor not in str(error), str(error)
    assert took <= COLLECTIVE_TIMEOUT + 60
    wait_executors(cluster.sparkContext, 2)


@pytest.mark.deadline(300)
def test_a_worker_hosts_processes_killed_mid_training(cluster, tmp_path, monkeypatch):
    def kill(host):
        run_testbed("kill", host)
    host, error, took = _lose_a_host(cluster, tmp_path, monkeypatch, "launcher", kill)
    TIMINGS.append("%s's processes killed (rank 0 and mpirun there): run() raised %.1f s after "
                   "the fault: %s" % (host, took, " / ".join(str(error).splitlines()[:3])))
    assert isinstance(error, HorovodRunnerError), error
    assert str(error).startswith("lost host %s (" % host), str(error)
    survivor = next(h for h in WORKERS if h != host)
    assert "lost host %s" % survivor not in str(error), str(error)  # Spark stopped its tasks
    assert took <= COLLECTIVE_TIMEOUT + 60
    assert not host_processes(host) or all("sshd" in c for _, c in host_processes(host))
    run_testbed("spark", "worker", host)  # the cluster whole again for whatever runs next
    wait_executors(cluster.sparkContext, 2)


def elastic_until_regrown(after=10, limit_steps=900):
    """Elastic training of a counter (4 ranks to start with): records the sizes it runs at;
    once it has run at 4, then fewer, then 4 again, it trains ``after`` more steps and returns
    (rank, size, the sizes seen, the steps). Prints "size N step S" now and then."""
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(step=0, sizes=[], regrown_at=None)

    @hvd.elastic.run
    def train(state):
        while state.step < limit_steps:
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes = state.sizes + [hvd.size()]
                if (len(state.sizes) >= 3 and state.sizes[-1] == state.sizes[0]
                        and state.regrown_at is None):
                    state.regrown_at = state.step
            if state.regrown_at is not None and state.step >= state.regrown_at + after:
                return
            hvd.allreduce(torch.ones(100), name="grad")
            if hvd.rank() == 0 and state.step % 5 == 0:
                print("size %d step %d" % (hvd.size(), state.step), flush=True)
            time.sleep(0.2)
            state.step += 1
            state.commit()

    train(state)
    return hvd.rank(), hvd.size(), state.sizes, state.step


@pytest.mark.deadline(420)
def test_run_elastic_shrinks_when_a_worker_host_is_lost_and_grows_when_it_returns(cluster):
    # run_elastic's 4 tasks take both workers' 2 slots; every process of hvd-h3 is killed
    # (its Spark worker, executor, tasks and training workers): the job goes on with the 2
    # ranks of hvd-h2. Then hvd-h3's Spark worker starts again: Spark runs the 2 lost tasks
    # on its new executor, and the job grows back to 4 ranks.
    lines = []

    class Out(io.TextIOBase):
        def write(self, text):
            lines.extend(text.splitlines())
            return len(text)

    outcome = {}

    def go():
        try:
            outcome["value"] = horovod_cpp.spark.run_elastic(
                elastic_until_regrown, num_proc=4, min_np=2, max_np=4, elastic_timeout=120,
                stdout=Out(), stderr=Out(), verbose=1)
        except BaseException as e:
            outcome["error"] = e

    def seen(size):
        return any("size %d step" % size in line for line in lines)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: seen(4) or not thread.is_alive(), 120), lines[-20:]
        assert thread.is_alive(), outcome
        lost_at = time.monotonic()
        run_testbed("kill", "hvd-h3")
        assert wait_until(lambda: seen(2) or not thread.is_alive(), 90), lines[-30:]
        shrunk = time.monotonic() - lost_at
        assert thread.is_alive(), (outcome, lines[-30:])
        back_at = time.monotonic()
        run_testbed("spark", "worker", "hvd-h3")
        thread.join(240)
        assert not thread.is_alive(), "run_elastic did not return: %s" % lines[-30:]
    finally:
        run_testbed("spark", "worker", "hvd-h3", check=False)
    assert "error" not in outcome, (outcome["error"], lines[-40:])
    results = outcome["value"]
    assert [(r[0], r[1]) for r in results] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    # 4 ranks, 2, 4 again: the driver adds the 2 slots of hvd-h3's new executor in one reset
    # when Spark starts its second task before the first one's worker is up (the usual case;
    # tests/launch/test_elastic.py has it deterministic), else in two (4, 2, 3, 4).
    sizes = results[0][2]
    assert all(r[2] == sizes for r in results), [r[2] for r in results]
    assert sizes in ([4, 2, 4], [4, 2, 3, 4]), sizes
    rounds = [line for line in lines if "run_elastic: round " in line]  # the driver's log
    grown = [line for line in rounds if "4 ranks" in line]
    TIMINGS.append("run_elastic: hvd-h3 killed: training went on with 2 ranks %.1f s later; its "
                   "worker restarted: back at 4 ranks (sizes %s, %d rounds in all) within %.1f s"
                   % (shrunk, sizes, len(rounds), time.monotonic() - back_at))
    assert len(grown) >= 2, rounds  # round 0 and the one it grew back in
    wait_executors(cluster.sparkContext, 2)
