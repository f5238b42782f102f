"""horovod_cpp: Horovod-style distributed training with a C++17 core.

Use ``import horovod_cpp.torch as hvd`` as a drop-in for ``horovod.torch``.
"""
import importlib.machinery as _machinery
import os as _os
import sys as _sys

__version__ = "0.1.0"  # the one version string: pyproject.toml and CMakeLists.txt read it


def _has_core(directory):
    return any(_os.path.exists(_os.path.join(directory, "_core" + suffix))
               for suffix in _machinery.EXTENSION_SUFFIXES)


def _installed_package():
    """The directory of an installed horovod_cpp (one with its compiled _core) elsewhere on
    sys.path, or None."""
    here = _os.path.realpath(_os.path.dirname(_os.path.abspath(__file__)))
    for entry in _sys.path:
        candidate = _os.path.join(_os.path.abspath(entry or _os.curdir), "horovod_cpp")
        if _os.path.realpath(candidate) != here and _has_core(candidate):
            return candidate
    return None


# Started from a source checkout (its directory first on sys.path), this file is the
# checkout's, which has no compiled _core. The installed package then wins: every submodule
# (torch, spark, runner, _core) is loaded from it, so the checkout never half-shadows it.
_SOURCE_DIR = _os.path.dirname(_os.path.abspath(__file__))
if not _has_core(_SOURCE_DIR):
    _installed = _installed_package()
    if _installed is not None:
        __path__ = [_installed]  # noqa: F821  (the package's search path)


def _import_core():
    """``horovod_cpp._core``, or an ImportError that says what happened and what to do."""
    try:
        from horovod_cpp import _core
        return _core
    except ImportError as error:
        raise _core_missing_error(error) from error


def _core_missing_error(error):
    where = _os.path.dirname(_os.path.abspath(__file__))
    if _has_core(where):
        return ImportError("horovod_cpp's compiled extension %s/_core could not be loaded: %s"
                           % (where, error))
    return ImportError(
        "horovod_cpp was imported from %s, a source checkout without the compiled extension "
        "_core, and no installed horovod_cpp was found on sys.path (%s). Install it into this "
        "Python (scripts/setup_venv.sh makes .venv; or pip install --no-build-isolation .), "
        "and run with that Python: %s" % (where, error, _sys.executable))


def run(func, args=(), kwargs=None, np=1, **options):
    """``horovod_cpp.run``, as ``horovod.run``: ``func(*args, **kwargs)`` on ``np`` ranks,
    returning every rank's value (see horovod_cpp.runner.run)."""
    from horovod_cpp.runner import run as _run
    return _run(func, args=args, kwargs=kwargs, np=np, **options)
