#!/usr/bin/env bash
# Horovod 0.28.1, built once from its PyPI source into .venv-horovod (about 2.5 minutes on 2
# cores; later calls return at once): the baseline ./bench.sh runs next to horovod_cpp. Never a
# test dependency. The venv sees the system's torch (--system-site-packages), as .venv does,
# so both run on the same torch, Python and Open MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-horovod
VERSION=0.28.1
check() {
  "$VENV/bin/python" -c "import horovod, horovod.torch; assert horovod.__version__ == '$VERSION'" \
    > /dev/null 2>&1
}
if [[ -x $VENV/bin/python ]] && check; then
  exit 0
fi
scripts/install_deps.sh   # the compiler, Open MPI and Debian's torch that Horovod builds against
echo "setup_horovod.sh: building Horovod $VERSION into $VENV (about 2.5 minutes)" >&2
/usr/bin/python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install -q cloudpickle psutil pyyaml packaging cffi
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS="-j$(nproc)" \
  "$VENV/bin/pip" install -q --no-build-isolation --no-deps --no-binary :all: "horovod==$VERSION" \
  > "$VENV.build.log" 2>&1 || { tail -30 "$VENV.build.log" >&2; exit 1; }
check || { echo "setup_horovod.sh: horovod.torch does not import after the build" >&2; exit 1; }
