#!/usr/bin/env bash
# Creates .venv from Debian's /usr/bin/python3 with --system-site-packages (so Debian's torch,
# numpy, pytest, mpi4py and cloudpickle are visible) and installs horovod_cpp into it
# (pip install --no-build-isolation .: nothing is downloaded; CMake rebuilds only what changed,
# in build-python/).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
"$py" -m pip install --quiet --disable-pip-version-check --no-index --no-build-isolation .
(cd / && "$OLDPWD/$py" -c "import horovod_cpp.torch") || { echo "setup_venv: horovod_cpp.torch does not import" >&2; exit 1; }
