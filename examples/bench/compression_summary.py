"""Turns bench.sh's compression runs on the test bed into FIGURE lines (reads SCALING lines,
tagged "LAYOUT RATE" by bench.sh, from stdin).

    ... | python3 examples/bench/compression_summary.py

Each SCALING line is one job of examples/bench/scaling.py: np, model, compression, samples/s,
median step time and the bytes the hosts' links carried per step (measured). Per model, link
rate and layout (2x1: 2 hosts x 1 rank, 2x2: 2 hosts x 2 ranks) and per compressor it prints

  FIGURE C1 ... the step time against uncompressed in the same layout (ratio = uncompressed
          step / this step: > 1 is faster; target at 10 Gbit/s: >= 0.95, no penalty) and the
          bytes on the wire per step with the compression rate against uncompressed;
  FIGURE C2 ... (2x1 only) the 1 -> 2 hosts scaling efficiency (samples/s on 2 hosts / 2 x
          samples/s of one rank on one host, uncompressed); target for PowerSGD at 1 Gbit/s:
          >= 0.9.

A model is named with its per-rank batch (mlp_batch32): the larger the batch, the more compute
per byte sent.
"""
import sys


def main():
    runs = {}
    for line in sys.stdin:
        parts = line.split()
        if len(parts) < 3 or parts[2] != "SCALING":
            continue
        layout, rate = parts[0], parts[1]
        kv = dict(p.split("=", 1) for p in parts[3:])
        model = "%s_batch%s" % (kv["model"], kv.get("batch", "?"))
        runs[(model, rate, layout, kv["compression"])] = kv
    for (model, rate, layout, comp), kv in sorted(runs.items()):
        if layout == "1x1":
            continue
        base = runs.get((model, rate, layout, "none"))
        if base is None:
            continue
        step, base_step = float(kv["step_p50_ms"]), float(base["step_p50_ms"])
        wire, base_wire = kv["wire_bytes_per_step"], base["wire_bytes_per_step"]
        ratio = base_step / step
        fast = rate == "10gbit"
        rate_x = (float(base_wire) / float(wire)) if wire not in ("n/a", "0") else 0.0
        print("FIGURE C1 name=compression_%s_%s_%s_%s p50_ms=%.2f baseline=uncompressed "
              "base_p50_ms=%.2f ratio=%.3f wire_bytes_per_step=%s base_wire_bytes_per_step=%s "
              "wire_compression=%.1fx target=%s met=%s"
              % (model, layout, rate, comp, step, base_step, ratio, wire, base_wire, rate_x,
                 ">=0.95" if fast else "none",
                 ("yes" if ratio >= 0.95 else "no") if fast else "n/a"))
        one = runs.get((model, rate, "1x1", "none"))
        if layout == "2x1" and one is not None:
            eff = float(kv["samples_per_s"]) / (2 * float(one["samples_per_s"]))
            target = comp == "powersgd" and rate == "1gbit"
            print("FIGURE C2 name=scaling_1_to_2_hosts_%s_%s_%s p50_ms=%.2f baseline=1_host "
                  "base_p50_ms=%s ratio=%.3f target=%s met=%s"
                  % (model, rate, comp, step, one["step_p50_ms"], eff,
                     ">=0.9" if target else "none",
                     ("yes" if eff >= 0.9 else "no") if target else "n/a"))


if __name__ == "__main__":
    main()
