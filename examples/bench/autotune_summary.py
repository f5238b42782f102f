"""FIGURE lines for the autotuner from examples/bench/autotune_bench.py's JSON lines.

    python3 examples/bench/autotune_summary.py RUNS.jsonl [--log LABEL=FILE ...]

The runs of one workload, told apart by their labels:
  defaults[...]      the knobs' defaults (several runs: before and after the others);
  grid:<knobs>       one static setting of the grid search (HOROVOD_FUSION_THRESHOLD and
                     HOROVOD_COLLECTIVE_CHUNK_BYTES);
  autotune[...]      HOROVOD_AUTOTUNE=1, with its log given by --log LABEL=FILE.

A step time is a median over steps (the first WARMUP steps of every run left out: allocation,
connections). Per workload:

  FIGURE A1 ... the autotuned run's median step time from step 200 on against the best static
          setting of the grid (ratio = best static / autotuned; target >= 0.95, i.e. within
          5 %);
  FIGURE A2 ... every 50-step window of the autotuned run after its search ended (from its
          log) against the defaults' median (ratio = defaults / the worst window's mean;
          target >= 0.98, i.e. never more than 2 % worse), with the best and worst window.
"""
import argparse
import collections
import json
import statistics

WARMUP = 5
WINDOW = 50
TUNED_FROM = 200


def settled_step(log_path, steps_per_sample):
    """The step at which the autotuner's (first) search ended, from its log; None if never."""
    samples = 0
    with open(log_path) as f:
        for line in f:
            if line.startswith("# best:"):
                return samples * steps_per_sample
            if line[:1].isdigit():
                samples += 1
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs")
    parser.add_argument("--log", action="append", default=[], metavar="LABEL=FILE")
    args = parser.parse_args()
    logs = dict(item.split("=", 1) for item in args.log)
    by_workload = collections.defaultdict(list)
    with open(args.runs) as f:
        for line in f:
            if line.strip():
                run = json.loads(line)
                by_workload[run["workload"]].append(run)
    for workload, runs in sorted(by_workload.items()):
        med = {r["label"]: statistics.median(r["step_ms"][WARMUP:]) for r in runs}
        grid = {k: v for k, v in med.items() if k.startswith("grid:")}
        defaults = [v for k, v in med.items() if k.startswith("defaults")]
        for run in runs:
            if not run["label"].startswith("autotune"):
                continue
            steps = run["step_ms"]
            tuned = statistics.median(steps[TUNED_FROM:]) if len(steps) > TUNED_FROM else None
            if grid and tuned:
                best_label = min(grid, key=grid.get)
                ratio = grid[best_label] / tuned
                print("FIGURE A1 name=autotune_vs_best_static_%s_%s p50_ms=%.2f "
                      "baseline=best_static(%s) base_p50_ms=%.2f grid_settings=%d ratio=%.3f "
                      "target=>=0.95 met=%s"
                      % (workload, run["label"], tuned, best_label[5:], grid[best_label],
                         len(grid), ratio, "yes" if ratio >= 0.95 else "no"))
            log = logs.get(run["label"])
            per_sample = int(run["settings"].get("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "10"))
            settled = settled_step(log, per_sample) if log else None
            if settled is None or not defaults:
                print("FIGURE A2 name=autotune_vs_defaults_%s_%s ratio=n/a target=>=0.98 "
                      "met=no (the search did not end)" % (workload, run["label"]))
                continue
            base = statistics.median(defaults)
            windows = [statistics.mean(steps[i:i + WINDOW])
                       for i in range(max(settled, WARMUP), len(steps) - WINDOW + 1)]
            if not windows:
                print("FIGURE A2 name=autotune_vs_defaults_%s_%s ratio=n/a settled_step=%d "
                      "target=>=0.98 met=no (no full window after it)"
                      % (workload, run["label"], settled))
                continue
            worst = max(windows)
            ratio = base / worst
            print("FIGURE A2 name=autotune_vs_defaults_%s_%s settled_step=%d windows=%d "
                  "worst_window_ms=%.2f best_window_ms=%.2f baseline=defaults base_p50_ms=%.2f "
                  "defaults_runs=%s ratio=%.3f target=>=0.98 met=%s"
                  % (workload, run["label"], settled, len(windows), worst, min(windows), base,
                     "/".join("%.2f" % d for d in defaults), ratio,
                     "yes" if ratio >= 0.98 else "no"))
        print("# %s: %s" % (workload, "  ".join("%s %.2f" % (k, v) for k, v in sorted(med.items()))))


if __name__ == "__main__":
    main()
