"""FIGURE lines A1 and A2 from the autotuner's own logs (bench.sh).

    python3 examples/bench/autotune_summary.py [--steps-per-sample N] WORKLOAD=LOG [...]

Each LOG is HOROVOD_AUTOTUNE_LOG of one job of examples/bench/autotune_bench.py run with
HOROVOD_AUTOTUNE=1 and HOROVOD_AUTOTUNE_COMPARE (bench.sh): warm-up and search samples, then,
once the tuner has settled, samples that alternate between its values ("tuned") and static
settings ("compare": the defaults between each two of a grid of static settings). Everything
is compared within that one job, side by side, so that the machine's drift between jobs (up to
39 % here) does not enter. A sample's score is bytes reduced per second, for these loops (the
same gradients every step) proportional to steps per second: a step-time ratio is the inverse
score ratio.

  FIGURE A1 ... every static setting's samples against the tuned samples just before and after
          each (the median of those ratios). The grid search's best setting is picked on each
          setting's earlier half of samples and measured on its later half (picked and scored
          on the same samples, the best of 16 noisy figures overstates itself: that figure is
          printed too, in_sample_ratio): ratio = best static step time / tuned step time,
          target >= 0.95 (within 5 %), and the search ended within 200 steps (settled_step).
          tuned= is the values the job ended on (a re-tune may have changed them).
  FIGURE A2 ... every window of 50 tuned steps against the defaults' samples interleaved in the
          same span: ratio = the defaults' mean step time / the tuned mean step time, the
          worst window's; target >= 0.98 (never more than 2 % worse). Beside it, the same
          statistic where no difference exists (noise_floor_*: in each window the tuned samples
          at even positions against those at odd ones): what the machine's noise alone gives.
"""
import argparse
import csv
import statistics

WINDOW_STEPS = 50
WITHIN_STEPS = 200


def read_log(path):
    """(samples, settled_at): samples as dicts (phase, knobs tuple, score) in order, and the
    index of the first sample after the search ended (None if it never did)."""
    samples, settled_at = [], None
    with open(path) as f:
        for line in f:
            if line.startswith("# best:") and settled_at is None:
                settled_at = len(samples)
            if not line[:1].isdigit():
                continue
            r = next(csv.reader([line]))
            samples.append({"phase": r[1], "knobs": tuple(r[2:7]), "score": float(r[7])})
    return samples, settled_at


def describe(knobs):
    fusion, chunk = int(knobs[0]), int(knobs[1])
    return "chunk=%dKiB,fusion=%dMiB,cycle=%sms,cache=%s" % (chunk >> 10, fusion >> 20,
                                                             knobs[2], knobs[3])


def summarize(workload, path, steps_per_sample):
    samples, settled_at = read_log(path)
    if settled_at is None or not samples:
        print("FIGURE A1 name=autotune_vs_best_static_%s ratio=n/a target=>=0.95 met=no "
              "(the search did not end)" % workload)
        print("FIGURE A2 name=autotune_vs_defaults_%s ratio=n/a target=>=0.98 met=no "
              "(the search did not end)" % workload)
        return
    defaults = samples[0]["knobs"]  # the first warm-up sample runs the starting values
    settled_step = settled_at * steps_per_sample
    after = samples[settled_at:]
    # A1: each compare sample against the mean of the tuned samples on either side of it.
    ratios = {}
    for i, s in enumerate(after):
        if s["phase"] != "compare":
            continue
        near = [after[j]["score"] for j in (i - 1, i + 1)
                if 0 <= j < len(after) and after[j]["phase"] == "tuned"]
        if near:
            ratios.setdefault(s["knobs"], []).append(s["score"] / statistics.mean(near))
    tuned_knobs = [s["knobs"] for s in after if s["phase"] == "tuned"]
    if ratios:
        relative = {k: statistics.median(v) for k, v in ratios.items()}
        # The grid search's pick, measured apart from the samples that picked it: the best
        # setting by its earlier half of rounds, scored on its later half. The best of 16
        # noisy medians, scored on the samples that made it the best, is biased upwards (by
        # ~1.5 standard errors here), a winner's curse the tuner's figure would pay for.
        in_sample = max(relative, key=relative.get)
        best, ratio = in_sample, 1.0 / relative[in_sample]  # too few samples to split
        halves = {k: (v[:len(v) // 2], v[len(v) // 2:]) for k, v in ratios.items()
                  if len(v) >= 2}
        if halves:
            best = max(halves, key=lambda k: statistics.median(halves[k][0]))
            ratio = 1.0 / statistics.median(halves[best][1])
        met = ratio >= 0.95 and settled_step <= WITHIN_STEPS
        print("FIGURE A1 name=autotune_vs_best_static_%s settled_step=%d tuned=[%s] "
              "baseline=best_static(%s) static_settings=%d samples_each=%d ratio=%.3f "
              "target=>=0.95 met=%s in_sample_best=(%s) in_sample_ratio=%.3f"
              % (workload, settled_step, describe(tuned_knobs[-1]) if tuned_knobs else "?",
                 describe(best), len(relative), min(len(v) for v in ratios.values()), ratio,
                 "yes" if met else "no", describe(in_sample), 1.0 / relative[in_sample]))
        print("# %s: static setting / tuned, steps per second (median of paired samples): %s"
              % (workload, "  ".join("%s %.3f" % (describe(k), v)
                                     for k, v in sorted(relative.items(),
                                                        key=lambda kv: -kv[1]))))
    # A2: windows of WINDOW_STEPS tuned steps, each against the defaults' samples in its span.
    # The noise floor of that figure, from the same samples: in each window the tuned samples
    # at even positions against those at odd ones (the same values against themselves, half
    # the samples a side: if anything noisier than the figure it bounds).
    per_window = max(1, WINDOW_STEPS // steps_per_sample)
    tuned_at = [i for i, s in enumerate(after) if s["phase"] == "tuned"]
    windows, same = [], []
    for w in range(0, len(tuned_at) - per_window + 1):
        first, last = tuned_at[w], tuned_at[w + per_window - 1]
        base = [1.0 / after[i]["score"] for i in range(first, last + 1)
                if after[i]["phase"] == "compare" and after[i]["knobs"] == defaults]
        if not base:
            continue
        times = [1.0 / after[i]["score"] for i in tuned_at[w:w + per_window]]
        windows.append(statistics.mean(base) / statistics.mean(times))
        if len(times) >= 2:
            same.append(statistics.mean(times[1::2]) / statistics.mean(times[0::2]))
    if not windows:
        print("FIGURE A2 name=autotune_vs_defaults_%s ratio=n/a target=>=0.98 met=no (no "
              "window of %d tuned steps with the defaults beside it)" % (workload, WINDOW_STEPS))
        return
    worst = min(windows)
    print("FIGURE A2 name=autotune_vs_defaults_%s settled_step=%d "
          "windows=%d median_window=%.3f p5_window=%.3f best_window=%.3f ratio=%.3f "
          "target=>=0.98 met=%s noise_floor_worst=%.3f noise_floor_p5=%.3f "
          "worst_within_noise_floor=%s"
          % (workload, settled_step, len(windows), statistics.median(windows),
             percentile(windows, 5), max(windows), worst, "yes" if worst >= 0.98 else "no",
             min(same) if same else float("nan"),
             percentile(same, 5) if same else float("nan"),
             "yes" if same and worst >= min(same) else "no"))


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, len(ordered) * p // 100)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", metavar="WORKLOAD=LOG")
    parser.add_argument("--steps-per-sample", type=int, default=5)
    args = parser.parse_args()
    for item in args.logs:
        workload, path = item.split("=", 1)
        summarize(workload, path, args.steps_per_sample)


if __name__ == "__main__":
    main()
