"""The elastic function the launchers' elastic tests run (Spark's run_elastic, Ray's
ElasticRayExecutor): a counter trained with ``hvd.elastic.run``. Registered with cloudpickle by
value by its users, so that the workers need not import it."""
import os
import re


def count_steps(fail=None, how="exit", steps=25, at=8):
    """Each step allreduces every rank's 1 and commits. The worker whose id matches the regular
    expression ``fail`` (Spark: "^task1@", Ray: ":2$" for slot 2) exits (``how="exit"``: its
    process dies) or raises (``"raise"``) at step ``at``. Returns (rank, size, step, last sum,
    the sizes seen, in order)."""
    import torch

    import horovod_cpp.torch as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(step=0, total=0.0, sizes=[])
    failing = fail is not None and re.search(fail, os.environ["HOROVOD_ELASTIC_WORKER_ID"])

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes = state.sizes + [hvd.size()]
            state.total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="count").item()
            if failing and state.step == at:
                if how == "raise":
                    raise KeyError("bad batch in worker %s"
                                   % os.environ["HOROVOD_ELASTIC_WORKER_ID"])
                os._exit(3)
            state.step += 1
            state.commit()

    train(state)
    return hvd.rank(), hvd.size(), state.step, state.total, state.sizes
