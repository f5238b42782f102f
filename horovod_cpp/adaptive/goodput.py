"""The goodput model of adaptive training (Pollux, OSDI'21): how fast a job learns at a given
size and batch configuration. Plain Python (no numpy, torch, Ray or Spark), so the training
side (``horovod_cpp.torch.adaptive``) and a cluster scheduler use the same model.

    goodput(hosts, ranks, atomic_bsz, accumulation_steps)
        = throughput (samples per second) x statistical efficiency (progress per sample)

* **Step time.** A micro-batch of ``b`` samples computes in ``alpha_c + beta_c * b`` seconds.
  The gradient reduction takes ``alpha + beta * max(ranks - 2, 0)`` seconds, with one pair
  (alpha_n, beta_n) when the ranks span hosts and another (alpha_r, beta_r) within one host
  (no network at one rank). The last micro-batch's compute and the reduction overlap as a
  p-norm with exponent ``gamma`` in [1, 10] (1: one after the other; 10: nearly the max of
  the two); each of the ``accumulation_steps`` micro-batches before it computes alone.
* **Statistical efficiency** of a global batch ``B`` relative to the initial batch ``B0``:
  ``E(B) = (phi + B0) / (phi + B)``, where ``phi = B0 * var / sqr`` is the gradient noise scale
  in samples (``sqr``: the squared norm of the true gradient, ``var``: the trace of the
  per-sample gradient covariance divided by ``B0``, both as measured at batch ``B0``). A batch
  ``B`` then makes ``B * E(B) / B0`` times the progress of one step at ``B0``.

``accumulation_steps`` counts the micro-batches a rank computes *before* the one whose gradient
is reduced, as in AdaptDL: a step covers ``ranks * atomic_bsz * (accumulation_steps + 1)``
samples.
"""
import collections
import math

PerfParams = collections.namedtuple(
    "PerfParams", ["alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma"])
GradParams = collections.namedtuple("GradParams", ["sqr", "var"])

Config = collections.namedtuple(
    "Config", ["goodput", "batch_size", "atomic_bsz", "accumulation_steps"])


def compute_time(perf, atomic_bsz):
    """Seconds one micro-batch of ``atomic_bsz`` samples takes to compute on one rank."""
    return perf.alpha_c + perf.beta_c * atomic_bsz


def network_time(perf, hosts, ranks):
    """Seconds the reduction of one step's gradients takes, at ``ranks`` over ``hosts``."""
    if ranks <= 1:
        return 0.0
    if hosts > 1:
        return perf.alpha_n + perf.beta_n * max(ranks - 2, 0)
    return perf.alpha_r + perf.beta_r * max(ranks - 2, 0)


def step_time(perf, hosts, ranks, atomic_bsz, accumulation_steps):
    """Seconds of one optimizer step."""
    compute = compute_time(perf, atomic_bsz)
    network = network_time(perf, hosts, ranks)
    gamma = perf.gamma
    if network > 0:
        # The p-norm, scaled by the larger term so that gamma up to 10 cannot overflow.
        top = max(compute, network)
        overlapped = top * ((compute / top) ** gamma + (network / top) ** gamma) ** (1 / gamma)
    else:
        overlapped = compute
    return overlapped + compute * accumulation_steps


def efficiency(grad, init_batch_size, batch_size):
    """E(B) = (phi + B0) / (phi + B), phi = B0 * var / sqr; 1 where the noise is unknown (no
    measurement yet) and B0 / B where there is no noise at all."""
    if grad is None or grad.sqr <= 0:
        return 1.0 if grad is None or grad.var > 0 else init_batch_size / batch_size
    phi = init_batch_size * grad.var / grad.sqr
    return (phi + init_batch_size) / (phi + batch_size)


def noise_scale(grad, init_batch_size):
    """phi = B0 * var / sqr in samples (inf while the gradient's own norm is 0)."""
    if grad.sqr <= 0:
        return math.inf
    return init_batch_size * grad.var / grad.sqr


class GoodputModel(object):
    """Goodput as a function of the job's size and batch configuration."""

    def __init__(self, perf, grad, init_batch_size):
        self.perf = PerfParams(*perf)
        self.grad = GradParams(*grad) if grad is not None else None
        self.init_batch_size = int(init_batch_size)
        if self.init_batch_size <= 0:
            raise ValueError("init_batch_size must be positive, got %r" % (init_batch_size,))

    def throughput(self, hosts, ranks, atomic_bsz, accumulation_steps):
        """Samples per second."""
        batch = ranks * atomic_bsz * (accumulation_steps + 1)
        return batch / step_time(self.perf, hosts, ranks, atomic_bsz, accumulation_steps)

    def efficiency(self, batch_size):
        return efficiency(self.grad, self.init_batch_size, batch_size)

    def goodput(self, hosts, ranks, atomic_bsz, accumulation_steps):
        """Throughput x efficiency: samples per second, counted at the initial batch size's
        statistical worth."""
        batch = ranks * atomic_bsz * (accumulation_steps + 1)
        return self.throughput(hosts, ranks, atomic_bsz, accumulation_steps) * \
            self.efficiency(batch)

    def optimize(self, hosts, ranks, max_batch_size=None, local_bsz_bounds=None,
                 accumulation=False, current=None, hysteresis=0.05):
        """The (goodput, batch_size, atomic_bsz, accumulation_steps) that maximises goodput at
        ``ranks`` over ``hosts``, with ``B0 <= batch_size <= max_batch_size`` (default B0) and
        the per-rank micro-batch within ``local_bsz_bounds`` (min, max; None: 1 and
        max_batch_size). Without ``accumulation`` a step is one micro-batch per rank.
        ``current`` (a Config or an (atomic_bsz, accumulation_steps) pair) is kept unless the
        best beats its goodput by more than ``hysteresis``, so that noise in the model does not
        make the choice flap. None when no configuration fits the bounds.

        The search is exact and cheap: every (micro-batch size, micro-batches) pair within the
        bounds, O(M log M) of them for M = max_batch_size / ranks, except a local batch already
        reached with fewer micro-batches (the same samples in more micro-batches are always
        slower: the overlap p-norm is 1-Lipschitz, and each extra micro-batch adds alpha_c).
        tests/adaptive/test_goodput.py checks it against a brute force."""
        b0 = self.init_batch_size
        max_batch = b0 if max_batch_size is None else int(max_batch_size)
        if max_batch < b0:
            raise ValueError("max_batch_size (%d) is below the initial batch size (%d)"
                             % (max_batch, b0))
        lo, hi = local_bsz_bounds or (None, None)
        lo = max(1, int(lo or 1))
        hi = int(hi or max_batch)
        best = None
        seen = set()  # local batches already evaluated with fewer micro-batches
        accum = 0
        while ranks * lo * (accum + 1) <= max_batch:
            for atomic in range(lo, hi + 1):
                local = atomic * (accum + 1)
                batch = ranks * local
                if batch > max_batch:
                    break
                if batch < b0 or local in seen:
                    continue
                seen.add(local)
                value = self.goodput(hosts, ranks, atomic, accum)
                if best is None or value > best.goodput:
                    best = Config(value, batch, atomic, accum)
            if not accumulation:
                break
            accum += 1
        if best is None or current is None:
            return best
        atomic, accum = (current.atomic_bsz, current.accumulation_steps) \
            if isinstance(current, Config) else current
        batch = ranks * atomic * (accum + 1)
        if not (lo <= atomic <= hi and b0 <= batch <= max_batch) or \
                (accum > 0 and not accumulation):
            return best
        kept = self.goodput(hosts, ranks, atomic, accum)
        if best.goodput > kept * (1 + hysteresis):
            return best
        return Config(kept, batch, atomic, accum)
