"""Running from the source checkout: its horovod_cpp/ (no compiled _core) comes first on
sys.path when a script starts in the repository root, yet the installed package must win, and
where none is installed the error must say what happened and what to do."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(code, extra_env=None, argv=None, timeout=120):
    env = dict(os.environ, **(extra_env or {}))
    env.pop("PYTHONPATH", None)
    return subprocess.run(argv or [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_installed_package_wins_from_the_repository_root():
    r = run("import horovod_cpp.torch as hvd, horovod_cpp._core as core; "
            "print(hvd.__file__); print(core.__file__)")
    assert r.returncode == 0, r.stderr
    for path in r.stdout.split():
        assert not path.startswith(os.path.join(ROOT, "horovod_cpp") + os.sep), path


def test_ranks_started_in_the_repository_root_work():
    # Each rank checks its own result (their output would interleave); any failure exits 3.
    code = ("import sys, torch, horovod_cpp.torch as hvd; hvd.init(); "
            "ok = hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [2.0] * 3; "
            "sys.exit(0 if ok and not hvd.__file__.startswith(%r) else 3)"
            % os.path.join(ROOT, "horovod_cpp"))
    r = run(None, argv=["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
                        sys.executable, "-c", code])
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_checkout_without_an_installed_package_says_what_to_do():
    # The installed package is taken off sys.path: only the checkout's horovod_cpp/ is left.
    code = ("import os, sys; sys.path[:] = [p for p in sys.path if p in ('', %r) or not "
            "os.path.exists(os.path.join(p, 'horovod_cpp', '__init__.py'))]; "
            "import horovod_cpp.torch" % ROOT)
    r = run(code)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: horovod_cpp was imported from %s/horovod_cpp, a source "
                           "checkout without the compiled extension _core" % ROOT), r.stderr
    assert "scripts/setup_venv.sh" in last and os.path.normpath(sys.executable) in last, last
