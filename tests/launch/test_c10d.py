"""The torch.distributed backend under the launchers of the torch.distributed world, each
program against the same one on Gloo (parameters within 1e-6 relative): torchrun
--nproc-per-node, mpirun (Intel's CPU recipe), a mixed backend string, Hugging Face's Trainer,
and Spark's TorchDistributor in local mode (a function, a script with its arguments) and on
the local session's executors (local_mode=False)."""
import os
import subprocess
import sys

import cloudpickle
import pytest
import torch

from pyspark import cloudpickle as spark_cloudpickle  # noqa: E402  (TorchDistributor's)

# The processes cannot import this test module: send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.deadline(300)

# torch's Gloo (the reference) finds its address from the host name unless told; a new
# machine's may not resolve. Every process of these tests is on this host.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
# torchrun --standalone (here and in TorchDistributor's local mode) advertises its store under
# the host name unless given a local address (PET_LOCAL_ADDR is --local-addr).
os.environ.setdefault("PET_LOCAL_ADDR", "127.0.0.1")
HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(os.path.dirname(HERE), "c10d", "programs")
DDP_TRAIN = os.path.join(PROGRAMS, "ddp_train.py")
TRAINER = os.path.join(PROGRAMS, "trainer_bert.py")
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]


def run(cmd, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    assert p.returncode == 0, "%s exited %d:\n%s" % (cmd, p.returncode, p.stdout[-6000:])
    return p.stdout


def torchrun(np_, *args):
    return run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(np_),
                "--standalone"] + list(args))


def assert_close(got, want, rtol=1e-6, atol=1e-7):
    if isinstance(got, dict):
        assert sorted(got) == sorted(want)
        got, want = [got[k] for k in sorted(got)], [want[k] for k in sorted(want)]
    assert len(got) == len(want) and got
    for g, w in zip(got, want):
        assert torch.allclose(g.float(), w.float(), rtol=rtol, atol=atol), (g - w).abs().max()


@pytest.mark.parametrize("np_", [2, 3])
def test_torchrun_ddp_script_matches_gloo(tmp_path, np_):
    outs = {}
    # (The mixed backend string at one size: what it changes does not depend on the size.)
    mixed = ("cpu:horovod_cpp,cuda:gloo",) if np_ == 2 else ()
    for backend in ("horovod_cpp", "gloo") + mixed:
        out = tmp_path / ("%s.pt" % backend.replace(",", "_").replace(":", "_"))
        text = torchrun(np_, DDP_TRAIN, "--backend", backend, "--out", str(out))
        outs[backend] = torch.load(out)
        assert "cpu backend: %s" % ("gloo" if backend == "gloo" else "horovod_cpp") in text
    assert outs["horovod_cpp"]["size"] == np_
    for backend in ("horovod_cpp",) + mixed:
        assert_close(outs[backend]["params"], outs["gloo"]["params"])


_trainer_on_gloo = {}


def trainer_on_gloo(tmp_path_factory, np_):
    """The Trainer's parameters after the run on torch's Gloo at np_ ranks (run once a size)."""
    if np_ not in _trainer_on_gloo:
        out = tmp_path_factory.mktemp("trainer_gloo") / "gloo.pt"
        torchrun(np_, TRAINER, "--backend", "gloo", "--out", str(out), "--grad-accum", "2")
        _trainer_on_gloo[np_] = torch.load(out)
    return _trainer_on_gloo[np_]


@pytest.mark.parametrize("np_", [2, 3])
def test_trainer_on_the_backend_matches_gloo(tmp_path, tmp_path_factory, np_):
    torchrun(np_, TRAINER, "--backend", "horovod_cpp", "--out", str(tmp_path / "ours.pt"),
             "--grad-accum", "2")
    assert_close(torch.load(tmp_path / "ours.pt"), trainer_on_gloo(tmp_path_factory, np_))


def test_trainer_under_mpirun_runs_on_mpi(tmp_path, tmp_path_factory):
    # Intel's CPU fine-tuning recipe launches with mpirun: the backend then runs on MPI.
    env_port = ["-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=%d" % _free_port()]
    run(MPIRUN + ["-np", "2"] + env_port + [sys.executable, TRAINER, "--backend",
                                            "horovod_cpp", "--out", str(tmp_path / "mpi.pt"),
                                            "--grad-accum", "2"])
    assert_close(torch.load(tmp_path / "mpi.pt"), trainer_on_gloo(tmp_path_factory, 2))


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_fn(backend):
    """What TorchDistributor runs in each process (by value: the test module is not importable
    there)."""
    sys.path.insert(0, PROGRAMS)
    import ddp_train
    # Every process writes its return value to the same file (TorchDistributor in local mode):
    # whichever writes last is what run() returns, so every rank returns the same thing.
    got = ddp_train.train(backend)
    got.pop("rank")
    if backend == "gloo":  # (the reference: torch's Gloo can abort its process at exit)
        ddp_train.leave_without_finalizing()  # horovod_cpp's run finalizes normally
    return got


@pytest.fixture
def distributor(spark):
    from pyspark.ml.torch.distributor import TorchDistributor
    return TorchDistributor


_ddp_on_gloo = []


def ddp_on_gloo(distributor):
    """ddp_train.train("gloo") at 2 processes under TorchDistributor in local mode (run once:
    the program is deterministic, so the other tests' runs compare with the same numbers)."""
    if not _ddp_on_gloo:
        ref = distributor(num_processes=2, local_mode=True, use_gpu=False).run(ddp_fn, "gloo")
        assert (ref["size"], ref["cpu_backend"]) == (2, "gloo")
        _ddp_on_gloo.append(ref)
    return _ddp_on_gloo[0]


@pytest.mark.parametrize("local_mode", [True, False])
def test_torch_distributor_runs_a_function_on_the_backend(distributor, local_mode):
    ours = distributor(num_processes=2, local_mode=local_mode, use_gpu=False).run(
        ddp_fn, "horovod_cpp")
    assert (ours["size"], ours["cpu_backend"]) == (2, "horovod_cpp")
    assert_close(ours["params"], ddp_on_gloo(distributor)["params"])


def test_torch_distributor_runs_a_script_with_its_arguments(distributor, tmp_path):
    distributor(num_processes=2, local_mode=True, use_gpu=False).run(
        DDP_TRAIN, "--backend", "horovod_cpp", "--out", str(tmp_path / "ours.pt"))
    ours = torch.load(tmp_path / "ours.pt")
    assert ours["cpu_backend"] == "horovod_cpp"
    assert_close(ours["params"], ddp_on_gloo(distributor)["params"])
