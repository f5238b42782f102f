#!/usr/bin/env bash
# Quick start 2/2: install what is missing, build, and run every test. Exits non-zero on any
# failure. Every multi-process test has its own timeout (ctest TIMEOUT plus an in-process
# watchdog), so a hang fails fast.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install_deps.sh --spark --fuzz
source scripts/mpi_env.sh
start=$SECONDS

# 1. The Python package, installed into .venv the way users install it, and pyspark for the
#    HorovodRunner tests (a real local SparkSession).
scripts/setup_venv.sh --spark

# 2. The default build (NCCL backend on when CUDA and NCCL are found): every test, the Python
#    ones included.
scripts/build.sh build -DHVD_WERROR=ON -DPython3_EXECUTABLE=/usr/bin/python3 \
  -DHVD_TEST_PYTHON="$PWD/.venv/bin/python"
(cd build && ctest --output-on-failure -j 2 --timeout 600)

# 3. The CPU-only configuration must build and pass on its own as well (C++ tests).
if grep -q "NCCL backend ON" build.configure.log; then
  scripts/build.sh build-cpu -DHVD_WITH_NCCL=OFF -DHVD_WITH_TORCH=OFF -DHVD_BUILD_PYTHON=OFF \
    -DHVD_WERROR=ON
  (cd build-cpu && ctest --output-on-failure -j 2 --timeout 300)
fi
# 4. Fuzzing: the wire-format and configuration parsers, 60 s each (both at once), under
#    ASan + UBSan. A longer hunt: scripts/fuzz.sh 3600.
scripts/fuzz.sh 60

echo "test.sh: all tests passed in $((SECONDS - start)) s" >&2
