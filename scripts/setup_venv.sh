#!/usr/bin/env bash
# The Python environments the tests and benchmarks use, each with horovod_cpp installed.
#   setup_venv.sh           .venv: Debian's /usr/bin/python3 with --system-site-packages (Debian's
#                           torch 1.13, numpy, pytest, mpi4py, cloudpickle), horovod_cpp by
#                           pip install --no-index --no-build-isolation . (nothing is downloaded)
#   setup_venv.sh --spark   also pyspark (HorovodRunner) and ray (horovod_cpp.ray) from PyPI,
#                           unless already there
#   setup_venv.sh --pypi    .venv-pypi: the PyPI lane, a venv WITHOUT system site packages with
#                           the packages pinned in scripts/pypi-lane.txt (the newest torch, its
#                           CUDA wheel ~3 GB, pyspark, ...; installed once, reused while the pins
#                           are unchanged), horovod_cpp by a plain `pip install .` (PEP 517 build
#                           isolation, as a user installs it)
# CMake rebuilds only what changed (build-python/, one tree per environment).
set -euo pipefail
cd "$(dirname "$0")/.."
PYSPARK_VERSION=4.0.5   # Debian lane; tested with Java 17; any pyspark >= 3.5 works
RAY_VERSION=2.60.0      # Debian lane: horovod_cpp.ray's tests (a local cluster and the test bed)
pip=(--quiet --disable-pip-version-check)

check_import() {  # from outside the checkout, so the installed package is the one imported
  (cd / && "$OLDPWD/$1" -c "import horovod_cpp.torch") ||
    { echo "setup_venv: horovod_cpp.torch does not import in $1" >&2; exit 1; }
}

if [[ "${1:-}" == "--pypi" ]]; then
  venv=.venv-pypi
  [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
  if ! cmp -s scripts/pypi-lane.txt "$venv/pypi-lane.txt"; then
    echo "setup_venv: installing scripts/pypi-lane.txt into $venv from PyPI (torch's CUDA wheel" \
         "and its NVIDIA libraries: ~3 GB, a few minutes, once)" >&2
    "$venv/bin/python" -m pip install "${pip[@]}" --upgrade pip
    "$venv/bin/python" -m pip install "${pip[@]}" -r scripts/pypi-lane.txt || {
      echo "setup_venv: could not install the PyPI lane's packages (network, proxy or certificates?)" >&2
      exit 1
    }
    cp scripts/pypi-lane.txt "$venv/pypi-lane.txt"
  fi
  "$venv/bin/python" -m pip install "${pip[@]}" .
  check_import "$venv/bin/python"
  exit 0
fi

if [[ ! -x .venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
"$py" -m pip install "${pip[@]}" --no-index --no-build-isolation .
check_import "$py"
if [[ "${1:-}" == "--spark" ]]; then
  if ! "$py" -c "import pyspark, sys; sys.exit(pyspark.__version__ != '$PYSPARK_VERSION')" 2>/dev/null; then
    echo "setup_venv: installing pyspark==$PYSPARK_VERSION from PyPI (~430 MB)" >&2
    "$py" -m pip install "${pip[@]}" "pyspark==$PYSPARK_VERSION" || {
      echo "setup_venv: could not install pyspark from PyPI (network, proxy or certificates?)" >&2
      exit 1
    }
  fi
  if ! "$py" -c "import ray, sys; sys.exit(ray.__version__ != '$RAY_VERSION')" 2>/dev/null; then
    echo "setup_venv: installing ray==$RAY_VERSION from PyPI (~70 MB)" >&2
    "$py" -m pip install "${pip[@]}" "ray==$RAY_VERSION" || {
      echo "setup_venv: could not install ray from PyPI (network, proxy or certificates?)" >&2
      exit 1
    }
  fi
fi
