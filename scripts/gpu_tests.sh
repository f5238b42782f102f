#!/usr/bin/env bash
# Builds horovod_cpp with the NCCL backend and runs every GPU test, on a machine that has a GPU,
# CUDA, NCCL, Open MPI and a Python with a CUDA torch already installed (it installs nothing
# system-wide: GoogleTest is built from source into /tmp when no installed copy is found).
#   scripts/gpu_tests.sh [PYTHON]     PYTHON: an interpreter with torch (default: python3)
# Environment: GTEST_SRC (a googletest source tree; default /usr/src/googletest or
# .carry/googletest), BUILD_DIR (default build-gpu), JOBS (default nproc), HVD_CXX (the C++
# compiler; default the system's /usr/bin/g++, whatever CXX says: a compiler that links
# libstdc++ statically, as some images' own GCC wrapper does, gives libhorovod_cpp a second
# libstdc++ that crashes in iostreams once Python has loaded torch and the system one).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
if [[ -n ${HVD_CXX:-} ]]; then export CXX=$HVD_CXX; elif [[ -x /usr/bin/g++ ]]; then export CXX=/usr/bin/g++; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
nvidia-smi -L || { echo "gpu_tests: no GPU (nvidia-smi failed)" >&2; exit 1; }

prefix=()
if [[ ! -f /usr/include/gtest/gtest.h && ! -f /usr/local/include/gtest/gtest.h ]]; then
  src=${GTEST_SRC:-}
  for d in /usr/src/googletest .carry/googletest; do [[ -z $src && -d $d ]] && src=$d; done
  [[ -n $src ]] || { echo "gpu_tests: GoogleTest not found; set GTEST_SRC" >&2; exit 1; }
  if [[ ! -f /tmp/gtest/include/gtest/gtest.h ]]; then
    cmake -S "$src" -B /tmp/gtest-build -DCMAKE_INSTALL_PREFIX=/tmp/gtest >/dev/null &&
      cmake --build /tmp/gtest-build -j "$jobs" >/dev/null && cmake --install /tmp/gtest-build >/dev/null ||
      { echo "gpu_tests: building GoogleTest from $src failed" >&2; exit 1; }
  fi
  prefix=(-DCMAKE_PREFIX_PATH=/tmp/gtest)
fi
pybind=$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null || true)

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHVD_WITH_NCCL=ON -DHVD_WITH_TORCH=OFF \
  -DHVD_BUILD_EXAMPLES=OFF -DPython3_EXECUTABLE="$(command -v "$py")" ${pybind:+-Dpybind11_DIR=$pybind} \
  "${prefix[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep "horovod_cpp:" "$build.configure.log"
cmake --build "$build" -j "$jobs" 2>&1 | grep -E "error|warning" ; [[ ${PIPESTATUS[0]} -eq 0 ]] || exit 1

status=0
echo "== C++: the NCCL path on one rank (one GPU), then the ctest entries"
mpirun -np 1 "$build/tests/mpi_nccl_tests" --gtest_filter='NcclGpu.*' || status=1
(cd "$build" && ctest -R nccl --output-on-failure) || status=1

echo "== Python: horovod_cpp installed for $py, then the CUDA tests on one rank"
site=$(mktemp -d)
# setup.py builds in build-python/cmake: a cache made with another compiler would be reused.
cache=build-python/cmake/CMakeCache.txt
if [[ -f $cache ]] && ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=${CXX:-}\$" "$cache"; then
  rm -rf build-python/cmake
fi
HVD_CMAKE_ARGS="-DHVD_WITH_NCCL=ON ${pybind:+-Dpybind11_DIR=$pybind}" \
  "$py" -m pip install -q --no-deps --no-build-isolation --no-index --target "$site" . ||
  { echo "gpu_tests: pip install failed" >&2; exit 1; }
for np in 1 2; do  # np 2 needs a GPU per rank: its tests skip, saying so, on one GPU
  (cd tests/python && PYTHONPATH="$site" mpirun -np $np -x PYTHONPATH "$py" -m pytest -rs -q \
     test_cuda.py) || status=1
done
exit $status
