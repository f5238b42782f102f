#!/usr/bin/env bash
# The cross-host tests, on the test bed of scripts/testbed.sh (3 hosts made on this machine):
# the core, collectives, process-set and join suites at 2 hosts x 2 ranks and 3 hosts x 1 rank,
# the Python suite (DistributedOptimizer against one process on the full batch, every op) at
# 2 x 2, a timeline recorded in a cross-host job, and what each rank sees of its host and of
# the launching shell's environment. Every job runs under its own timeout; the test bed is
# torn down on every exit, and the last check is that nothing of it is left.
#   tests/multihost/run.sh          (as root, after the default build and .venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT_DIR=$PWD
TESTBED=scripts/testbed.sh
HVDRUN=("$ROOT_DIR/.venv/bin/hvdrun")
PY="$ROOT_DIR/.venv/bin/python"
failures=0

leftovers() {  # prints what the test bed left behind, if anything
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hvd-(h[0-9]+|net)$' || true
  [[ -e /run/hvd-testbed ]] && echo "/run/hvd-testbed"
  grep -l "hvd-testbed" /etc/hosts "$HOME/.ssh/config" 2>/dev/null || true
  pgrep -f "sshd -f /run/hvd-testbed" || true
  grep -q " /run/netns " /proc/mounts && [[ -z $(ls -A /run/netns) ]] && echo "/run/netns mount" || true
}

cleanup() {
  "$TESTBED" down || true
  local left
  left=$(leftovers)
  if [[ -n $left ]]; then
    echo "multihost: the test bed left behind: $left" >&2
    exit 1
  fi
}
trap cleanup EXIT

run() {  # run NAME TIMEOUT CMD...: one job on hvd-h1, bounded in time
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  if timeout -k 10 "$limit" "$TESTBED" exec hvd-h1 "$@" > "/tmp/hvd-multihost.$$.log" 2>&1; then
    echo "multihost: ok   $name ($((SECONDS - start)) s)"
  else
    local rc=$?
    echo "multihost: FAIL $name (exit $rc after $((SECONDS - start)) s); last lines:" >&2
    tail -40 "/tmp/hvd-multihost.$$.log" >&2
    failures=$((failures + 1))
  fi
  rm -f "/tmp/hvd-multihost.$$.log"
}

"$TESTBED" up 3

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for layout in "hvd-h1:2,hvd-h2:2 4" "hvd-h1:1,hvd-h2:1,hvd-h3:1 3"; do
  read -r hosts np <<< "$layout"
  for suite in mpi_core_tests mpi_collectives_tests mpi_join_tests; do
    run "$suite -H $hosts" 300 "${HVDRUN[@]}" -np "$np" -H "$hosts" \
      "$ROOT_DIR/build/tests/$suite" --gtest_brief=1
  done
  run "mpi_process_set_tests -H $hosts" 300 env HOROVOD_DYNAMIC_PROCESS_SETS=1 \
    "${HVDRUN[@]}" -np "$np" -H "$hosts" "$ROOT_DIR/build/tests/mpi_process_set_tests" \
    --gtest_brief=1
  # Hosts, local/cross ranks and the forwarded environment, seen from every rank.
  run "check_hosts.py -H $hosts" 120 env HVD_MULTIHOST_MARK="forwarded to every host" \
    "${HVDRUN[@]}" -np "$np" -H "$hosts" "$PY" "$ROOT_DIR/tests/multihost/check_hosts.py" \
    --hosts "$hosts"
done

# The Python suite (DistributedOptimizer == one process on the full batch, every op) across
# two hosts; from tests/python so that the source tree does not shadow the installed package.
run "python suite -H hvd-h1:2,hvd-h2:2" 600 sh -c "cd '$ROOT_DIR/tests/python' && \
  '${HVDRUN[0]}' -np 4 -H hvd-h1:2,hvd-h2:2 '$PY' -m pytest -q -x"

# A timeline recorded by rank 0 in a cross-host job: valid JSON with every rank's tensor.
timeline=/tmp/hvd-multihost-timeline.$$.json
run "timeline -H hvd-h1:2,hvd-h2:2" 120 env HVD_MULTIHOST_MARK="forwarded to every host" \
  "${HVDRUN[@]}" -np 4 -H hvd-h1:2,hvd-h2:2 \
  --timeline-filename "$timeline" "$PY" "$ROOT_DIR/tests/multihost/check_hosts.py" \
  --hosts hvd-h1:2,hvd-h2:2 --timeline "$timeline"
rm -f "$timeline"

# Hosts that cannot be reached: hvdrun names them within --start-timeout and starts nothing.
expect_unreachable() {  # NAME HOST WHY: hvdrun -H hvd-h1:1,HOST:1 must fail naming HOST
  local name=$1 host=$2 why=$3 start=$SECONDS out rc=0
  out=$(timeout -k 5 60 "$TESTBED" exec hvd-h1 "${HVDRUN[@]}" -np 2 -H "hvd-h1:1,$host:1" \
        --start-timeout 5 true 2>&1) || rc=$?
  local took=$((SECONDS - start))
  if [[ $rc -eq 3 && $out == *"$host: "*"$why"* && $took -le 15 ]]; then
    echo "multihost: ok   $name (exit 3 after $took s: $(echo "$out" | tail -1 | sed 's/^ *//'))"
  else
    echo "multihost: FAIL $name (exit $rc after $took s, expected 3 within 15 s naming $host):" >&2
    echo "$out" | tail -20 >&2
    failures=$((failures + 1))
  fi
}
kill "$(cat /run/hvd-testbed/sshd-hvd-h3.pid)"
expect_unreachable "sshd stopped on hvd-h3" hvd-h3 "Connection refused"
"$TESTBED" link hvd-h2 down
expect_unreachable "hvd-h2's link down" hvd-h2 "no answer within 5 s"

if (( failures > 0 )); then
  echo "multihost: $failures job(s) failed" >&2
  exit 1
fi
echo "multihost: all cross-host jobs passed"
