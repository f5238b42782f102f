"""Builds horovod_cpp's Python package: horovod_cpp._core and libhorovod_cpp, through CMake.

    python -m venv --system-site-packages .venv     # with /usr/bin/python3 (Debian's torch)
    .venv/bin/pip install --no-build-isolation .

The extension does not link LibTorch, so upgrading PyTorch never requires a rebuild.
"""
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        package_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.join(ROOT, "build-python", "cmake")
        os.makedirs(build_dir, exist_ok=True)
        configure = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
            "-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=" + package_dir,
            "-DPython3_EXECUTABLE=" + sys.executable,
            "-DHVD_BUILD_PYTHON=ON",
            "-DHVD_BUILD_TESTS=OFF",
            "-DHVD_BUILD_EXAMPLES=OFF",
            "-DHVD_WITH_TORCH=OFF",
        ] + os.environ.get("HVD_CMAKE_ARGS", "").split()
        subprocess.check_call(configure, stdout=subprocess.DEVNULL)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_core",
                               "-j", str(os.cpu_count() or 2)])


setup(
    name="horovod_cpp",
    version="0.1.0",
    description="Horovod-style distributed training with a C++17 core",
    packages=find_packages(include=["horovod_cpp", "horovod_cpp.*"]),
    ext_modules=[CMakeExtension("horovod_cpp._core")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": os.path.join("build-python", "setuptools")}},
    python_requires=">=3.8",
    install_requires=["cloudpickle"],
    extras_require={"spark": ["pyspark>=3.5"]},
    entry_points={"console_scripts": ["hvdrun = horovod_cpp.runner.launch:main"]},
    zip_safe=False,
)
