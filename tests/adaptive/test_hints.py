"""Goodput hints (horovod_cpp.adaptive.hints): the speedup a scheduler makes of a job's hints
against the goodput model's own optimum computed here by brute force, the replica cap, and a
sink that fails being dropped without stopping the training."""
import pytest

from horovod_cpp.adaptive import hints
from horovod_cpp.adaptive.goodput import GoodputModel

PERF = [0.01, 0.001, 0.05, 0.005, 0.02, 0.002, 2.0]
HINTS = {"perf_params": PERF, "grad_params": [0.5, 20.0], "init_batch_size": 32,
         "max_batch_size": 256, "local_bsz_bounds": [8, 64], "gradient_accumulation": False,
         "max_profiled_replicas": 2}


def brute(hosts, replicas):
    model = GoodputModel(PERF, (0.5, 20.0), 32)
    best = 0.0
    for atomic in range(8, 65):
        if 32 <= atomic * replicas <= 256:
            best = max(best, model.goodput(hosts, replicas, atomic, 0))
    return best


def test_speedup_is_the_best_goodput_over_the_fair_shares():
    s = hints.HintedSpeedup(HINTS, fair_hosts=1, fair_replicas=2)
    for hosts, replicas in [(1, 1), (1, 2), (1, 4), (2, 4), (2, 8)]:
        assert s(hosts, replicas) == pytest.approx(brute(hosts, replicas) / brute(1, 2),
                                                   rel=1e-12)
    assert s(1, 2) == pytest.approx(1.0)
    assert s(1, 0) == 0.0


def test_without_a_model_every_size_is_worth_the_same():
    s = hints.HintedSpeedup({"perf_params": None, "init_batch_size": 32}, 1, 4)
    assert [s(1, r) for r in range(4)] == [0.0, 1.0, 1.0, 1.0]
    assert hints.HintedSpeedup(None, 1, 4)(2, 3) == 1.0


def test_replica_cap_is_twice_what_was_measured():
    assert hints.replica_cap(HINTS, 16) == 4
    assert hints.replica_cap(HINTS, 3) == 3
    assert hints.replica_cap({}, 16) == 1
    assert hints.replica_cap(None, 16) == 1


def test_a_failing_sink_is_reported_once_and_dropped(capsys):
    got = []
    hints.set_sink(got.append)
    assert hints.active()
    hints.publish({"a": 1})
    assert got == [{"a": 1}]

    def broken(_):
        raise ConnectionError("scheduler gone")
    hints.set_sink(broken)
    hints.publish({"a": 2})
    hints.publish({"a": 3})
    assert not hints.active()
    assert capsys.readouterr().err.count("scheduler gone") == 1
    hints.set_sink(None)
