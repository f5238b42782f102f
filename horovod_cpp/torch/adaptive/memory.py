"""The memory side of adaptive training: how large a micro-batch may be, and what happens when
one does not fit. ``MemoryControl`` is a part of AdaptiveDataParallel (its methods use the
controller's configuration):

* Without an upper bound in ``local_bsz_bounds`` the micro-batch is bounded by the memory model
  (``horovod_cpp.adaptive.memory``), fed the process's peaks: the allocator's on the GPU that
  holds the model, else the resident set's.
* An out-of-memory error raised while a training step is in flight, inside ``hvd.elastic.run``,
  is backed off in process: ``back_off`` forbids the micro-batch that failed and larger ones,
  ``run`` rolls every rank back to the last commit and re-forms the job (the failing rank's
  shutdown fails the others' collectives), the ranks agree on the least micro-batch that
  failed anywhere (``oom_ceiling``) and on the largest that completed a step
  (``largest_fit``) at their next step, and the batch is chosen again below the bisection of
  the two (``oom_limit``).
"""
import gc
import math
import os
import resource
import sys
import time

import torch

from horovod_cpp.adaptive.memory import default_budget, release_free_memory
from horovod_cpp.torch.basics import local_size, rank, size

NO_CEILING = 1 << 62


def least(a, b):
    """The smaller of two optional numbers (None: no number)."""
    return b if a is None else a if b is None else min(int(a), int(b))


def is_out_of_memory(error):
    """Whether ``error`` says an allocation failed: torch's OutOfMemoryError (CUDA's, and
    any device's where torch raises it), or the RuntimeError of the CPU allocator or of a
    torch that predates OutOfMemoryError."""
    types_ = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                               getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    if types_ and isinstance(error, types_):
        return True
    if isinstance(error, RuntimeError):
        text = str(error)
        return ("DefaultCPUAllocator: can't allocate memory" in text or
                "DefaultCPUAllocator: not enough memory" in text or
                "CUDA out of memory" in text)
    return False


def _proc_status_bytes(field):
    """A memory field of /proc/self/status ("VmRSS", "VmHWM") in bytes, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return None


class MemoryControl(object):
    """AdaptiveDataParallel's memory bound and out-of-memory back-off (see the module)."""

    def _device(self):
        return next((p.device for p in self.module.parameters()), None)

    def _default_budget(self):
        """Bytes this rank may use: its GPU's memory where the model is on one (as the peaks
        are then the allocator's on it), else the host's share (memory.default_budget);
        HOROVOD_ADAPTIVE_MEMORY_BUDGET overrides either."""
        device = self._device()
        if device is not None and device.type == "cuda" and \
                not os.environ.get("HOROVOD_ADAPTIVE_MEMORY_BUDGET"):
            return float(torch.cuda.get_device_properties(device).total_memory)
        return default_budget(local_size())

    def _current_memory(self):
        device = self._device()
        if device is not None and device.type == "cuda":
            return float(torch.cuda.memory_allocated(device))
        return _proc_status_bytes("VmRSS") or self._peak_memory()

    def _peak_memory(self):
        """This process's memory high-water mark since the last call, which resets it: peak
        allocated on the GPU where the model lives, else the peak resident set (reset through
        /proc/self/clear_refs; where that is not allowed, the lifetime peak: ``_resettable``
        is then False)."""
        device = self._device()
        if device is not None and device.type == "cuda":
            peak = float(torch.cuda.max_memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
            return peak
        peak = _proc_status_bytes("VmHWM")
        if peak is None:
            self._resettable = False
            return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0
        if self._resettable:
            release_free_memory()  # (the next mark starts from the memory in use: memory.py)
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # resets VmHWM to the current resident set (Linux 4.0+)
            except OSError:
                self._resettable = False
        return peak

    def _bounds(self, loader):
        """(min, max) micro-batch: the loader's bounds, the upper one from the memory model
        where none is given, and below any micro-batch that ran out of memory."""
        lo, hi = loader.local_bsz_bounds or (None, None)
        if hi is None and self.memory is not None:
            hi = self.memory.limit()
            if hi is not None and lo is not None:
                hi = max(hi, lo)  # the user's lower bound is a promise the model cannot break
        limit = self.oom_limit()
        if limit is not None:
            hi = least(hi, max(limit, lo or 1))
        return lo, hi

    def oom_limit(self):
        """The largest micro-batch allowed after running out of memory (None: no bound): a
        bisection between the largest micro-batch that completed a step (``largest_fit``) and
        the least that failed (``oom_ceiling``), so that the largest that fits is found
        within log2 of their gap back-offs, not one sample at a time."""
        if self.oom_ceiling is None:
            return None
        fit = self.largest_fit or 0
        if fit >= self.oom_ceiling - 1:
            return max(1, self.oom_ceiling - 1)
        return max(1, (fit + self.oom_ceiling) // 2)

    def _cap(self, loader):
        """The configuration's micro-batch below the least that ran out of memory; with
        gradient accumulation allowed, as many micro-batches as keep the global batch, else
        a smaller global batch (the scaling rule follows it)."""
        hi = self._bounds(loader)[1]
        if hi is None or self.atomic_bsz <= hi:
            return
        batch = self.atomic_bsz * (self.accumulation_steps + 1) * size()
        self.atomic_bsz = hi
        self.accumulation_steps = 0
        if loader.gradient_accumulation and loader.max_batch_size is not None:
            self.accumulation_steps = max(0, math.ceil(batch / (hi * size())) - 1)

    def note_micro_batch(self, samples):
        """The loader hands out a micro-batch of ``samples`` for the step being drawn."""
        self._in_flight = max(self._in_flight or 0, int(samples))

    def step_done(self):
        """The step's optimizer step is done: its micro-batches fit."""
        if self._in_flight is not None:
            self.largest_fit = max(self.largest_fit or 0, self._in_flight)
        self._in_flight = None

    def back_off(self, error):
        """``hvd.elastic.run``'s handler of an error raised in its function: when ``error``
        is an out-of-memory error raised while a training step was in flight (from its first
        micro-batch to the end of its optimizer step) and a smaller micro-batch is allowed,
        forbids that micro-batch and larger ones and returns why (``run`` then restores the
        last commit and re-forms the job, and every rank chooses again below the least
        micro-batch that failed on any rank); else None (the error is raised as before)."""
        failed = self._in_flight
        if failed is None or not is_out_of_memory(error):
            return None
        loader = self._step_loader  # (the loader's loop may have ended with the error)
        lo = self._bounds(loader)[0] if loader is not None else None
        if failed <= max(1, lo or 1):
            return None  # nothing smaller is allowed: the error stands
        self.oom_ceiling = least(self.oom_ceiling, failed)
        self._in_flight = None
        limit = self.oom_limit()
        self.out_of_memory.append({"step": self.steps, "micro_batch": failed, "limit": limit,
                                   "at": time.time()})
        text = str(error)
        why = ("out of memory at micro-batch %d on rank %d (%s: %s); the job rolls back to its "
               "last commit and takes micro-batches of at most %d"
               % (failed, rank(), type(error).__name__,
                  text.splitlines()[0][:200] if text else "", limit))
        print("horovod_cpp.adaptive: " + why, file=sys.stderr, flush=True)
        return why

    def release_memory(self):
        """After a back-off, once the failed step's frames are gone: the gradients it left
        and the allocator's cached blocks."""
        for p in self.module.parameters():
            p.grad = None
        gc.collect()
        device = self._device()
        if device is not None and device.type == "cuda":
            torch.cuda.empty_cache()
