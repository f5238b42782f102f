"""horovod_cpp.runner.run (and horovod_cpp.run), like horovod.run: a function and its arguments
reach every rank, every rank's return value comes back in rank order, a rank's exception is
raised with its traceback, and options horovod_cpp does not have are refused by name. The
cross-host case runs on the test bed (tests/multihost/run.sh)."""
import os
import socket
import sys

import cloudpickle
import pytest

import horovod_cpp
from horovod_cpp.runner import run
from horovod_cpp.spark import RankError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.deadline(180)


def ranks_and_sum(scale, offset=0):
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    out = (hvd.rank(), hvd.size(), total * scale + offset, socket.gethostname(), os.getpid())
    hvd.shutdown()
    return out


@pytest.mark.parametrize("np_", [1, 3])
def test_every_ranks_value_in_rank_order(np_):
    results = run(ranks_and_sum, args=(10,), kwargs={"offset": 1}, np=np_)
    total = np_ * (np_ - 1) / 2
    assert [r[:4] for r in results] == [(rank, np_, total * 10 + 1, socket.gethostname())
                                        for rank in range(np_)]
    assert len({r[4] for r in results}) == np_ and os.getpid() not in {r[4] for r in results}


def test_horovod_cpp_run_is_the_same():
    assert [r[:3] for r in horovod_cpp.run(ranks_and_sum, args=(1,), np=2)] == [
        (0, 2, 1.0), (1, 2, 1.0)]


def raise_on_rank_1():
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if rank == 1:
        raise KeyError("missing shard %d" % rank)
    return rank


def test_an_exception_on_a_rank_is_raised_with_its_traceback():
    with pytest.raises(RankError) as info:
        run(raise_on_rank_1, np=2)
    assert info.value.rank == 1 and info.value.exc_type == "KeyError"
    assert "in raise_on_rank_1" in info.value.remote_traceback


def test_options_it_does_not_have_are_refused_by_name():
    with pytest.raises(NotImplementedError, match="min_np"):
        run(raise_on_rank_1, np=2, min_np=1)
    with pytest.raises(TypeError, match="bogus"):
        run(raise_on_rank_1, np=2, bogus=1)
    with pytest.raises(ValueError, match="np must be a positive int"):
        run(raise_on_rank_1, np=0)
