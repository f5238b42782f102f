#!/usr/bin/env bash
# Creates .venv from Debian's /usr/bin/python3 with --system-site-packages (so Debian's torch,
# numpy, pytest and cloudpickle are visible), adds what the tests need from PyPI if missing,
# and installs horovod_cpp into it (pip install --no-build-isolation .: CMake rebuilds only
# what changed, in build-python/).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
missing=()
"$py" -c "import pytest_timeout" 2>/dev/null || missing+=(pytest-timeout)
if [[ ${#missing[@]} -gt 0 ]]; then
  "$py" -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi
"$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation . 2>&1 |
  grep -v "^\s*$" || true
(cd / && "$OLDPWD/$py" -c "import horovod_cpp.torch") || { echo "setup_venv: horovod_cpp.torch does not import" >&2; exit 1; }
