#!/bin/sh
# run_timeline_test.sh MODE NP MPIEXEC BINARY [MPIEXEC FLAGS...]
# Runs the timeline test binary under mpirun with a fresh $HVD_TEST_TIMELINE_DIR, then checks
# the files with check_timeline.py. MODE "normal" expects the job to succeed; "killed" runs
# only the SIGKILL test and expects the job to fail.
mode=$1 np=$2 mpiexec=$3 binary=$4
shift 4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export HVD_TEST_TIMELINE_DIR="$dir"
if [ "$mode" = killed ]; then
  "$mpiexec" -n "$np" "$@" "$binary" --gtest_filter='TimelineKill.*'
  rc=$?
  [ $rc -ne 0 ] || { echo "run_timeline_test: the killed job exited 0" >&2; exit 1; }
else
  "$mpiexec" -n "$np" "$@" "$binary" --gtest_filter='Timeline.*'
  rc=$?
  [ $rc -eq 0 ] || { echo "run_timeline_test: the job exited $rc" >&2; exit 1; }
fi
python3 "$(dirname "$0")/check_timeline.py" "$mode" "$dir" "$np"
