"""horovod_cpp.job, the layer under the runners (hvdrun's runner.run, Spark's, Ray's): the job
service's launch grant and lost-task naming, and the sources that let a rank's traceback name
the user's file. In one process, no Spark and no MPI needed."""
import ast
import os
import time

import cloudpickle
import pytest

import horovod_cpp

pytestmark = pytest.mark.deadline(60)


def test_the_driver_lets_the_ranks_start_once_and_names_a_lost_host():
    # What a retried barrier stage's task 0 and the tasks' heartbeats see of the JobService.
    from horovod_cpp.job import network
    from horovod_cpp.job.service import JobService
    key = network.new_key()
    job = JobService(key, b"", stream=False)
    address = "127.0.0.1:%d" % job.port
    try:
        assert network.request(address, key, {"type": "launch", "attempt": 7}) is True
        assert not job.retried()
        assert network.request(address, key, {"type": "launch", "attempt": 9}) is False
        assert job.retried()
        alive = network.connect(address)
        dying = network.connect(address)
        for sock, index, host in ((alive, 0, "host-a"), (dying, 1, "host-b")):
            network.send(sock, key, {"type": "task", "id": 100 + index, "index": index,
                                     "host": host, "ip": "10.0.0.%d" % index})
            network.send(sock, key, {"type": "attempt", "attempt": 7})
        time.sleep(0.3)
        assert job.tasks_started() == 2 and job.lost_tasks(5.0) == []
        dying.close()  # its process died: lost at once
        time.sleep(0.3)
        assert [t["host"] for t in job.lost_tasks(5.0)] == ["host-b"]
        assert job.describe_lost(5.0).startswith(
            "lost host host-b (10.0.0.1): the connection of its Spark task 1 to the driver "
            "closed 0 s ago")
        time.sleep(1.2)  # host-a silent for longer than 1 s
        assert [t["host"] for t in job.lost_tasks(1.0)] == ["host-a", "host-b"]
        network.send(alive, key, {"type": "bye"})
        time.sleep(0.3)
        assert [t["host"] for t in job.lost_tasks(1.0)] == ["host-b"]
        alive.close()
    finally:
        job.stop()


def test_a_task_that_spark_stopped_is_not_named_as_the_lost_host():
    # host-a's executor died (its task's connection closed first); Spark then killed the barrier
    # stage's task on host-b, whose executor is still registered.
    from horovod_cpp.job import network
    from horovod_cpp.job.service import JobService
    key = network.new_key()
    job = JobService(key, b"", stream=False)
    address = "127.0.0.1:%d" % job.port
    try:
        socks = []
        for index, host in enumerate(("host-a", "host-b")):
            sock = network.connect(address)
            network.send(sock, key, {"type": "task", "id": index, "index": index, "host": host,
                                     "ip": "10.0.0.%d" % (index + 1)})
            socks.append(sock)
        time.sleep(0.2)
        for sock in socks:
            sock.close()
        time.sleep(0.3)
        assert len(job.lost_tasks(5.0)) == 2
        assert job.describe_lost(5.0, alive={"10.0.0.2", "driver"}).startswith(
            "lost host host-a (10.0.0.1): ")
        assert "host-b" not in job.describe_lost(5.0, alive={"10.0.0.2"})
        # Spark has not noticed yet: both are named rather than none.
        assert "host-b" in job.describe_lost(5.0, alive={"10.0.0.1", "10.0.0.2"})
    finally:
        job.stop()


def test_rank_tracebacks_name_the_users_file_though_cloudpickle_strips_it(tmp_path):
    """cloudpickle 3.1+ sends a by-value function with co_filename "<dynamic-code>" (PyPI's
    lane has it; Debian's 2.2 keeps the name): the payload carries the file names and lines,
    and a rank whose host lacks the file still shows them. Simulated in one process, for both."""
    import functools
    import linecache
    import runpy
    import traceback

    from horovod_cpp.job import sources

    src = tmp_path / "user_code.py"
    src.write_text("def helper(x):\n    raise ValueError('bad %d' % x)\n\n\n"
                   "def main(a):\n    def inner():\n        return helper(a)\n    return inner()\n")
    module = runpy.run_path(str(src))
    main = functools.partial(module["main"], 7)
    recorded = sources.record(main)
    # What the rank gets: the code's file name stripped, and no such file on its host.
    payload = cloudpickle.dumps((main, {}, recorded))
    src.unlink()
    linecache.clearcache()
    fn, kwargs, recorded = cloudpickle.loads(payload)
    for f in (fn.func, fn.func.__globals__["helper"]):
        f.__code__ = f.__code__.replace(co_filename="<dynamic-code>", co_consts=tuple(
            c.replace(co_filename="<dynamic-code>") if hasattr(c, "co_filename") else c
            for c in f.__code__.co_consts))
    sources.restore(fn, recorded)
    with pytest.raises(ValueError) as info:
        fn(**kwargs)
    text = "".join(traceback.format_exception(info.type, info.value, info.tb))
    assert 'File "%s", line 7, in inner' % src in text, text
    assert 'File "%s", line 2, in helper' % src in text, text
    assert "raise ValueError('bad %d' % x)" in text, text
    assert "<dynamic-code>" not in text


def test_the_runners_stand_on_job_and_none_imports_another():
    """horovod_cpp.job imports no runner; runner and spark (and ray) import job, not each other
    (also not inside functions, nor as `python -m` strings)."""
    package = os.path.dirname(horovod_cpp.__file__)
    layers = {"job": set(), "runner": {"job"}, "spark": {"job"}, "ray": {"job"}}
    checked = 0
    for layer, allowed in layers.items():
        folder = os.path.join(package, layer)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            used = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    used.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    used.add(node.module)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        node.value.startswith("horovod_cpp.") and " " not in node.value:
                    used.add(node.value)
            for module in used:
                parts = module.split(".")
                if parts[0] != "horovod_cpp" or len(parts) < 2 or parts[1] not in layers:
                    continue
                assert parts[1] == layer or parts[1] in allowed, \
                    "%s/%s uses %s" % (layer, name, module)
            checked += 1
    assert checked >= 20
