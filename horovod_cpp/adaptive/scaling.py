"""Learning-rate scaling rules of adaptive training: by how much a step at a global batch of
``scale`` times the initial batch size multiplies the learning rate, and how much progress (in
steps at the initial batch size) it makes. Plain Python; the optimizer side applies the factor
inside ``step()`` only, so a user's schedulers keep seeing their base rate.

* AdaScale (Johnson et al., 2020; the default for SGD): gain r = (var + sqr) / (var / S + sqr),
  between 1 and S: the learning rate times r, and the step counts as r steps. With no noise
  measured yet, r = 1.
* AdamScale (for Adam and AdamW): the same gain from the preconditioned gradient's statistics,
  taken to the power 1/2 for the learning rate, as AdaptDL's AdamScale does (a square-root rule
  is the usual one for Adam, whose update is normalised by its second moment); progress counts
  the full gain.
* LinearScale: S (Goyal et al.), SqrtScale: sqrt(S) (Krizhevsky), both counting S steps of
  progress.
* LEGWScale: sqrt(S) after a warm-up that grows linearly over ``base_warmup_epochs * S``
  epochs (You et al., 2019).
"""
import math


def adascale_gain(sqr, var, scale):
    """r = (var + sqr) / (var / S + sqr), var the noise at the initial batch size; 1 where
    nothing is measured yet (sqr and var None) and S where the gradient is all noise."""
    if sqr is None or var is None:
        return 1.0
    sqr, var = max(sqr, 0.0), max(var, 0.0)
    denominator = var / scale + sqr
    if denominator <= 0:
        return 1.0
    return (var + sqr) / denominator


class ScalingRule(object):
    """lr_factor(scale, grad) and progress(scale, grad): grad is (sqr, var) or None."""

    def lr_factor(self, scale, grad=None):
        raise NotImplementedError

    def progress(self, scale, grad=None):
        """Steps at the initial batch size one step at this scale is worth."""
        return scale


class AdaScale(ScalingRule):
    def lr_factor(self, scale, grad=None):
        return adascale_gain(*(grad or (None, None)), scale=scale)

    def progress(self, scale, grad=None):
        return self.lr_factor(scale, grad)


class AdamScale(AdaScale):
    def lr_factor(self, scale, grad=None):
        return math.sqrt(adascale_gain(*(grad or (None, None)), scale=scale))

    def progress(self, scale, grad=None):
        return adascale_gain(*(grad or (None, None)), scale=scale)


class LinearScale(ScalingRule):
    def lr_factor(self, scale, grad=None):
        return float(scale)


class SqrtScale(ScalingRule):
    def lr_factor(self, scale, grad=None):
        return math.sqrt(scale)


class LEGWScale(ScalingRule):
    """sqrt(S), reached by a linear warm-up over base_warmup_epochs * S epochs of data;
    ``epoch_progress`` is how many epochs (fractional) the job has trained."""

    def __init__(self, base_warmup_epochs, data_size):
        self.base_warmup_epochs = float(base_warmup_epochs)
        self.data_size = int(data_size)
        self.epoch_progress = 0.0

    def lr_factor(self, scale, grad=None):
        warmup = self.base_warmup_epochs * scale
        ramp = 1.0 if warmup <= 0 else min(1.0, self.epoch_progress / warmup)
        return math.sqrt(scale) * ramp
