"""horovod_cpp.spark.run_elastic on a real local SparkSession: the workers run in Spark tasks
(one slot each), every rank of the last round reports, a worker that fails is dropped and the
job goes on with the rest, too few tasks is a clear error, and nothing is left running. A lost
executor that comes back is tested on the test bed's Spark cluster
(tests/multihost/spark/test_cluster.py)."""
import sys

import cloudpickle
import pytest

from horovod_cpp import _import_core
from horovod_cpp.spark import HorovodRunnerError, run_elastic

import elastic_counter
from elastic_counter import count_steps

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(elastic_counter)

pytestmark = [pytest.mark.deadline(240),
              pytest.mark.skipif(not _import_core().gloo_built(), reason="built without Gloo")]


def test_every_rank_of_the_last_round_reports(spark):
    results = run_elastic(count_steps, num_proc=2, min_np=1, max_np=2, verbose=0)
    assert [(r[0], r[1], r[2], r[3]) for r in results] == [(0, 2, 25, 2.0), (1, 2, 25, 2.0)]


def test_a_failed_worker_is_dropped_and_the_job_goes_on(spark):
    results = run_elastic(count_steps, kwargs={"fail": "^task1@"}, num_proc=3, min_np=2,
                          max_np=3, elastic_timeout=60, verbose=0)
    assert [(r[0], r[1], r[2], r[3]) for r in results] == [(0, 2, 25, 2.0), (1, 2, 25, 2.0)]
    assert all(r[4] == [3, 2] for r in results)  # three ranks, then two: no restart from 0


def test_argument_errors_and_too_few_slots(spark):
    with pytest.raises(ValueError, match="min_np <= num_proc <= max_np"):
        run_elastic(count_steps, num_proc=2, min_np=3)
    with pytest.raises(ValueError, match="num_proc must be a positive int"):
        run_elastic(count_steps, num_proc=0)
    # 5 tasks on a session of 4 task slots: the fifth never starts.
    with pytest.raises(HorovodRunnerError, match="4 of 5 tasks started within 5 s"):
        run_elastic(count_steps, num_proc=5, start_timeout=5, verbose=0)
