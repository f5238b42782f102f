"""AdaptiveDataLoader and the epoch loop, with AdaptDL's names.

Each epoch is one permutation of the dataset (seeded by the seed and the epoch, the same on
every rank). A step takes the next ``ranks * atomic_bsz * (accumulation_steps + 1)`` indices of
it; rank r's micro-batch m is the slice ``(m * ranks + r) * atomic_bsz`` of them. The position
(samples of the steps handed out: it moves when a step's last micro-batch is, so that a commit
after that step's optimizer step holds the step as done) is saved with the epoch in the
adaptive state, so after an elastic reset or a restart the epoch goes on from the last commit
at whatever size the job has now: no sample of an epoch is skipped or seen twice, except that a last step too small to give
every rank a sample drops those (fewer than ``ranks``) samples.

The batch configuration is asked of the controller (``AdaptiveDataParallel.begin_step``) at
every step boundary; without a controller (or for a loader iterated without gradients, such as
a validation loader) the initial batch is split over the ranks.
"""
import math

import torch
from torch.utils.data import default_collate

from horovod_cpp.torch.basics import rank, size
from horovod_cpp.torch.adaptive.context import CONTEXT


def current_dataloader():
    """The AdaptiveDataLoader being iterated, or None."""
    return CONTEXT.loader


def current_epoch():
    """The epoch ``remaining_epochs_until`` is in (None outside it)."""
    return CONTEXT.progress.epoch if CONTEXT.in_epochs else None


def finished_epochs():
    """Epochs completed so far (restored with the adaptive state)."""
    return CONTEXT.progress.epoch


def remaining_epochs_until(epoch):
    """Yields the epochs from the current one (0 on a fresh start, the saved one after a
    restore) up to ``epoch`` (exclusive), as AdaptDL's."""
    # A loop that an elastic reset interrupted ends only when its generator is collected,
    # maybe while the restarted loop runs: only the newest loop clears the flag.
    token = object()
    CONTEXT.in_epochs = token
    try:
        while CONTEXT.progress.epoch < epoch:
            yield CONTEXT.progress.epoch
            CONTEXT.progress.epoch += 1
    finally:
        if CONTEXT.in_epochs is token:
            CONTEXT.in_epochs = None


class AdaptiveDataLoader(object):
    """A data loader whose batch size adapts: ``batch_size`` is the initial global batch B0.
    Keyword arguments other than the sampling ones (``collate_fn``, ``pin_memory``, ...) go to
    the ``torch.utils.data.DataLoader`` that loads each micro-batch; ``num_workers`` is
    accepted and loads in the main process's order. ``name`` keys the loader's position in
    the saved state (two loaders need two names)."""

    def __init__(self, dataset, batch_size=1, shuffle=False, name="adaptdl-dataloader",
                 drop_last=False, seed=0, **kwargs):
        for bad in ("sampler", "batch_sampler"):
            if kwargs.get(bad) is not None:
                raise ValueError("AdaptiveDataLoader chooses its own batches; it takes no %s"
                                 % bad)
        if batch_size < 1:
            raise ValueError("batch_size must be positive, got %r" % (batch_size,))
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.name = name
        self.drop_last = drop_last
        self.seed = int(seed)
        self._kwargs = kwargs
        self.max_batch_size = None
        self.local_bsz_bounds = None
        self.gradient_accumulation = False
        self.memory_budget = None
        self._micro = 0                  # micro-batch of the current step being iterated
        self._accum = 0                  # micro-batches of the current step, less one
        self._step_sizes = (0, 0, True)  # local samples, global samples, a full step
        self._epoch = 0
        self._iteration = None

    def autoscale_batch_size(self, max_batch_size, local_bsz_bounds=None,
                             gradient_accumulation=False, memory_budget=None):
        """Lets the global batch grow up to ``max_batch_size`` where goodput says so, with each
        rank's micro-batch within ``local_bsz_bounds`` (min, max) and, with
        ``gradient_accumulation``, several micro-batches per step. Without a max in
        ``local_bsz_bounds``, the largest micro-batch that fits is learned from the memory
        peaks (horovod_cpp.adaptive.memory), within ``memory_budget`` bytes per rank (default:
        the cgroup's limit or the host's memory, shared by its ranks;
        HOROVOD_ADAPTIVE_MEMORY_BUDGET)."""
        if max_batch_size < self.batch_size:
            raise ValueError("max_batch_size (%d) is below the initial batch size (%d)"
                             % (max_batch_size, self.batch_size))
        if local_bsz_bounds is not None:
            lo, hi = local_bsz_bounds
            if (lo is not None and lo < 1) or (hi is not None and lo is not None and hi < lo):
                raise ValueError("local_bsz_bounds must be (min >= 1, max >= min), got %r"
                                 % (local_bsz_bounds,))
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError("memory_budget must be a positive number of bytes, got %r"
                             % (memory_budget,))
        self.max_batch_size = int(max_batch_size)
        self.local_bsz_bounds = local_bsz_bounds
        self.gradient_accumulation = bool(gradient_accumulation)
        self.memory_budget = memory_budget

    # AdaptDL's properties
    @property
    def current_local_bsz(self):
        c = CONTEXT.controller
        if c is not None and c.atomic_bsz is not None:
            return c.atomic_bsz
        return max(1, math.ceil(self.batch_size / size()))

    @property
    def accumulation_steps(self):
        c = CONTEXT.controller
        return c.accumulation_steps if c is not None and c.atomic_bsz is not None else 0

    @property
    def current_batch_size(self):
        return self.current_local_bsz * (self.accumulation_steps + 1) * size()

    def is_optim_step(self):
        """Whether the micro-batch being iterated is the last of its step."""
        return self._micro >= self._accum

    def epoch_progress(self):
        """Epochs done, fractional."""
        return self._epoch + CONTEXT.progress.position(self.name, self._epoch) / \
            max(1, len(self.dataset))

    def _order(self, epoch):
        n = len(self.dataset)
        if not self.shuffle:
            return torch.arange(n)
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(n, generator=g)

    def _load(self, indices):
        """One micro-batch: fetched and collated here when the loading is in this process
        (a DataLoader made per batch costs a few hundred microseconds), else through a
        DataLoader with the given workers."""
        kwargs = self._kwargs
        if not kwargs.get("num_workers") and not kwargs.get("pin_memory"):
            fetch = getattr(self.dataset, "__getitems__", None)
            samples = fetch(indices) if fetch is not None else [self.dataset[i] for i in indices]
            collate = kwargs.get("collate_fn") or default_collate
            return collate(samples)
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=len(indices),
                                             sampler=indices, **kwargs)
        return next(iter(loader))

    def __len__(self):
        """Steps left in this epoch at the current batch size."""
        left = len(self.dataset) - CONTEXT.progress.position(self.name, self._current_epoch())
        return max(0, math.ceil(left / max(1, self.current_batch_size)))

    def _current_epoch(self):
        """``remaining_epochs_until``'s epoch; outside it, the loader's own, which comes from
        its saved position when there is one (the state that an elastic reset syncs and a
        checkpoint restores: a rank that joins a job, or rolls back, takes up the same epoch
        and position as the others; its own counter alone would start a new rank at epoch 0,
        with another shuffle and other epoch ends)."""
        if CONTEXT.in_epochs:
            return CONTEXT.progress.epoch
        saved = CONTEXT.progress.positions.get(self.name)
        if saved is None:
            return self._epoch
        return saved[0] + 1 if saved[1] >= len(self.dataset) else saved[0]

    def __iter__(self):
        epoch = self._current_epoch()
        self._epoch = epoch
        order = self._order(epoch)
        n = len(order)
        controller = CONTEXT.controller
        training = torch.is_grad_enabled() and controller is not None
        previous, CONTEXT.loader = CONTEXT.loader, self
        token = self._iteration = object()  # (as in remaining_epochs_until)
        try:
            while True:
                position = CONTEXT.progress.position(self.name, epoch)
                if position >= n:
                    break
                ranks, r = size(), rank()
                if training:
                    atomic, accum = controller.begin_step(self)
                else:
                    atomic, accum = max(1, math.ceil(self.batch_size / ranks)), 0
                slots = ranks * (accum + 1)
                full = n - position >= atomic * slots
                if full:
                    take = atomic * slots
                    bounds = [(k * atomic, (k + 1) * atomic) for k in range(slots)]
                else:
                    if self.drop_last or n - position < ranks:
                        CONTEXT.progress.advance(self.name, epoch, n)
                        break
                    take = n - position
                    # the rest over the slots as evenly as it goes, fewer micro-batches when
                    # they would be empty
                    accum = min(accum, take // ranks - 1)
                    slots = ranks * (accum + 1)
                    share = [take // slots + (1 if k < take % slots else 0) for k in range(slots)]
                    starts = [sum(share[:k]) for k in range(slots)]
                    bounds = [(s, s + c) for s, c in zip(starts, share)]
                step = order[position:position + take]
                mine = [step[bounds[m * ranks + r][0]:bounds[m * ranks + r][1]]
                        for m in range(accum + 1)]
                self._step_sizes = (sum(len(x) for x in mine), take, full)
                self._accum = accum if training else 0
                if training:
                    controller.configure_step(accum)
                for m, indices in enumerate(mine):
                    self._micro = m if training else 0
                    if training:
                        controller.note_micro_batch(len(indices))
                    batch = self._load(indices.tolist())
                    if m == accum:
                        # Counted before the step's last micro-batch is handed out: a commit
                        # made after its optimizer step (elastic) holds the step as done, so a
                        # rollback to it does not draw the step's samples again.
                        CONTEXT.progress.advance(self.name, epoch, position + take)
                    yield batch
            if not CONTEXT.in_epochs:
                self._epoch += 1
        finally:
            if self._iteration is token:
                self._micro = self._accum = 0
                CONTEXT.loader = previous if previous is not self else None
