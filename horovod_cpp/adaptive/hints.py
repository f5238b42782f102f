"""Goodput hints: what an adaptive job tells a cluster scheduler about itself, and the speedup
function the scheduler makes of them (AdaptDL's "sched hints"). Plain Python, no Ray import: the
training side publishes to whatever sink its launcher installed (``set_sink``; the Ray
scheduler's workers send them to the scheduler actor), the scheduler side builds the policy's
``speedup(hosts, replicas)`` from them.

A hints dict has

    perf_params            the fitted step-time model (PerfParams' 7 numbers), or None
    grad_params            (sqr, var) of the noise scale at B0, or None
    init_batch_size        B0
    max_batch_size         the loader's autoscale limit (None: the batch stays B0)
    local_bsz_bounds       (min, max) micro-batch per rank, either None
    gradient_accumulation  whether micro-batches may accumulate
    max_profiled_replicas  the most ranks the job has measured a step at
    resize_pauses          seconds each in-process resize stopped training (the latest ones)
    progress               steps at B0 the training so far is worth
"""
import math
import sys

from horovod_cpp.adaptive.goodput import GoodputModel

_sink = None


def set_sink(fn):
    """Where ``publish`` sends hints (None: nowhere)."""
    global _sink
    _sink = fn


def active():
    return _sink is not None


def publish(hints):
    """Sends ``hints`` to the installed sink; a sink that fails is reported once and dropped (a
    scheduler that went away must not stop the training)."""
    global _sink
    sink = _sink
    if sink is None:
        return
    try:
        sink(hints)
    except Exception as e:  # noqa: BLE001 (any failure of the transport)
        print("horovod_cpp adaptive: sending goodput hints failed (%s: %s); no more will be "
              "sent" % (type(e).__name__, e), file=sys.stderr, flush=True)
        _sink = None


def replica_cap(hints, max_replicas):
    """The most replicas the scheduler should give a job: twice what it has measured (AdaptDL's
    rule: the model extrapolates only so far), at least 1, at most ``max_replicas``."""
    profiled = int((hints or {}).get("max_profiled_replicas") or 0)
    return max(1, min(int(max_replicas), max(2 * profiled, 1)))


class HintedSpeedup(object):
    """``speedup(hosts, replicas)`` of a job from its hints: its best goodput there (over the
    batch configurations its loader allows) divided by the goodput at a fair share
    (``fair_hosts``, ``fair_replicas``); 0 at 0 replicas. Without a model yet (no perf or grad
    params) every size >= 1 has speedup 1, so the job gets its minimum until it has measured
    itself. Memoised."""

    def __init__(self, hints, fair_hosts, fair_replicas):
        hints = hints or {}
        self.model = None
        perf, grad = hints.get("perf_params"), hints.get("grad_params")
        if perf is not None and grad is not None and hints.get("init_batch_size"):
            self.model = GoodputModel(perf, grad, hints["init_batch_size"])
        self.max_batch_size = hints.get("max_batch_size")
        self.bounds = tuple(hints.get("local_bsz_bounds") or (None, None))
        self.accumulation = bool(hints.get("gradient_accumulation"))
        self._cache = {}
        self.base = None
        if self.model is not None:
            self.base = self._goodput(fair_hosts, fair_replicas) or self._goodput(1, 1)
            if not self.base or not self.base > 0:
                self.model = None

    def _goodput(self, hosts, replicas):
        key = (hosts, replicas)
        if key not in self._cache:
            best = self.model.optimize(hosts, replicas, self.max_batch_size, self.bounds,
                                       self.accumulation) if replicas > 0 else None
            self._cache[key] = best.goodput if best is not None else 0.0
        return self._cache[key]

    def __call__(self, hosts, replicas):
        if replicas <= 0:
            return 0.0
        if self.model is None:
            return 1.0
        value = self._goodput(max(1, hosts), replicas) / self.base
        return value if math.isfinite(value) else 0.0
