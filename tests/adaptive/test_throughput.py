"""The online throughput fit (horovod_cpp/adaptive/throughput.py) on step times generated from
known parameters: it must predict the step times it saw and the ones it did not."""
import math
import random

import pytest

from horovod_cpp.adaptive.goodput import PerfParams, compute_time, step_time
from horovod_cpp.adaptive.throughput import Profile

TRUE = PerfParams(alpha_c=0.02, beta_c=0.001, alpha_n=0.08, beta_n=0.01, alpha_r=0.03,
                  beta_r=0.005, gamma=2.0)


def measured(profile, configs, noise=0.0, rng=None, repeats=3):
    for hosts, ranks, atomic, accum in configs:
        for _ in range(repeats):
            jitter = 1 + (rng.uniform(-noise, noise) if noise else 0)
            profile.record(hosts, ranks, atomic, accum,
                           step_time(TRUE, hosts, ranks, atomic, accum) * jitter,
                           compute_time(TRUE, atomic) * jitter)


def test_compute_is_exact_and_step_times_are_reproduced():
    profile = Profile()
    seen = [(1, 1, 32, 0), (1, 1, 64, 0), (1, 2, 32, 0), (1, 2, 64, 1), (1, 3, 48, 0),
            (1, 4, 32, 0), (2, 4, 32, 0), (2, 4, 64, 0), (2, 6, 16, 2)]
    measured(profile, seen)
    fit = profile.fit()
    assert fit.alpha_c == pytest.approx(TRUE.alpha_c, rel=1e-6)
    assert fit.beta_c == pytest.approx(TRUE.beta_c, rel=1e-6)
    for config in seen + [(1, 8, 128, 0), (4, 8, 32, 1), (1, 2, 200, 3)]:
        assert step_time(fit, *config) == pytest.approx(step_time(TRUE, *config), rel=0.05), \
            config


def test_noisy_measurements_still_predict_within_ten_percent():
    rng = random.Random(1)
    profile = Profile()
    configs = [(1, r, b, 0) for r in (1, 2, 3, 4) for b in (16, 32, 64)] + \
        [(2, r, b, 0) for r in (2, 4, 6) for b in (16, 64)]
    measured(profile, configs, noise=0.05, rng=rng, repeats=10)
    fit = profile.fit()
    for config in configs:
        assert step_time(fit, *config) == pytest.approx(step_time(TRUE, *config), rel=0.10)


def test_what_was_never_seen_is_optimistic():
    profile = Profile()
    measured(profile, [(1, 1, 32, 0)])                  # one rank, one micro-batch size
    fit = profile.fit()
    # Compute split half and half; no network cost anywhere yet; gamma 1.
    assert fit.alpha_c == pytest.approx(compute_time(TRUE, 32) / 2)
    assert fit.beta_c * 32 == pytest.approx(compute_time(TRUE, 32) / 2)
    assert step_time(fit, 2, 8, 32, 0) == pytest.approx(compute_time(TRUE, 32), rel=1e-4)
    # Two ranks on one host seen: the cross-host terms stay at their floor, no growth in ranks.
    measured(profile, [(1, 2, 32, 0)])
    fit = profile.fit()
    assert fit.alpha_n < 1e-6 and fit.beta_n < 1e-6 and fit.beta_r < 1e-6
    assert step_time(fit, 1, 2, 32, 0) == pytest.approx(step_time(TRUE, 1, 2, 32, 0), rel=0.02)


def test_bad_measurements_are_ignored_and_the_state_round_trips():
    profile = Profile()
    assert profile.fit() is None
    assert not profile.record(1, 2, 32, 0, math.nan, 0.01)
    assert not profile.record(1, 2, 32, 0, 0.05, 0.0)
    assert len(profile) == 0
    measured(profile, [(1, 2, 32, 0), (1, 2, 64, 0)])
    copy = Profile()
    copy.load_state_dict(profile.state_dict())
    assert copy.observations() == profile.observations()
    assert copy.fit() == profile.fit()
