#!/bin/sh
# run_and_check.sh [--expect-failure] PATTERN... -- COMMAND...
# Runs COMMAND, prints its output, and passes only if its exit status is as expected (zero,
# or non-zero with --expect-failure) and its output contains every fixed-string PATTERN.
expect_failure=0
if [ "$1" = "--expect-failure" ]; then expect_failure=1; shift; fi
patterns_file=$(mktemp)
trap 'rm -f "$patterns_file" "$out_file"' EXIT
while [ $# -gt 0 ] && [ "$1" != "--" ]; do printf '%s\n' "$1" >> "$patterns_file"; shift; done
[ "$1" = "--" ] || { echo "run_and_check.sh: missing -- before the command" >&2; exit 2; }
shift
out_file=$(mktemp)
"$@" > "$out_file" 2>&1
rc=$?
cat "$out_file"
if [ $expect_failure -eq 1 ] && [ $rc -eq 0 ]; then
  echo "run_and_check.sh: expected a failure, but the command exited 0" >&2; exit 1
fi
if [ $expect_failure -eq 0 ] && [ $rc -ne 0 ]; then
  echo "run_and_check.sh: the command exited $rc" >&2; exit 1
fi
while IFS= read -r p; do
  if ! grep -qF -- "$p" "$out_file"; then
    echo "run_and_check.sh: output lacks: $p" >&2; exit 1
  fi
done < "$patterns_file"
exit 0
