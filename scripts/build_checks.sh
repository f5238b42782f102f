#!/usr/bin/env bash
# The builds that test.sh's steps 3-5 test (test.sh runs this in the background, at the lowest
# CPU priority, while the cross-host suite runs):
#   build-cpu   the CPU-only configuration (no NCCL, Gloo, oneCCL, LibTorch or Python module)
#               with AddressSanitizer + UndefinedBehaviorSanitizer, every C++ test (oneCCL,
#               uninstrumented, stays out of the sanitizer builds; its own suites run in build/)
#   build-tsan  the unit tests (the threaded core, ranks simulated in one process) with
#               ThreadSanitizer, compiled by clang with -Wthread-safety -Werror (the
#               thread-safety annotations checked in the same build: one build of the core and
#               the unit tests instead of two, ~40 s less here)
#   build-fuzz  the libFuzzer targets, built and run (60 s each) by scripts/fuzz.sh, last,
#               once the other builds are done: fuzzing needs no timing to hold, so it
#               can run at the lowest priority beside the cross-host suite (it gets fewer
#               executions where that suite is busy); the sanitizer builds' tests cannot (their
#               timing bounds), so test.sh runs those afterwards
#   build-pypi-torch  the LibTorch C++ API, examples/train.cpp and the C++ torch tests against
#               the LibTorch of PyPI's torch (the PyPI lane's venv, scripts/setup_venv.sh --pypi):
#               CMAKE_PREFIX_PATH from torch.utils.cmake_prefix_path
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --fuzz   # clang and the sanitizer runtimes besides the toolchain
scripts/build.sh build-cpu -DHVD_SANITIZE=address,undefined -DHVD_WITH_NCCL=OFF \
  -DHVD_WITH_GLOO=OFF -DHVD_WITH_CCL=OFF -DHVD_WITH_TORCH=OFF -DHVD_BUILD_PYTHON=OFF \
  -DHVD_WERROR=ON
cmake -S . -B build-tsan -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHVD_SANITIZE=thread -DHVD_THREAD_SAFETY=ON -DHVD_WITH_NCCL=OFF -DHVD_WITH_CCL=OFF \
  -DHVD_WITH_TORCH=OFF -DHVD_BUILD_PYTHON=OFF -DHVD_BUILD_EXAMPLES=OFF -DHVD_WERROR=ON > build-tsan.configure.log 2>&1 \
  || { cat build-tsan.configure.log; exit 1; }
cmake --build build-tsan -j "$(nproc)" --target unit_tests
# LibTorch from PyPI's wheel (only the targets that use it; NCCL off: no GPU to run it here).
torch_cmake=$(.venv-pypi/bin/python -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
# (A tree configured against another torch, e.g. before the venvs were shared, is made anew:
# its cache holds that torch's library paths.)
if [[ -f build-pypi-torch/CMakeCache.txt ]] && ! grep -qF "$torch_cmake" build-pypi-torch/CMakeCache.txt; then
  rm -rf build-pypi-torch
fi
cmake -S . -B build-pypi-torch -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$torch_cmake" \
  -DHVD_WITH_TORCH=ON -DHVD_WITH_NCCL=OFF -DHVD_BUILD_PYTHON=OFF -DHVD_WERROR=ON \
  > build-pypi-torch.configure.log 2>&1 || { cat build-pypi-torch.configure.log; exit 1; }
cmake --build build-pypi-torch -j "$(nproc)" --target train mpi_torch_tests
# The fuzzers: built, then run 60 s per target, all at once.
scripts/fuzz.sh 60
