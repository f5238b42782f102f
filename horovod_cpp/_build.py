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


# The CUDA libraries the core links (by soname) that PyTorch's wheel ships newer copies of, in
# the NVIDIA packages beside it. One copy of each loads per process, the first one asked for:
# the core's first (the toolkit's NCCL) leaves torch's libtorch_cuda without the symbols it
# needs (an ImportError when torch is imported after horovod_cpp, e.g. by Keras's torch
# backend). So the wheel's copies load first, whichever is imported first; NCCL 2 and the
# CUDA 13 runtime keep their ABI across minor versions, so the core runs on them as it does
# after ``import torch``.
_FRAMEWORK_LIBRARIES = (("nvidia.nccl", "lib/libnccl.so.2"), ("nvidia.cu13", "lib/libcudart.so.13"))


def _load_framework_libraries():
    if "torch" in _sys.modules:
        return  # torch loaded its own already
    import ctypes
    import importlib.util
    for package, library in _FRAMEWORK_LIBRARIES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = _os.path.join(location, library)
            if _os.path.exists(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass
                break


def import_core():
    """``horovod_cpp._core``, or an ImportError that says what happened and what to do."""
    try:
        if "horovod_cpp._core" not in _sys.modules:
            _load_framework_libraries()
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
