#!/usr/bin/env bash
# AdaptDL 0.2.11, the baseline of adaptive training's time-to-accuracy figure (./bench.sh), in
# .venv-adaptdl; never a test dependency. Pinned so that it works on today's stack (issue 49):
# numpy < 1.24 (it uses np.int), setuptools < 81, and a PyPI torch older than 2.6 (its
# checkpoints do not load under 2.6's weights_only default). mnist1d generates the benchmark's
# data. Later calls return at once.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-adaptdl
PINS=(adaptdl==0.2.11 "numpy==1.23.5" "setuptools<81" torch==2.5.1 mnist1d==0.0.2.post1
      "scipy<1.12" "pandas<2.1" "matplotlib<3.9")
check() {
  "$VENV/bin/python" -c "import adaptdl, adaptdl.torch, mnist1d, torch, numpy
assert torch.__version__.startswith('2.5.1') and numpy.__version__ == '1.23.5'" > /dev/null 2>&1
}
if [[ -x $VENV/bin/python ]] && check; then
  exit 0
fi
echo "setup_adaptdl.sh: installing AdaptDL 0.2.11 and torch 2.5.1 into $VENV (a few minutes)" >&2
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip > /dev/null
"$VENV/bin/pip" install -q "${PINS[@]}" > "$VENV.install.log" 2>&1 ||
  { tail -30 "$VENV.install.log" >&2; exit 1; }
check || { echo "setup_adaptdl.sh: adaptdl, mnist1d or the pinned torch does not import" >&2
           exit 1; }
