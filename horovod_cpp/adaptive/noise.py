"""The gradient noise scale, from the two squared norms the core measures while it reduces a
step's gradients: each rank's local gradient (before the reduction) and the reduced, averaged
one. Plain Python.

With ``n`` independent gradients of ``b`` samples each (ranks x micro-batches) averaged into a
step of ``B = n * b`` samples, and the per-sample gradients' mean G and covariance Sigma:

    E |g_i|^2 = |G|^2 + tr(Sigma) / b        (one rank's micro-batch gradient)
    E |g|^2   = |G|^2 + tr(Sigma) / B        (the averaged gradient)

so the unbiased estimates are

    |G|^2     = (B |g|^2 - b mean|g_i|^2) / (B - b)
    tr(Sigma) = (mean|g_i|^2 - |g|^2) / (1/b - 1/B)

and the noise scale is phi = tr(Sigma) / |G|^2 samples (McCandlish et al.'s B_simple; Pollux's
B0 * var / sqr with var = tr(Sigma) / B0). Both estimates are averaged over steps with weights
that decay by the samples seen (the horizon is counted in samples, so a bigger batch does not
shorten the memory), and bias-corrected as Adam's moments are. Single estimates are noisy and
may be negative; only the averages are used.
"""
import math


def unbiased_norms(local_sqr, global_sqr, local_bsz, global_bsz):
    """(|G|^2, tr(Sigma)) estimated from one step: ``local_sqr`` the mean over the n local
    gradients of their squared norms, ``global_sqr`` the averaged gradient's, ``local_bsz`` b,
    ``global_bsz`` B = n * b > b."""
    if global_bsz <= local_bsz:
        raise ValueError("the estimate needs at least two gradients in a step (B = %r, b = %r)"
                         % (global_bsz, local_bsz))
    sqr = (global_bsz * global_sqr - local_bsz * local_sqr) / (global_bsz - local_bsz)
    var = (local_sqr - global_sqr) / (1.0 / local_bsz - 1.0 / global_bsz)
    return sqr, var


class NoiseScale(object):
    """Running estimates of |G|^2 and tr(Sigma), weighted over the last ``horizon`` samples."""

    def __init__(self, horizon_samples):
        if horizon_samples <= 0:
            raise ValueError("horizon_samples must be positive, got %r" % (horizon_samples,))
        self.horizon = float(horizon_samples)
        self._sqr = 0.0          # decayed sums of the estimates
        self._var = 0.0
        self._weight = 0.0       # decayed sum of the weights (the bias correction)
        self.samples = 0         # samples seen by update()

    def update(self, local_sqr, global_sqr, local_bsz, global_bsz):
        """Adds one step's measurement. Non-finite norms (an AMP step that overflowed) are
        skipped; the caller divides a loss scale out of the norms first."""
        if not (math.isfinite(local_sqr) and math.isfinite(global_sqr)):
            return False
        sqr, var = unbiased_norms(local_sqr, global_sqr, local_bsz, global_bsz)
        decay = math.exp(-global_bsz / self.horizon)
        self._sqr = decay * self._sqr + (1 - decay) * sqr
        self._var = decay * self._var + (1 - decay) * var
        self._weight = decay * self._weight + (1 - decay)
        self.samples += global_bsz
        return True

    @property
    def ready(self):
        return self._weight > 0

    @property
    def sqr(self):
        """The averaged estimate of |G|^2 (None before the first step)."""
        return self._sqr / self._weight if self._weight > 0 else None

    @property
    def var(self):
        """The averaged estimate of tr(Sigma) (None before the first step)."""
        return self._var / self._weight if self._weight > 0 else None

    def noise_scale(self):
        """phi = tr(Sigma) / |G|^2 in samples; None before the first step, inf while the
        averaged |G|^2 is not positive."""
        if not self.ready:
            return None
        sqr, var = self.sqr, self.var
        if sqr <= 0:
            return math.inf
        return max(var, 0.0) / sqr

    def grad_params(self, init_batch_size):
        """(sqr, var) as the goodput model takes them: var at the initial batch size."""
        if not self.ready:
            return None
        return max(self.sqr, 0.0), max(self.var, 0.0) / init_batch_size

    def state_dict(self):
        """Plain floats and ints: loads with torch.load(weights_only=True)."""
        return {"horizon": self.horizon, "sqr": self._sqr, "var": self._var,
                "weight": self._weight, "samples": self.samples}

    def load_state_dict(self, state):
        self.horizon = float(state["horizon"])
        self._sqr, self._var = float(state["sqr"]), float(state["var"])
        self._weight, self.samples = float(state["weight"]), int(state["samples"])
