#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang + ASan + UBSan) and runs each for a fixed time,
# all at once. Exits non-zero on any crash, sanitizer report, broken invariant or slow input
# (the input that did it is saved as build-fuzz/<target>.found; rerun it with
# build-fuzz/<target>_fuzz FILE).
# A slow input is one that takes over 10 s by the wall clock. ./test.sh runs this at the lowest
# CPU priority beside the cross-host suite, where a fuzzer can wait for the CPU longer than that
# while inside one input (CI saw one 13 s "timeout" in ~2 million inputs of microseconds each).
# So an input reported slow is run again alone: only one that is slow again fails the run.
#   scripts/fuzz.sh [SECONDS]        default 60 per target (./test.sh uses the default)
#   scripts/fuzz.sh 3600             a longer hunt; new inputs collect in build-fuzz/corpus-*
#   scripts/fuzz.sh --seeds          rewrite fuzz/corpus/wire from real messages
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --fuzz   # clang, libFuzzer and the sanitizer runtimes
seconds=60
if [[ "${1:-}" == "--seeds" ]]; then seeds=1; else seeds=0; seconds="${1:-60}"; fi
cmake -S fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  > build-fuzz.configure.log 2>&1 || { cat build-fuzz.configure.log >&2; exit 1; }
cmake --build build-fuzz -j 2 >/dev/null
if ((seeds)); then build-fuzz/make_seeds fuzz/corpus/wire; exit 0; fi

targets=(wire config watchdog)
pids=()
for target in "${targets[@]}"; do
  work="build-fuzz/corpus-$target"
  mkdir -p "$work"
  # The repo's seeds plus whatever earlier runs found; the repo corpus is never written.
  (cd build-fuzz && exec "./${target}_fuzz" "corpus-$target" "../fuzz/corpus/$target" \
     -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
     -exact_artifact_path="$target.found" > "fuzz-$target.log" 2>&1) &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  target=${targets[$i]}
  rc=0
  wait "${pids[$i]}" || rc=$?
  if ((rc == 70)) && grep -q 'libFuzzer: timeout' "build-fuzz/fuzz-$target.log" \
      && (cd build-fuzz && timeout 60 "./${target}_fuzz" -timeout=10 "$target.found") \
         > "build-fuzz/fuzz-$target.rerun.log" 2>&1; then
    echo "fuzz.sh: ${target}_fuzz: an input passed the 10 s limit while fuzzing, but alone it" \
         "ran within it (build-fuzz/fuzz-$target.rerun.log): the fuzzer waited for the CPU," \
         "not a slow input; the fuzzing of this target stopped there" >&2
  elif ((rc != 0)); then
    status=1
    echo "fuzz.sh: ${target}_fuzz FAILED; log: build-fuzz/fuzz-$target.log" >&2
    tail -40 "build-fuzz/fuzz-$target.log" >&2
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "build-fuzz/fuzz-$target.log")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "build-fuzz/fuzz-$target.log")
  echo "fuzz.sh: ${target}_fuzz ${seconds} s: ${runs:-?} executions, ${speed:-?}/s" >&2
done
exit $status
