"""What every part of the package needs of how it was built, below all of them: the version
and the compiled extension ``_core``. The package's face (``horovod_cpp/__init__.py``) and its
modules import it; it imports none of them.
"""
import importlib.machinery as _machinery
import os as _os
import sys as _sys

__version__ = "0.1.0"  # the one version string: pyproject.toml and CMakeLists.txt read it


def has_core(directory):
    return any(_os.path.exists(_os.path.join(directory, "_core" + suffix))
               for suffix in _machinery.EXTENSION_SUFFIXES)


def import_core():
    """``horovod_cpp._core``, or an ImportError that says what happened and what to do."""
    try:
        from horovod_cpp import _core
        return _core
    except ImportError as error:
        raise core_missing_error(error) from error


def core_missing_error(error):
    where = _os.path.dirname(_os.path.abspath(__file__))
    if has_core(where):
        return ImportError("horovod_cpp's compiled extension %s/_core could not be loaded: %s"
                           % (where, error))
    return ImportError(
        "horovod_cpp was imported from %s, a source checkout without the compiled extension "
        "_core, and no installed horovod_cpp was found on sys.path (%s). Install it into this "
        "Python (scripts/setup_venv.sh makes .venv; or pip install --no-build-isolation .), "
        "and run with that Python: %s" % (where, error, _sys.executable))
