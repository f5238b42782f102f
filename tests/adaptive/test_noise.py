"""The noise-scale estimator (horovod_cpp/adaptive/noise.py) on gradients with known statistics.
One process, no MPI, no torch."""
import math
import random

import pytest

from horovod_cpp.adaptive.noise import NoiseScale, unbiased_norms


def test_unbiased_norms_by_hand():
    # Two gradients of 4 samples: |g_1|^2 = 10, |g_2|^2 = 6 (mean 8), the average's 5.
    sqr, var = unbiased_norms(8.0, 5.0, 4, 8)
    assert sqr == pytest.approx((8 * 5.0 - 4 * 8.0) / 4)          # 2
    assert var == pytest.approx((8.0 - 5.0) / (1 / 4 - 1 / 8))    # 24
    with pytest.raises(ValueError, match="at least two gradients"):
        unbiased_norms(8.0, 5.0, 8, 8)


def simulate(n, b, steps, seed, dim=32):
    """Steps of n gradients, each the mean of b per-sample gradients G + N(0, diag(s^2)):
    returns the estimator and the exact tr(Sigma) / |G|^2."""
    rng = random.Random(seed)
    grad = [rng.uniform(-1, 1) for _ in range(dim)]
    sigma = [rng.uniform(0.5, 3.0) for _ in range(dim)]
    exact = sum(s * s for s in sigma) / sum(g * g for g in grad)
    est = NoiseScale(horizon_samples=1e12)           # every step weighs the same
    for _ in range(steps):
        locals_ = [[g + rng.gauss(0, s / math.sqrt(b)) for g, s in zip(grad, sigma)]
                   for _ in range(n)]
        mean = [sum(col) / n for col in zip(*locals_)]
        local_sqr = sum(sum(x * x for x in v) for v in locals_) / n
        global_sqr = sum(x * x for x in mean)
        assert est.update(local_sqr, global_sqr, b, n * b)
    return est, exact


@pytest.mark.parametrize("n", [2, 4])
def test_the_noise_scale_is_within_ten_percent_after_200_steps(n):
    for seed in range(5):
        est, exact = simulate(n, b=8, steps=200, seed=seed)
        assert est.noise_scale() == pytest.approx(exact, rel=0.10), seed


def test_the_average_forgets_by_samples_and_is_bias_corrected():
    est = NoiseScale(horizon_samples=100)
    est.update(8.0, 5.0, 4, 8)                       # sqr 2, var 24
    assert (est.sqr, est.var) == (pytest.approx(2.0), pytest.approx(24.0))  # no bias to 0
    assert est.noise_scale() == pytest.approx(12.0)
    assert est.grad_params(4) == (pytest.approx(2.0), pytest.approx(6.0))
    # A step of 100 samples (its weight 1 - e^-1) against the first (weight 1 - e^-0.08).
    est.update(3.0, 3.0, 50, 100)                    # sqr 3, var 0
    w1 = (1 - math.exp(-0.08)) * math.exp(-1.0)
    w2 = 1 - math.exp(-1.0)
    assert est.sqr == pytest.approx((w1 * 2 + w2 * 3) / (w1 + w2))
    assert est.samples == 108


def test_non_finite_steps_are_skipped_and_the_state_round_trips():
    est = NoiseScale(horizon_samples=1000)
    assert est.noise_scale() is None and est.grad_params(8) is None
    assert not est.update(math.inf, 1.0, 4, 8)
    assert not est.update(1.0, math.nan, 4, 8)
    assert not est.ready
    est.update(8.0, 5.0, 4, 8)
    copy = NoiseScale(1)
    copy.load_state_dict(est.state_dict())
    assert copy.state_dict() == est.state_dict()
    assert all(isinstance(v, (int, float)) for v in est.state_dict().values())
