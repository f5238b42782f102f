#!/usr/bin/env bash
# Creates .venv from Debian's /usr/bin/python3 with --system-site-packages (so Debian's torch,
# numpy, pytest, mpi4py and cloudpickle are visible) and installs horovod_cpp into it
# (pip install --no-build-isolation .: nothing is downloaded; CMake rebuilds only what changed,
# in build-python/).
#   setup_venv.sh           horovod_cpp only
#   setup_venv.sh --spark   also pyspark from PyPI (HorovodRunner), unless already there
set -euo pipefail
cd "$(dirname "$0")/.."
PYSPARK_VERSION=4.0.5   # tested with Java 17; any pyspark >= 3.5 works with horovod_cpp.spark
if [[ ! -x .venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
"$py" -m pip install --quiet --disable-pip-version-check --no-index --no-build-isolation .
(cd / && "$OLDPWD/$py" -c "import horovod_cpp.torch") || { echo "setup_venv: horovod_cpp.torch does not import" >&2; exit 1; }
if [[ "${1:-}" == "--spark" ]]; then
  if ! "$py" -c "import pyspark, sys; sys.exit(pyspark.__version__ != '$PYSPARK_VERSION')" 2>/dev/null; then
    echo "setup_venv: installing pyspark==$PYSPARK_VERSION from PyPI (~430 MB)" >&2
    "$py" -m pip install --quiet --disable-pip-version-check "pyspark==$PYSPARK_VERSION" || {
      echo "setup_venv: could not install pyspark from PyPI (network, proxy or certificates?)" >&2
      exit 1
    }
  fi
fi
