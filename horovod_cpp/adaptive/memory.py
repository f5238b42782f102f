"""How large a per-rank micro-batch fits in memory, learned from the peaks the job sees (so that
nobody has to hand-pick ``local_bsz_bounds``: AdaptDL's issue #40). Plain Python.

The model is linear, as activations are: peak(b) = base + per_sample * b. Each step reports its
micro-batch b and the process's peak memory during the step (on CPU the resident set's
high-water mark, reset after each step through /proc/self/clear_refs; on CUDA the peak
allocated, reset likewise). Where the mark cannot be reset (``monotone``) a step only says
something when it raised it; ``per_sample`` is the larger of the slope between the two
micro-batches that raised it highest and (peak - base) / b at the highest, base being the memory
before the first step (on CPU with what malloc held free released first,
``release_free_memory``, as before every reading; every byte above it counted as per sample:
pessimistic, as it should be where running out kills the process). ``limit()`` is the largest
micro-batch whose predicted peak leaves ``1 - safety`` of the room between the base and the
budget free, a sample past the highest peak measured counted ``extrapolation`` (1.5) times, and
at most ``growth`` times the largest micro-batch measured. Memory does not grow exactly linearly
(the allocator's caching and fragmentation, the collated copies), so the model is trusted only
near what it has seen: the micro-batch approaches the limit from below, closing at most two
thirds of the remaining gap at a time. None while nothing is known (no limit yet).
"""
import ctypes
import functools
import os


def release_free_memory():
    """Hands the memory glibc's malloc holds free back to the kernel (``malloc_trim(0)``: the
    top of every arena and the free pages inside it); False where that cannot be done (another
    libc or allocator).

    Memory malloc holds free counts in the resident set but is reused before the process asks
    the kernel for more: a step whose micro-batch fits in it does not raise the high-water
    mark at all, so measured against a resident set that holds it, the first micro-batches
    look almost free and the per-sample cost extrapolated from them comes out far too low.
    Released before the base is taken and before every reading, the resident set is the memory
    in use, and a micro-batch's peak is its own."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """glibc's malloc_trim, looked up once (in the process's own symbols: no library search,
    which would run ldconfig at every reading), or None."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return trim


def cgroup_limit_bytes():
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), or None where there is none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
    return None


def host_memory_bytes():
    """MemTotal of /proc/meminfo, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_budget(local_ranks):
    """Bytes one rank may use: the cgroup's limit, else the host's memory, shared by the ranks
    of this host. HOROVOD_ADAPTIVE_MEMORY_BUDGET (bytes, per rank) overrides it."""
    env = os.environ.get("HOROVOD_ADAPTIVE_MEMORY_BUDGET")
    if env:
        try:
            value = int(float(env))
        except ValueError:
            raise ValueError("HOROVOD_ADAPTIVE_MEMORY_BUDGET must be a number of bytes, got %r"
                             % (env,))
        if value <= 0:
            raise ValueError("HOROVOD_ADAPTIVE_MEMORY_BUDGET must be positive, got %r" % (env,))
        return value
    total = cgroup_limit_bytes() or host_memory_bytes()
    return None if total is None else total // max(1, int(local_ranks))


class MemoryModel(object):
    def __init__(self, budget, base, safety=0.8, growth=2.0, monotone=False, extrapolation=1.5):
        self.budget = float(budget)
        self.base = float(base)
        self.safety = float(safety)
        self.growth = growth
        self.extrapolation = float(extrapolation)
        self.monotone = bool(monotone)
        self.peaks = {}  # micro-batch -> the highest peak seen with it

    def record(self, micro_batch, peak):
        """One step's micro-batch and its peak."""
        micro_batch, peak = int(micro_batch), float(peak)
        if micro_batch <= 0 or not peak > 0:
            return
        if self.monotone and not peak > max(self.peaks.values(), default=self.base):
            return  # a high-water mark that did not rise: no information
        self.peaks[micro_batch] = max(peak, self.peaks.get(micro_batch, 0.0))

    def _top(self):
        """The micro-batches of the highest peaks, highest last."""
        return sorted(self.peaks, key=self.peaks.get)

    def per_sample(self):
        if not self.peaks:
            return None
        top = self._top()
        b = top[-1]
        average = max(self.peaks[b] - self.base, 1.0) / b
        if len(top) >= 2 and top[-2] != b:
            slope = (self.peaks[b] - self.peaks[top[-2]]) / (b - top[-2])
            return max(slope, average)
        return average

    def limit(self):
        """The largest micro-batch predicted to fit (at least 1), or None while unknown."""
        slope = self.per_sample()
        if slope is None:
            return None
        b = self._top()[-1]
        allowed = self.budget - (1.0 - self.safety) * max(self.budget - self.base, 0.0)
        room = allowed - self.peaks[b]
        if room > 0:  # past what was measured: each sample counted ``extrapolation`` times
            slope *= self.extrapolation
        fits = max(1, int(b + room // slope))
        if self.growth is not None:
            fits = min(fits, max(1, int(self.growth * max(self.peaks))))
        return fits

    def state_dict(self):
        return {"budget": self.budget, "base": self.base, "safety": self.safety,
                "growth": self.growth, "monotone": self.monotone,
                "extrapolation": self.extrapolation,
                "peaks": [[b, p] for b, p in sorted(self.peaks.items())]}

    def load_state_dict(self, state):
        self.budget, self.base = float(state["budget"]), float(state["base"])
        self.safety = float(state["safety"])
        self.growth = state.get("growth")
        self.extrapolation = float(state.get("extrapolation", 1.5))
        self.monotone = bool(state.get("monotone", False))
        self.peaks = {int(b): float(p) for b, p in state["peaks"]}
