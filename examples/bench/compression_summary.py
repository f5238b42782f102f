"""Turns bench.sh's compression runs on the test bed into FIGURE lines and a table (reads
SCALING lines of examples/bench/scaling.py, tagged "LAYOUT RATE" by bench.sh, from stdin).

    ... | python3 examples/bench/compression_summary.py

Each SCALING line is one configuration in one round of a job: np, model, compression, samples/s,
median step time and the bytes the hosts' links carried per step (measured). The configurations
of a job run interleaved, round after round, so a ratio is taken within a round (the same
minutes of this noisy machine) and reported as its median and range over the rounds. Per model,
link rate and layout (1x1: one rank on one host; 2x1: 2 hosts x 1 rank; 2x2: 2 hosts x 2 ranks)
and per compressor:

  FIGURE C1 ... the step time against uncompressed (ratio = uncompressed step / this step: > 1
          is faster; target at 10 Gbit/s: >= 0.95 in every round, i.e. no penalty) and the
          bytes on the wire per step with the compression rate against uncompressed;
  FIGURE C2 ... (2x1 only) the 1 -> 2 hosts scaling efficiency, samples/s on 2 hosts / 2 x
          samples/s of one rank on one host (uncompressed; round k of one job against round k
          of the other; where several one-host jobs ran, round k's mean over them: bench.sh
          runs one before and one after the two-host jobs, as this machine's speed drifts by
          tens of percent over minutes); target for PowerSGD at 1 Gbit/s: >= 0.9. Also, as ceiling_ratio, the
          same against the lockstep baseline of the same round (what two hosts of this machine
          reach when they exchange no gradients: see scaling.py).

A model is named with its per-rank batch (mlp_batch32): the larger the batch, the more compute
per byte sent. The table at the end gives each configuration's median step time.
"""
import statistics
import sys


def spread(values, fmt="%.3f"):
    """'median [min-max]' of values."""
    return "%s [%s-%s]" % (fmt % statistics.median(values), fmt % min(values), fmt % max(values))


def main():
    runs = {}  # (model, rate, layout, compression) -> {round: kv}
    for line in sys.stdin:
        parts = line.split()
        if len(parts) < 3 or parts[2] != "SCALING":
            continue
        layout, rate = parts[0], parts[1]
        kv = dict(p.split("=", 1) for p in parts[3:])
        model = "%s_batch%s" % (kv["model"], kv.get("batch", "?"))
        rounds = runs.setdefault((model, rate, layout, kv["compression"]), {})
        round_ = int(kv.get("round", 1))
        if layout == "1x1" and round_ in rounds:
            # Another one-host job (bench.sh runs one before and one after the two-host jobs):
            # round k's reference is the mean of their round k.
            before = rounds[round_]
            jobs = before.get("jobs", 1)
            kv["samples_per_s"] = str((float(before["samples_per_s"]) * jobs +
                                       float(kv["samples_per_s"])) / (jobs + 1))
            kv["jobs"] = jobs + 1
        rounds[round_] = kv
    table = []
    for (model, rate, layout, comp), rounds in sorted(runs.items()):
        if layout == "1x1" or comp == "lockstep":
            continue
        base = runs.get((model, rate, layout, "none"), {})
        common = sorted(set(rounds) & set(base))
        if not common:
            continue
        steps = [float(rounds[k]["step_p50_ms"]) for k in common]
        ratios = [float(base[k]["step_p50_ms"]) / float(rounds[k]["step_p50_ms"]) for k in common]
        wire = [rounds[k]["wire_bytes_per_step"] for k in common]
        base_wire = [base[k]["wire_bytes_per_step"] for k in common]
        measured = [(float(b), float(w)) for b, w in zip(base_wire, wire)
                    if w not in ("n/a", "0") and b not in ("n/a", "0")]
        rate_x = statistics.median(b / w for b, w in measured) if measured else 0.0
        wire_med = statistics.median(w for _, w in measured) if measured else 0.0
        fast = rate == "10gbit"
        decisions = sorted({rounds[k].get("powersgd_decision") for k in common} - {None})
        print("FIGURE C1 name=compression_%s_%s_%s_%s p50_ms=%s baseline=uncompressed "
              "ratio=%s rounds=%d wire_bytes_per_step=%.0f wire_compression=%.1fx%s target=%s "
              "met=%s"
              % (model, layout, rate, comp, spread(steps, "%.2f").replace(" ", ""),
                 spread(ratios).replace(" ", ""), len(common), wire_med, rate_x,
                 " powersgd_decision=" + ",".join(decisions) if decisions else "",
                 ">=0.95" if fast else "none",
                 ("yes" if min(ratios) >= 0.95 else "no") if fast else "n/a"))
        row = [model, rate, layout, comp, statistics.median(steps), min(steps), max(steps),
               wire_med, None, None]
        one = runs.get((model, rate, "1x1", "none"), {})
        lockstep = runs.get((model, rate, layout, "lockstep"), {})
        paired = sorted(set(rounds) & set(one))
        if layout == "2x1" and paired:
            effs = [float(rounds[k]["samples_per_s"]) / (2 * float(one[k]["samples_per_s"]))
                    for k in paired]
            ceiling = sorted(set(rounds) & set(lockstep))
            ceil = [float(rounds[k]["samples_per_s"]) / float(lockstep[k]["samples_per_s"])
                    for k in ceiling]
            lock_eff = [float(lockstep[k]["samples_per_s"]) / (2 * float(one[k]["samples_per_s"]))
                        for k in sorted(set(lockstep) & set(one))]
            target = comp.startswith("powersgd") and rate == "1gbit"
            print("FIGURE C2 name=scaling_1_to_2_hosts_%s_%s_%s baseline=1_host ratio=%s "
                  "rounds=%d lockstep_ratio=%s ceiling_ratio=%s target=%s met=%s"
                  % (model, rate, comp, spread(effs).replace(" ", ""), len(paired),
                     spread(lock_eff).replace(" ", "") if lock_eff else "n/a",
                     spread(ceil).replace(" ", "") if ceil else "n/a",
                     ">=0.9" if target else "none",
                     ("yes" if min(effs) >= 0.9 else "no") if target else "n/a"))
            row[8], row[9] = effs, ceil
        table.append(row)
    if table:
        print("# step p50 ms, median [range] over rounds; eff = 1 -> 2 hosts scaling efficiency; "
              "ceil = against lockstep")
        print("# %-14s %-6s %-6s %-19s %-22s %-12s %-22s %s"
              % ("model", "link", "layout", "compression", "step ms", "wire B/step", "eff",
                 "ceil"))
        for model, rate, layout, comp, med, lo, hi, wire, effs, ceil in table:
            print("# %-14s %-6s %-6s %-19s %-22s %-12.0f %-22s %s"
                  % (model, rate, layout, comp, "%.1f [%.1f-%.1f]" % (med, lo, hi), wire,
                     spread(effs) if effs else "", spread(ceil) if ceil else ""))


if __name__ == "__main__":
    main()
