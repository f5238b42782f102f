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
from horovod_cpp.adaptive.scaling import AdamScale, AdaScale, LEGWScale, LinearScale, SqrtScale
from horovod_cpp.torch.adaptive.accumulator import Accumulator
from horovod_cpp.torch.adaptive.data import (AdaptiveDataLoader, current_dataloader,
                                             current_epoch, remaining_epochs_until)
from horovod_cpp.torch.adaptive.parallel import AdaptiveDataParallel, AdaptiveState
from horovod_cpp.torch.adaptive.context import CONTEXT as _CONTEXT


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
           "current_dataloader", "current_epoch", "remaining_epochs_until",
           "gradient_noise_scale", "stats"]
