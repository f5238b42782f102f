"""The goodput model (horovod_cpp/adaptive/goodput.py) against hand-computed values and a brute
force. One process, no MPI, no torch."""
import itertools
import math
import random

import pytest

from horovod_cpp.adaptive.goodput import (Config, GoodputModel, GradParams, PerfParams,
                                          efficiency, noise_scale, step_time)

PERF = PerfParams(alpha_c=0.01, beta_c=0.002, alpha_n=0.05, beta_n=0.01, alpha_r=0.02,
                  beta_r=0.004, gamma=1.0)


def test_efficiency_by_hand():
    grad = GradParams(sqr=1.0, var=3.0)            # phi = B0 * var / sqr = 12 at B0 = 4
    assert noise_scale(grad, 4) == 12.0
    assert efficiency(grad, 4, 4) == 1.0
    assert efficiency(grad, 4, 16) == pytest.approx(16.0 / 28.0)
    # No noise: a bigger batch is worth no more than B0 samples.
    assert efficiency(GradParams(1.0, 0.0), 4, 16) == pytest.approx(0.25)
    # Nothing measured yet: every batch counts fully.
    assert efficiency(None, 4, 64) == 1.0


def test_step_time_by_hand():
    # gamma 1: compute and network one after the other; 3 micro-batches of 10 at 4 ranks on 2
    # hosts: compute 0.01 + 0.02 = 0.03 each, network 0.05 + 0.01 * 2 = 0.07.
    assert step_time(PERF, 2, 4, 10, 2) == pytest.approx(0.03 + 0.07 + 2 * 0.03)
    # One host: the intra-host pair; one rank: no network at all.
    assert step_time(PERF, 1, 4, 10, 0) == pytest.approx(0.03 + 0.02 + 0.004 * 2)
    assert step_time(PERF, 1, 1, 10, 1) == pytest.approx(0.06)
    # gamma 10: nearly the larger of the two (perfect overlap).
    overlapped = PERF._replace(gamma=10.0)
    assert step_time(overlapped, 2, 4, 10, 0) == pytest.approx(
        (0.03 ** 10 + 0.07 ** 10) ** 0.1)
    assert 0.07 < step_time(overlapped, 2, 4, 10, 0) < 0.0701


def brute_force(model, hosts, ranks, max_batch, bounds, accumulation):
    lo, hi = bounds or (1, max_batch)
    max_accum = max_batch if accumulation else 0
    best = None
    for accum, atomic in itertools.product(range(max_accum + 1), range(lo, hi + 1)):
        batch = ranks * atomic * (accum + 1)
        if model.init_batch_size <= batch <= max_batch:
            value = model.goodput(hosts, ranks, atomic, accum)
            if best is None or value > best:
                best = value
    return best


def random_model(rng):
    perf = PerfParams(alpha_c=rng.uniform(1e-3, 0.1), beta_c=rng.uniform(1e-5, 1e-2),
                      alpha_n=rng.uniform(1e-3, 0.5), beta_n=rng.uniform(0, 0.05),
                      alpha_r=rng.uniform(1e-3, 0.1), beta_r=rng.uniform(0, 0.01),
                      gamma=rng.uniform(1.0, 10.0))
    grad = GradParams(sqr=rng.uniform(0.01, 1.0), var=rng.uniform(0.0, 50.0))
    return GoodputModel(perf, grad, init_batch_size=rng.choice([8, 16, 32]))


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_is_the_brute_force_argmax(seed):
    rng = random.Random(seed)
    model = random_model(rng)
    ranks = rng.choice([1, 2, 3, 4, 8])
    hosts = rng.choice([h for h in (1, 2, 4) if h <= ranks])
    max_batch = model.init_batch_size * rng.choice([1, 4, 32])
    bounds = rng.choice([None, (1, 16), (4, 64), (2, 8)])
    accumulation = rng.choice([False, True])
    best = model.optimize(hosts, ranks, max_batch, bounds, accumulation)
    expected = brute_force(model, hosts, ranks, max_batch, bounds, accumulation)
    if expected is None:
        assert best is None
        return
    assert best.goodput == pytest.approx(expected, rel=1e-12)
    assert best.goodput == pytest.approx(model.goodput(hosts, ranks, best.atomic_bsz,
                                                       best.accumulation_steps), rel=1e-12)
    assert best.batch_size == ranks * best.atomic_bsz * (best.accumulation_steps + 1)
    assert model.init_batch_size <= best.batch_size <= max_batch
    assert accumulation or best.accumulation_steps == 0


def test_no_noise_keeps_the_initial_batch_and_much_noise_takes_the_largest():
    quiet = GoodputModel(PERF, GradParams(sqr=1.0, var=0.0), init_batch_size=16)
    assert quiet.optimize(1, 2, max_batch_size=512).batch_size == 16
    noisy = GoodputModel(PERF, GradParams(sqr=1e-6, var=1e3), init_batch_size=16)
    assert noisy.optimize(1, 2, max_batch_size=512).batch_size == 512
    # A micro-batch bound of 64 per rank: 512 needs accumulation (4 micro-batches of 64).
    limited = noisy.optimize(1, 2, max_batch_size=512, local_bsz_bounds=(1, 64),
                             accumulation=True)
    assert (limited.batch_size, limited.atomic_bsz, limited.accumulation_steps) == (512, 64, 3)
    assert noisy.optimize(1, 2, max_batch_size=512, local_bsz_bounds=(1, 64)).batch_size == 128


def test_hysteresis_keeps_a_choice_within_five_percent():
    model = GoodputModel(PERF, GradParams(sqr=1.0, var=40.0), init_batch_size=16)
    best = model.optimize(1, 2, max_batch_size=256)
    # A neighbour of the best within 5 % of its goodput stays...
    for atomic in range(8, 129):
        value = model.goodput(1, 2, atomic, 0)
        if atomic != best.atomic_bsz and value > best.goodput / 1.05:
            kept = model.optimize(1, 2, max_batch_size=256, current=(atomic, 0))
            assert kept == Config(value, 2 * atomic, atomic, 0)
            break
    else:
        pytest.fail("no configuration within 5 % of the best to test with")
    # ... one further away is replaced by the best.
    far = min(range(8, 129), key=lambda a: model.goodput(1, 2, a, 0))
    assert model.goodput(1, 2, far, 0) * 1.05 < best.goodput
    assert model.optimize(1, 2, max_batch_size=256, current=(far, 0)) == best


def test_bad_bounds_are_errors_or_no_configuration():
    model = GoodputModel(PERF, None, init_batch_size=16)
    with pytest.raises(ValueError, match="below the initial batch size"):
        model.optimize(1, 2, max_batch_size=8)
    with pytest.raises(ValueError, match="init_batch_size"):
        GoodputModel(PERF, None, init_batch_size=0)
    # A micro-batch of at least 64 on 2 ranks cannot make a batch of at most 32.
    assert model.optimize(1, 2, max_batch_size=32, local_bsz_bounds=(64, 128)) is None
    assert math.isinf(noise_scale(GradParams(0.0, 1.0), 16))
