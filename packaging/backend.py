"""horovod_cpp's PEP 517 build backend: setuptools' own, plus two things.

* The build asks for PyPI's ``cmake`` only where the machine has no CMake >= 3.18 on PATH
  (a build-time requirement decided at build time, as scikit-build-core does): a machine that
  has one (Debian's) downloads nothing more.
* ``--config-settings=cmake-args="-DX=Y ..."`` is passed to CMake, as ``HVD_CMAKE_ARGS`` is.
"""
import os
import re
import shutil
import subprocess

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the rest of the PEP 517 hooks)

_CMAKE_MINIMUM = (3, 18)


def _cmake_requires():
    cmake = shutil.which("cmake")
    if cmake:
        try:
            out = subprocess.run([cmake, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
            found = re.search(r"version (\d+)\.(\d+)", out)
            if found and tuple(int(x) for x in found.groups()) >= _CMAKE_MINIMUM:
                return []
        except (OSError, subprocess.SubprocessError):
            pass
    return ["cmake>=%d.%d" % _CMAKE_MINIMUM]


def _pass_cmake_args(config_settings):
    args = (config_settings or {}).get("cmake-args")
    if args:
        if not isinstance(args, str):
            args = " ".join(args)
        os.environ["HVD_CMAKE_ARGS"] = (os.environ.get("HVD_CMAKE_ARGS", "") + " " + args).strip()


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _cmake_requires()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + _cmake_requires()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _pass_cmake_args(config_settings)
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _pass_cmake_args(config_settings)
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
