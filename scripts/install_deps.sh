#!/usr/bin/env bash
# Installs the Debian packages horovod_cpp builds on, only if any is missing (idempotent: a
# machine that has them all pays one dpkg query). Debian 12; run as root or with sudo.
#   install_deps.sh            build, run and test the core, the C++ and the PyTorch APIs
#   install_deps.sh --spark    also a Java runtime for pyspark (HorovodRunner), if none is there
#   install_deps.sh --fuzz     also clang and its runtimes (libFuzzer, sanitizers) for fuzz/
#   install_deps.sh --plots    also matplotlib for the Debian venv (bench.sh's figures, e.g.
#                              the scheduler's cluster trace; PyPI's would need another numpy)
set -euo pipefail

PACKAGES=(
  build-essential cmake libgtest-dev libgmock-dev          # toolchain and GoogleTest
  ccache                                                   # rebuilds from its cache
  libopenmpi-dev openmpi-bin                               # MPI backend, mpirun
  libgloo-dev libssl-dev                                   # Gloo backend, its store's HMAC
  libfabric1                                               # oneCCL's transport (install_ccl.sh)
  libboost-program-options-dev                             # example/benchmark flags
  pybind11-dev python3-pybind11 python3-dev python3-venv   # Python module
  libtorch-dev python3-torch python3-numpy                 # LibTorch API, torch layer
  python3-pytest python3-mpi4py python3-cloudpickle        # Python tests
)

for arg in "$@"; do
  case "$arg" in
    --spark) command -v java >/dev/null || PACKAGES+=(openjdk-17-jre-headless) ;;  # Java 17+
    --fuzz) PACKAGES+=(clang libclang-rt-14-dev) ;;     # libFuzzer, ASan, UBSan runtimes
    --plots) PACKAGES+=(python3-matplotlib) ;;
    *) echo "install_deps: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exec "$(dirname "$0")/install_ccl.sh"   # oneCCL from PyPI into the shared cache (once)
fi

echo "install_deps: installing ${missing[*]}" >&2
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install_deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
exec "$(dirname "$0")/install_ccl.sh"
