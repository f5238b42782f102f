#!/usr/bin/env bash
# Pollux's cluster simulator (petuum/adaptdl, branch osdi21-artifact, simulator/) at a named
# commit in .pollux-sim/, and .venv-pollux, in which it runs on this machine's Python: its own
# pins (numpy 1.19, pandas 1.1, scipy 1.5, pymoo 0.4.2.1) have no wheels for Python 3.11, and it
# needs numpy < 1.24 (np.int, np.float) and pymoo 0.4.x (pymoo.model). For
# examples/scheduling/pollux_sim_adapter.py (docs/scheduling.md); never a test dependency, and
# not run in CI (the fetch needs github.com).
#   scripts/setup_pollux_sim.sh [ADAPTDL_CLONE]   a local clone of petuum/adaptdl to take the
#                                                 commit from instead of github.com
# Later calls return at once.
set -euo pipefail
cd "$(dirname "$0")/.."
COMMIT=c793c7089bd307462686339d29707925c461f9a9   # osdi21-artifact's head
SIM=.pollux-sim
VENV=.venv-pollux
PINS=("numpy==1.23.5" "pandas==1.5.3" "scipy==1.10.1" "pymoo==0.4.2.2")
if [[ ! -f $SIM/simulator/simulator.py ]]; then
  source=${1:-https://github.com/petuum/adaptdl.git}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if [[ -d $source ]]; then
    git -C "$source" archive "$COMMIT" simulator | tar -x -C "$tmp"
  else
    git clone -q --branch osdi21-artifact "$source" "$tmp/adaptdl"
    git -C "$tmp/adaptdl" archive "$COMMIT" simulator | tar -x -C "$tmp"
  fi
  mkdir -p "$SIM"
  mv "$tmp/simulator" "$SIM/"
fi
check() {
  "$VENV/bin/python" -c "import numpy, pandas, scipy, pymoo.model.problem
assert numpy.__version__ == '1.23.5'" > /dev/null 2>&1
}
if [[ -x $VENV/bin/python ]] && check; then
  exit 0
fi
echo "setup_pollux_sim.sh: installing the simulator's dependencies into $VENV" >&2
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "${PINS[@]}" > "$VENV.install.log" 2>&1 ||
  { tail -30 "$VENV.install.log" >&2; exit 1; }
check || { echo "setup_pollux_sim.sh: the simulator's dependencies do not import" >&2; exit 1; }
