"""Adaptive training in process, with AdaptDL's API (``adaptdl.torch``): each job picks its own
global batch, per-rank micro-batch, accumulation steps and learning-rate factor by goodput,
measured cheaply in the core, and picks again on the first step after an elastic resize::

    import horovod_cpp.torch as hvd
    import horovod_cpp.torch.adaptive as adl

    hvd.init()
    model = adl.AdaptiveDataParallel(model, optimizer)       # optimizer: a torch optimizer
    loader = adl.AdaptiveDataLoader(dataset, batch_size=64, shuffle=True)
    loader.autoscale_batch_size(2048, gradient_accumulation=True)
    for epoch in adl.remaining_epochs_until(30):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

docs/adaptive.md maps AdaptDL's API onto this one and lists what differs.
"""
from horovod_cpp.torch.basics import init as _init
from horovod_cpp.torch.adaptive import scaling_rules  # noqa: F401  (AdaptDL's module path)
from horovod_cpp.torch.adaptive.scaling_rules import (AdamScale, AdaScale, LEGWScale,
                                                      LinearScale, SqrtScale)
from horovod_cpp.torch.adaptive.accumulator import Accumulator
from horovod_cpp.torch.adaptive.data import (AdaptiveDataLoader, current_dataloader,
                                             current_epoch, finished_epochs,
                                             remaining_epochs_until)
from horovod_cpp.torch.adaptive.parallel import AdaptiveDataParallel, AdaptiveState
from horovod_cpp.torch.adaptive.context import CONTEXT as _CONTEXT
from horovod_cpp.common.elastic import add_recoverable_error_handler as _add_handler


class _OutOfMemoryBackOff(object):
    """hvd.elastic.run's handler of out-of-memory errors (AdaptiveDataParallel.back_off)."""

    def __call__(self, error):
        c = _CONTEXT.controller
        return c.back_off(error) if c is not None else None

    def release(self):
        c = _CONTEXT.controller
        if c is not None:
            c.release_memory()


_add_handler(_OutOfMemoryBackOff())


def init_process_group(backend=None, init_method=None, world_size=None, rank=None):
    """AdaptDL's entry point: ``hvd.init()`` (the ranks come from the launcher: mpirun,
    hvdrun, HorovodRunner, Ray). ``backend`` and the rest are accepted for AdaptDL scripts and
    ignored: horovod_cpp's own data plane (MPI or Gloo, as launched) reduces CPU tensors, NCCL
    CUDA ones."""
    _init()


def gradient_noise_scale():
    """The current gradient noise scale phi = B0 * var / sqr, in samples (None before the
    first measurement or without an AdaptiveDataParallel)."""
    c = _CONTEXT.controller
    return c.gradient_noise_scale() if c is not None else None


def stats():
    """The controller's stats() (noise scale, batch size, accumulation steps, learning-rate
    factor, predicted goodput, ...); {} without an AdaptiveDataParallel."""
    c = _CONTEXT.controller
    return c.stats() if c is not None else {}


__all__ = ["AdaptiveDataParallel", "AdaptiveDataLoader", "AdaptiveState", "Accumulator",
           "AdaScale", "AdamScale", "LinearScale", "SqrtScale", "LEGWScale",
           "current_dataloader", "current_epoch", "finished_epochs", "remaining_epochs_until",
           "init_process_group", "gradient_noise_scale", "stats", "scaling_rules"]
