"""Builds horovod_cpp's compiled parts, horovod_cpp._core and libhorovod_cpp, through CMake.

The package's metadata is in pyproject.toml; this file holds only the CMake extension, which
setuptools' backend (packaging/backend.py) calls. Any venv works without flags:

    pip install .                       # or: pip install horovod_cpp-<version>.tar.gz
    python -m build                     # sdist and wheel into dist/

CMake options: HVD_CMAKE_ARGS="-DHVD_WITH_GLOO=OFF ..." in the environment, or
--config-settings=cmake-args="...". The extension does not link LibTorch, so upgrading PyTorch
never requires a rebuild.
"""
import hashlib
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _pybind11():
    """(CMake package directory, version) of the build environment's pybind11 (PyPI's in an
    isolated build, Debian's python3-pybind11 with --no-build-isolation), or (None, None) to
    let CMake look."""
    try:
        import pybind11
        return pybind11.get_cmake_dir(), pybind11.__version__
    except (ImportError, AttributeError, RuntimeError):
        return None, None


class BuildPy(build_py):
    """Also drops the modules the source tree no longer has (moved or deleted) from the build
    directory, which setuptools keeps between builds and would otherwise ship again."""

    def run(self):
        package = os.path.join(self.build_lib, "horovod_cpp")
        for folder, _, names in os.walk(package):
            for name in names:
                built = os.path.join(folder, name)
                if name.endswith(".py") and not os.path.exists(
                        os.path.join(ROOT, os.path.relpath(built, self.build_lib))):
                    os.remove(built)
        super().run()


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        package_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        pybind11_dir, pybind11_version = _pybind11()
        # One CMake build directory per Python environment and pybind11 version: installing
        # into two venvs from one checkout (Debian's torch lane and PyPI's) must not make each
        # install reconfigure and rebuild the other's tree. (Not per pybind11 path: an isolated
        # build gets a new temporary one every time.)
        key = hashlib.sha1(("%s|%s|%s" % (sys.prefix, sys.version, pybind11_version)).encode())
        build_dir = os.path.join(ROOT, "build-python", "cmake-" + key.hexdigest()[:10])
        os.makedirs(build_dir, exist_ok=True)
        configure = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DHVD_PYTHON_PACKAGE=ON",
            "-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=" + package_dir,
            "-DPython3_EXECUTABLE=" + sys.executable,
            "-DHVD_BUILD_PYTHON=ON",
            "-DHVD_BUILD_TESTS=OFF",
            "-DHVD_BUILD_EXAMPLES=OFF",
            "-DHVD_WITH_TORCH=OFF",
        ]
        if pybind11_dir:
            configure.append("-Dpybind11_DIR=" + pybind11_dir)
        configure += shlex.split(os.environ.get("HVD_CMAKE_ARGS", ""))
        subprocess.check_call(configure, stdout=subprocess.DEVNULL)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_core",
                               "-j", str(os.cpu_count() or 2)])


setup(
    ext_modules=[CMakeExtension("horovod_cpp._core")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
    options={"build": {"build_base": os.path.join("build-python", "setuptools")}},
)
