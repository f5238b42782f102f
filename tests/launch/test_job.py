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


# ---- the package's import order (read from the source, not run) ---------------------------------

def _package_modules():
    """{dotted name: path} of every module of the installed horovod_cpp, plus its compiled
    extension (a leaf)."""
    root = horovod_cpp.__path__[0]
    modules = {"horovod_cpp._core": None}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, name[:-3]), root).split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join(["horovod_cpp"] + parts)] = os.path.join(folder, name)
    return modules


def _imports(name, path, modules):
    """[(module of horovod_cpp imported, at function level?, line)] of one module; ``from P
    import x`` counts as P.x where that is a module, else as P."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, inner, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package[:len(package) - child.level + 1] +
                                    ([base] if base else []))
                for a in child.names:
                    full = base + "." + a.name
                    found.append((full if full in modules else base, inner, child.lineno))
            visit(child, inner)

    visit(tree, False)
    return [(m, inner, line) for m, inner, line in found if m in modules and m != name]


def _import_graph():
    modules = _package_modules()
    return {m: _imports(m, p, modules) if p else [] for m, p in modules.items()}


def _circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _, _ in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_no_import_circle_in_the_package():
    """Module-level and function-level imports together: a function-level import that closes a
    circle only hides it (those for optional packages, pyspark, ray, stay allowed)."""
    graph = _import_graph()
    assert len(graph) >= 40
    problems = []
    for component in _circles(graph):
        hiding = sorted({"%s:%d -> %s" % (m, line, target) for m in component
                         for target, inner, line in graph[m] if target in component and inner})
        problems.append("circle among %s; imports in functions that close it: %s"
                        % (", ".join(sorted(component)), "; ".join(hiding) or "none"))
    assert not problems, "\n".join(problems)


# horovod_cpp.torch, lowest first: a module imports only from its own layer or lower ones (the
# collectives never name compression, sharding or the optimizers). A new module is placed here.
TORCH_LAYERS = [
    ["process_sets", "grad_hooks"],
    ["basics"],
    ["tensor_bridge"],
    ["adasum"],
    ["collectives"],
    ["functions", "sync_batch_norm"],
    ["compression", "compression.casts", "compression.powersgd"],
    ["optimizer"],
    # sharding: one concept per module, in a strict order (stage 3 registers itself with the
    # stage-1/2 ShardedOptimizer, which names nothing above it)
    ["sharding.common"],
    ["sharding.flat"],
    ["sharding.deferred"],
    ["sharding.elastic"],
    ["sharding.optimizer"],
    ["sharding.model"],
    ["sharding.stage3"],
    ["sharding.dcp"],
    ["sharding"],
    ["elastic", "elastic.sampler", "elastic.state"],
    # adaptive training: the shared state, the measurements, the loader, the controller
    ["adaptive.context", "adaptive.scaling_rules"],
    ["adaptive.meter", "adaptive.accumulator", "adaptive.memory"],
    ["adaptive.data"],
    ["adaptive.parallel"],
    ["adaptive"],
    # the torch.distributed backend: its rendezvous and operations, then its registration
    ["distributed.rendezvous", "distributed.backend"],
    ["distributed"],
    # the face, and the old paths kept for one release
    ["", "mpi_ops", "powersgd", "sharded", "sharded_model"],
]


# horovod_cpp.tensorflow and horovod_cpp.keras, lowest first, as TORCH_LAYERS.
TENSORFLOW_LAYERS = [
    ["basics"],
    ["tensor_bridge"],
    ["collectives", "compression"],
    ["functions", "gradient_tape"],
    ["elastic"],
    ["", "keras"],
]
KERAS_LAYERS = [
    ["backend_ops"],
    ["optimizer", "callbacks", "elastic"],
    [""],
]
# horovod_cpp.common: what every face shares; it names no framework (below).
COMMON_LAYERS = [
    ["", "process_sets"],
    ["basics"],
    ["ops"],
    ["compression", "objects", "reducer"],
    ["elastic"],
]


@pytest.mark.parametrize("face,layers", [("torch", TORCH_LAYERS),
                                         ("tensorflow", TENSORFLOW_LAYERS),
                                         ("keras", KERAS_LAYERS), ("common", COMMON_LAYERS)])
def test_the_modules_of_each_face_import_only_downwards(face, layers):
    graph = _import_graph()
    prefix = "horovod_cpp." + face
    layer_of = {(prefix + "." + m).rstrip("."): i for i, names in enumerate(layers) for m in names}
    face_modules = {m for m in graph if m == prefix or m.startswith(prefix + ".")}
    assert face_modules == set(layer_of), \
        "place these in %s_LAYERS: %s" % (face.upper(), sorted(face_modules ^ set(layer_of)))
    upward = ["%s:%d imports %s" % (m, line, target)
              for m in sorted(face_modules) for target, _, line in graph[m]
              if target in layer_of and layer_of[target] > layer_of[m]]
    assert not upward, upward


def test_the_common_modules_name_no_framework():
    """horovod_cpp.common is shared by the faces: importing it never imports torch, TensorFlow,
    Keras or a face (so a TensorFlow job never loads torch, and the other way round)."""
    frameworks = ("torch", "tensorflow", "keras", "horovod_cpp.torch", "horovod_cpp.tensorflow",
                  "horovod_cpp.keras")
    found = []
    for name, path in _package_modules().items():
        if not name.startswith("horovod_cpp.common") or path is None:
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += ["%s:%d imports %s" % (name, node.lineno, n) for n in names
                      if n.split(".")[0] in frameworks or n.startswith(frameworks[3:])]
    assert not found, found


# Every public name of horovod.torch 0.28.1 (its __init__.py), at the module paths Horovod has
# them, and the old horovod_cpp module paths kept as aliases for one release.
HOROVOD_TORCH_NAMES = {
    "horovod_cpp.torch": [
        "elastic", "Compression", "allgather_object", "broadcast_object",
        "broadcast_optimizer_state", "broadcast_parameters", "allreduce", "allreduce_async",
        "allreduce_", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async",
        "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async", "allgather",
        "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
        "broadcast_async", "broadcast_", "broadcast_async_", "alltoall", "alltoall_async",
        "reducescatter", "reducescatter_async", "grouped_reducescatter",
        "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "init",
        "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size",
        "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled",
        "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
        "cuda_built", "rocm_built", "ProcessSet", "global_process_set", "add_process_set",
        "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product",
        "HorovodInternalError", "DistributedOptimizer", "SyncBatchNorm"],
    "horovod_cpp.torch.mpi_ops": [  # Horovod's path too
        "allreduce", "allreduce_async_", "grouped_allreduce_async_", "allgather", "broadcast_",
        "alltoall", "reducescatter", "join", "barrier", "poll", "synchronize", "init", "size",
        "rank", "Average", "Sum", "Adasum", "ProcessSet", "global_process_set",
        "HorovodInternalError"],
    "horovod_cpp.torch.compression": ["Compression", "Compressor", "NoneCompressor",
                                      "FP16Compressor"],
    "horovod_cpp.torch.functions": ["allgather_object", "broadcast_object",
                                    "broadcast_optimizer_state", "broadcast_parameters"],
    "horovod_cpp.torch.optimizer": ["DistributedOptimizer"],
    "horovod_cpp.torch.sync_batch_norm": ["SyncBatchNorm"],
    "horovod_cpp.torch.elastic": ["run", "State", "ObjectState", "TorchState", "ElasticSampler"],
    # horovod_cpp's own old paths (aliases for one release)
    "horovod_cpp.torch.sharded": ["ShardedOptimizer"],
    "horovod_cpp.torch.sharded_model": ["shard_model", "sharding_of", "FullyShardedOptimizer"],
    "horovod_cpp.torch.powersgd": ["PowerSGD"],
}


def test_every_horovod_torch_name_still_imports():
    import importlib
    missing = ["%s.%s" % (module, name) for module, names in HOROVOD_TORCH_NAMES.items()
               for name in names if not hasattr(importlib.import_module(module), name)]
    assert not missing, missing
    import horovod_cpp.torch as hvd
    assert not [n for n in hvd.__all__ if not hasattr(hvd, n)]
