"""horovod_cpp: Horovod-style distributed training with a C++17 core.

Use ``import horovod_cpp.torch as hvd`` as a drop-in for ``horovod.torch``.
"""
import os as _os
import sys as _sys

from horovod_cpp._build import __version__  # noqa: F401
from horovod_cpp._build import has_core as _has_core
from horovod_cpp._build import import_core as _import_core  # noqa: F401


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


def run(func, args=(), kwargs=None, np=1, **options):
    """``horovod_cpp.run``, as ``horovod.run``: ``func(*args, **kwargs)`` on ``np`` ranks,
    returning every rank's value (see horovod_cpp.runner.run)."""
    from horovod_cpp.runner import run as _run
    return _run(func, args=args, kwargs=kwargs, np=np, **options)
