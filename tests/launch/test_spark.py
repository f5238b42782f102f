"""HorovodRunner on a real local SparkSession (barrier mode, mpirun through the rsh agent):
results, kwargs, errors with the failing rank's traceback, crashes, slot shortage,
unpicklable input, np < 0 on the driver, log streaming, settings reaching the ranks, and no
process left behind (conftest.no_stray_processes runs after every test)."""
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

from horovod_cpp.spark import HorovodRunner, HorovodRunnerError, RankError, log_to_driver

# The ranks cannot import this test module: send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.deadline(180)


def allreduce_ranks():
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    result = (hvd.rank(), hvd.size(), total, os.getpid())
    hvd.shutdown()
    return result


@pytest.mark.parametrize("np_", [2, 3])
def test_returns_rank_0s_value(spark, np_):
    rank, size, total, pid = HorovodRunner(np=np_).run(allreduce_ranks)
    assert (rank, size, total) == (0, np_, np_ * (np_ - 1) / 2)
    assert pid != os.getpid()


def test_one_host_per_task_goes_through_one_daemon_per_task(spark, monkeypatch):
    # Every task a separate "host": mpirun starts 3 daemons through the rsh agent, one in
    # each barrier task, as on a cluster of 3 machines.
    monkeypatch.setenv("HVD_SPARK_HOST_SALT", "task")
    assert HorovodRunner(np=3).run(allreduce_ranks)[:3] == (0, 3, 3.0)


def echo_kwargs(a, b=2, **rest):
    return {"a": a, "b": b, "rest": rest}


def test_kwargs_travel_with_cloudpickle(spark):
    array = np.arange(6.0).reshape(2, 3)
    got = HorovodRunner(np=2).run(echo_kwargs, a="x", array=array, square=lambda v: v * v)
    assert got["a"] == "x" and got["b"] == 2
    assert np.array_equal(got["rest"]["array"], array)
    assert got["rest"]["square"](7) == 49


def fail_on_rank_1():
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if rank == 1:
        raise ValueError("bad shard %d" % rank)
    time.sleep(60)  # rank 0 would wait for rank 1 in a collective; mpirun stops it


def test_an_exception_on_rank_1_reaches_the_driver_with_its_traceback(spark):
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        HorovodRunner(np=2).run(fail_on_rank_1)
    e = info.value
    assert e.rank == 1 and e.exc_type == "ValueError"
    assert str(e).startswith("rank 1 raised ValueError: bad shard 1")
    assert 'raise ValueError("bad shard %d" % rank)' in e.remote_traceback
    assert "in fail_on_rank_1" in e.remote_traceback
    assert isinstance(e.__cause__, ValueError) and str(e.__cause__) == "bad shard 1"
    assert time.monotonic() - start < 50  # rank 0 was stopped, not waited for


def killed_on_rank_1():
    import signal
    if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
        print("rank 1 about to die", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def test_a_rank_killed_by_a_signal_fails_the_run(spark):
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=2).run(killed_on_rank_1)
    text = str(info.value)
    assert not isinstance(info.value, RankError)
    assert "rank 1 exited with signal 9 (Killed)" in text, text
    assert "rank 1 about to die" in text  # the rank's last output


def test_np_larger_than_the_slots_fails_fast(spark):
    start = time.monotonic()
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=5).run(allreduce_ranks)
    assert str(info.value).startswith(
        "HorovodRunner(np=5) needs 5 task slots at the same time (Spark barrier mode), but "
        "this Spark cluster has 4 (master local[4], spark.task.cpus=1)")
    assert time.monotonic() - start < 10  # Spark itself would retry for minutes


def test_unpicklable_function_or_argument_fails_on_the_driver(spark):
    lock = threading.Lock()

    def uses_lock():
        with lock:
            return 1

    with pytest.raises(pickle.PicklingError) as info:
        HorovodRunner(np=2).run(uses_lock)
    assert "could not pickle the function " in str(info.value)
    assert "uses_lock" in str(info.value) and "lock" in str(info.value)
    with pytest.raises(pickle.PicklingError) as info:
        HorovodRunner(np=2).run(echo_kwargs, a=1, guard=lock)
    assert "keyword argument 'guard' (lock)" in str(info.value)
    # Nothing reached Spark.
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def unpicklable_result():
    import threading
    return threading.Lock()


def test_an_unpicklable_return_value_is_a_clear_error(spark):
    with pytest.raises(RankError) as info:
        HorovodRunner(np=2).run(unpicklable_result)
    assert info.value.rank == 0
    assert "the return value of main (lock) is not cloudpickle-serializable" in str(info.value)


def where_am_i():
    from pyspark import TaskContext
    return (int(os.environ["OMPI_COMM_WORLD_SIZE"]), "HVD_SPARK_TASKS" in os.environ,
            TaskContext.get() is None, os.getppid())


def test_negative_np_runs_on_the_driver_without_spark():
    size, under_spark, no_task, _ = HorovodRunner(np=-2).run(where_am_i)
    assert (size, under_spark, no_task) == (2, False, True)


def test_np_validation():
    with pytest.raises(ValueError, match="np > 0 to run np ranks as Spark barrier tasks .* "
                                         "np < 0 to run -np ranks on the driver"):
        HorovodRunner(np=0)
    with pytest.raises(TypeError):
        HorovodRunner(2)  # keyword-only, as in sparkdl
    with pytest.raises(TypeError, match="np must be an int"):
        HorovodRunner(np="2")
    with pytest.raises(ValueError, match="driver_log_verbosity"):
        HorovodRunner(np=2, driver_log_verbosity="some")


def chatty():
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    log_to_driver("message from rank %d" % rank)
    print("plain output of rank %d" % rank)
    return rank


@pytest.mark.parametrize("np_", [2, -2])
def test_log_callback_only_prints_just_the_messages(spark, capsys, np_):
    assert HorovodRunner(np=np_).run(chatty) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(line for line in out if "rank" in line) == [
        "message from rank 0", "message from rank 1"]


@pytest.mark.parametrize("np_", [2, -2])
def test_verbosity_all_streams_every_ranks_output(spark, capsys, np_):
    assert HorovodRunner(np=np_, driver_log_verbosity="all").run(chatty) == 0
    out = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        assert "message from rank %d" % rank in out
        assert "[%d]<stdout>:plain output of rank %d" % (rank, rank) in out


def horovod_settings():
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(3), name="traced")
    settings = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}
    hvd.shutdown()  # flushes the timeline
    return settings


def test_horovod_settings_on_the_driver_reach_the_ranks(spark, monkeypatch, tmp_path):
    timeline = tmp_path / "timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(timeline))
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "4096")
    settings = HorovodRunner(np=2).run(horovod_settings)
    assert settings["HOROVOD_TIMELINE"] == str(timeline)
    assert settings["HOROVOD_FUSION_THRESHOLD"] == "4096"
    events = json.loads(timeline.read_text())
    assert any(e.get("args", {}).get("name") == "allreduce.traced" for e in events)


def test_executors_without_horovod_cpp_get_a_clear_error(spark, tmp_path):
    # The executors run Debian's /usr/bin/python3, which has torch but not horovod_cpp (the
    # tests install it into .venv only). PySpark reads the executors' Python from the
    # SparkContext when a job is created, as PYSPARK_PYTHON sets it at session start.
    bare = "/usr/bin/python3"
    probe = subprocess.run([bare, "-c", "import horovod_cpp"], cwd=str(tmp_path),
                           capture_output=True)
    if probe.returncode == 0:
        pytest.skip("%s can import horovod_cpp here" % bare)
    sc = spark.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = bare
    try:
        with pytest.raises(HorovodRunnerError) as info:
            HorovodRunner(np=2).run(allreduce_ranks)
    finally:
        sc.pythonExec = saved
    message = str(info.value)
    assert message.startswith("the Spark executors' Python, %s, cannot import horovod_cpp "
                              "(ModuleNotFoundError: No module named 'horovod_cpp')" % bare), message
    assert "PYSPARK_PYTHON" in message and sys.executable in message
    assert "\tat " not in message and len(message) < 600  # no Java stack trace
    assert HorovodRunner(np=2).run(allreduce_ranks)[:3] == (0, 2, 1.0)  # and the next run works


# ---- a script file with its arguments, and the ranks on the driver (TorchDistributor's ways) --

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce_script.py")


@pytest.mark.parametrize("np_", [2, -2])  # barrier tasks; the driver
def test_horovod_runner_runs_a_script_with_its_arguments(spark, tmp_path, np_):
    out = tmp_path / "out.json"
    assert HorovodRunner(np=np_).run(SCRIPT, "--out", str(out), "--scale", "2.5") is None
    got = json.loads(out.read_text())
    n = abs(np_)
    assert got == {"size": n, "total": 2.5 * n * (n + 1) / 2, "name": "__main__",
                   "argv": ["--out", str(out), "--scale", "2.5"]}


def test_spark_run_runs_a_script_and_its_failures_name_the_status(spark, tmp_path):
    out = tmp_path / "out.json"
    from horovod_cpp.spark import run as spark_run
    assert spark_run(SCRIPT, args=["--out", str(out)], num_proc=3, verbose=0) is None
    assert json.loads(out.read_text())["total"] == 6.0
    with pytest.raises(HorovodRunnerError, match="exited with status 3"):
        spark_run(SCRIPT, args=["--out", str(out), "--exit-code", "3"], num_proc=2, verbose=0)
    with pytest.raises(FileNotFoundError, match="cannot read the script .*missing.py"):
        spark_run(str(tmp_path / "missing.py"), num_proc=2)
    with pytest.raises(TypeError, match="positional arguments are the script's command line"):
        HorovodRunner(np=2).run(allreduce_ranks, 1)


def test_spark_run_local_mode_runs_on_the_driver_without_a_session(tmp_path):
    from horovod_cpp.spark import run as spark_run
    values = spark_run(allreduce_ranks, num_proc=2, local_mode=True, verbose=0)
    assert [v[:3] for v in values] == [(0, 2, 1.0), (1, 2, 1.0)]
    out = tmp_path / "out.json"
    spark_run(SCRIPT, args=["--out", str(out)], num_proc=2, local_mode=True, verbose=0)
    assert json.loads(out.read_text())["total"] == 3.0
