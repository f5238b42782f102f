"""Compares the rounds of examples/bench/vs_horovod.py: horovod_cpp against Horovod 0.28.1.

    python3 examples/bench/compare_horovod.py RESULTS_DIR

RESULTS_DIR holds <impl>.<round>.jsonl files. For each workload: the median over rounds of each
implementation's figure, the range over rounds, and the ratio (> 1: horovod_cpp is faster),
printed as FIGURE lines like the other benchmarks', then the median ratio. Exits 1 when the
two implementations' results disagree (the check values of a workload differ).
"""
import collections
import glob
import json
import os
import statistics
import sys

TARGET_EACH = 1.0
TARGET_MEDIAN = 1.5


def load(directory):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))  # id -> impl -> rows
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                runs[row["id"]][row["impl"]].append(row)
    return runs


def agree(a, b):
    return abs(a - b) <= 1e-4 * max(1.0, abs(a), abs(b))


def main():
    runs = load(sys.argv[1])
    ratios, ok = [], True
    for wid in sorted(runs, key=lambda w: int(w[1:])):
        ours, theirs = runs[wid].get("horovod_cpp", []), runs[wid].get("horovod", [])
        if not ours or not theirs:
            continue
        first = ours[0]
        mine = statistics.median(r["value"] for r in ours)
        base = statistics.median(r["value"] for r in theirs)
        ratio = mine / base if first["better"] == "higher" else base / mine
        ratios.append(ratio)
        checks = [r["check"] for r in ours + theirs]
        same = all(agree(c, checks[0]) for c in checks)
        ok = ok and same
        print("FIGURE %s name=%s value=%.4g unit=%s range=%.4g..%.4g baseline=horovod_0.28.1 "
              "base_value=%.4g base_range=%.4g..%.4g ratio=%.3f rounds=%d results_agree=%s "
              "target=>=%.1f met=%s"
              % (wid, first["workload"].replace(" ", "_"), mine, first["unit"].replace(" ", ""),
                 min(r["value"] for r in ours), max(r["value"] for r in ours), base,
                 min(r["value"] for r in theirs), max(r["value"] for r in theirs), ratio,
                 len(ours), "yes" if same else "NO", TARGET_EACH,
                 "yes" if ratio >= TARGET_EACH else "no"))
        if not same:
            print("compare_horovod: %s: results differ: %s" % (wid, checks), file=sys.stderr)
    if ratios:
        med = statistics.median(ratios)
        print("FIGURE H0 name=median_ratio_vs_horovod ratio=%.3f min_ratio=%.3f workloads=%d "
              "target=>=%.1f met=%s" % (med, min(ratios), len(ratios), TARGET_MEDIAN,
                                         "yes" if med >= TARGET_MEDIAN else "no"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
