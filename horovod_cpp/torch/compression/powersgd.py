"""PowerSGD gradient compression for DistributedOptimizer (Vogels, Karimireddy and Jaggi,
"PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019),
with the semantics of PyTorch's DDP ``powerSGD_hook``:

* every gradient whose matrix view M (``grad.view(grad.shape[0], -1)``, n x m) is worth it
  (``n * m > (n + m) * r * min_compression_rate``, r = min(n, m, matrix_approximation_rank))
  travels as two thin matrices: P = M Q is summed over the ranks and orthonormalized, then
  Q = M^T P is averaged, and every rank's gradient becomes P Q^T, the same on every rank;
* vectors (biases, norms) and matrices not worth compressing are averaged exactly, by the
  ordinary fused allreduce;
* for the first ``start_powerSGD_iter`` steps every gradient is averaged exactly;
* error feedback (``use_error_feedback``): what the approximation left out of this rank's M is
  added to its next gradient;
* warm start (``warm_start``): each matrix's Q is kept for its next step (orthonormalized
  again) instead of being drawn anew;
* a Q is drawn from a seed that depends on ``random_seed``, the parameter's name and the step
  only, so every rank draws the same Q whatever order its hooks run in;
* not in PyTorch, and on by default (``adaptive``): compression only while it pays, decided by
  probes that time exact and compressed steps alike (see ``PowerSGD``). On a fast link
  PowerSGD's products can cost more than the bytes they save (docs/compression.md).

The P of a gradient is computed and its allreduce started by the gradient's hook, during the
backward pass; ``step()`` / ``synchronize()`` then starts every Q's allreduce before waiting
for any, so the runtime fuses the Ps of neighbouring layers into one buffer, and the Qs too.

One difference from DDP's hook, which keeps a single error over a whole bucket: only the
compressed matrices keep an error. For a tensor averaged exactly DDP's error is this rank's
input minus the average, whose sum over the ranks is zero, so it never changes the average
that every rank receives (``tests/python/test_powersgd.py`` checks the trajectory against a
one-process reference of the algorithm).
"""
import statistics
import time

import torch

from horovod_cpp.torch.basics import Average, Max, Sum, _core
from horovod_cpp.torch.collectives import (allreduce, allreduce_async_, grouped_allreduce,
                                           grouped_allreduce_async_)
from horovod_cpp.torch.functions import broadcast_object
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.tensor_bridge import synchronize

_FNV_OFFSET = 0xcbf29ce484222325
_FNV_PRIME = 0x100000001b3


def q_seed(random_seed, name, step):
    """The seed of a matrix's random Q: FNV-1a (64 bit) of "random_seed/name/step", the same
    on every rank and in the C++ API (hvd::torch::PowerSGDQSeed)."""
    h = _FNV_OFFSET
    for byte in ("%d/%s/%d" % (random_seed, name, step)).encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def matrix_rank(shape, matrix_approximation_rank):
    """(n, m, r) of a gradient's matrix view, or None for a tensor of fewer than 2 dims."""
    if len(shape) < 2:
        return None
    n = shape[0]
    m = 1
    for d in shape[1:]:
        m *= d
    return n, m, min(n, m, matrix_approximation_rank)


def should_compress(n, m, r, min_compression_rate):
    """As PyTorch: worth it when n*m / ((n+m)*r) > min_compression_rate."""
    return n * m > (n + m) * r * min_compression_rate


def orthogonalize(matrix, epsilon=0.0):
    """Makes the columns of ``matrix`` (n x r) orthonormal, in place (Gram-Schmidt, in float32
    at least). A column that is zero (a gradient of zeros) stays zero instead of becoming NaN,
    whatever ``epsilon``. (The reductions below keep P and Q transposed, r x n: a column is
    then a contiguous row.)"""
    rows = matrix.t()
    work = rows if rows.dtype in (torch.float32, torch.float64) else rows.float()
    for i in range(work.shape[0]):
        row = work[i]
        norm = torch.norm(row)
        if norm.item() == 0.0:
            continue
        row.div_(norm + epsilon)
        if i + 1 < work.shape[0]:
            rest = work[i + 1:]
            rest.sub_(torch.outer(torch.mv(rest, row), row))
    if work is not rows:
        rows.copy_(work)
    return matrix


def low_rank_product(pt, qt):
    """P Q^T (n x m) from P^T (r x n) and Q^T (r x m). For r <= 4 (r <= 2 on fewer than 512
    rows) as a sum of r outer products: the BLAS' general product of so thin a pair ran 2-5x
    slower here (0.65-0.84 against 0.30 ms for 1024 x 1024 at r = 4 on PyPI's torch, 1.45
    against 0.32 on Debian's; docs/compression.md). The same rule in the C++ API
    (LowRankProduct in bindings/torch.cc), so both round alike."""
    r, n = pt.shape
    m = qt.shape[1]
    if not (r <= 4 and n >= 512 or r <= 2 and n * m >= 65536):
        return torch.mm(pt.t(), qt)
    out = torch.outer(pt[0], qt[0])
    for i in range(1, r):
        out.addr_(pt[i], qt[i])
    return out


class _QGroup(object):
    """The Q allreduces of one step, started as one grouped allreduce: one negotiation and one
    fused collective for every compressed matrix. (Started one by one, each Q waited for its
    P first, so the runtime's burst ended and the Qs went out in several rounds: a network
    round trip each, on a slow link.)"""

    def __init__(self, reductions, process_set):
        first = reductions[0]
        self.handle = grouped_allreduce_async_(
            [r.qt for r in reductions], op=Average, process_set=process_set,
            name="powersgd.Q.%s+%d" % (first.name, len(reductions) - 1))
        self.outputs = None

    def output(self, index):
        if self.outputs is None:
            self.outputs = synchronize(self.handle)
        return self.outputs[index]


def start_q_reductions(reductions):
    """Waits for each P, computes each Q, and starts every Q's allreduce in one group (per
    process set). Called once a step, with every compressed gradient in flight."""
    pending = [r for r in reductions if r.stage == 1]
    by_set = {}
    for r in pending:
        r.compute_q()
        by_set.setdefault(id(r.process_set), []).append(r)
    for group in by_set.values():
        q_group = _QGroup(group, group[0].process_set)
        for index, r in enumerate(group):
            r.handle = (q_group, index)


class LowRankReduction(object):
    """One compressed gradient in flight: P's allreduce started (hook time); compute_q()
    waits for it and computes Q, whose allreduce start_q_reductions() starts with the step's
    other Qs; finish() waits for Q and writes P Q^T into the gradient.

    P and Q are held transposed (r x n, r x m, contiguous): the products then read M row by
    row (Q^T M^T and P^T M run 4-13x faster than M Q and M^T P for a 1024 x 1024 M, r = 4, on
    this machine's BLAS), and a column to orthonormalize is a contiguous row."""

    def __init__(self, comp, name, grad, process_set):
        self.comp, self.name, self.grad, self.process_set = comp, name, grad, process_set
        n, m, r = matrix_rank(grad.shape, comp.matrix_approximation_rank)
        # (a channels-last gradient is worked on as a contiguous copy, written back at the end)
        self.work = grad if grad.is_contiguous() else grad.contiguous()
        self.m_view = self.work.view(n, m)
        # float32 on the CPU at rank <= 4 (every matrix the MLP and CNN benches compress): the
        # core's fused passes (hvd.LowRankStart/Finish, docs/compression.md) instead of torch's.
        self.fused = (comp.fused_passes and grad.dtype == torch.float32 and
                      grad.device.type == "cpu" and r <= 4)
        self.spare = None  # the previous error's buffer, which takes this step's gradient
        error = None
        if comp.use_error_feedback:
            error = comp.errors.get(name)
            if error is None or error.shape != grad.shape:
                error = None
            elif not self.fused:
                self.m_view.add_(error.view(n, m))
        q = comp.qs.get(name) if comp.warm_start else None
        if q is None or q.shape != (m, r) or q.dtype != grad.dtype:
            g = torch.Generator()
            g.manual_seed(q_seed(comp.random_seed, name, comp.iter))
            q = torch.randn(m, r, generator=g, dtype=torch.float32).to(grad.dtype)
            q = q.to(grad.device)
        self.qt = q.t().contiguous()  # (the stored Q^T itself when warm: already contiguous)
        self._orthogonalize(self.qt)
        if self.fused:
            if error is not None and (error.dtype != torch.float32 or not error.is_contiguous()):
                error = error.to(torch.float32).contiguous()  # (as a state may have kept it)
            self.pt = torch.empty(r, n, dtype=torch.float32)
            # M += E and P^T = Q^T M^T in one pass over M
            _core.low_rank_start(self.m_view.data_ptr(),
                                 0 if error is None else error.data_ptr(), self.qt.data_ptr(),
                                 r, n, m, self.pt.data_ptr(), torch.get_num_threads())
            self.spare = error
        else:
            self.pt = torch.mm(self.qt, self.m_view.t())  # (M Q)^T
        self.handle = allreduce_async_(self.pt, name="powersgd.P." + name, op=Sum,
                                       process_set=process_set)
        self.stage = 1

    def _orthogonalize(self, rows):
        """Gram-Schmidt on the rows of P^T or Q^T (the columns of P or Q), in place: in the
        core on the fused path (~0.1 ms a call as torch's operations here)."""
        if self.fused:
            r, n = rows.shape
            _core.low_rank_orthogonalize(rows.data_ptr(), r, n,
                                         float(self.comp.orthogonalization_epsilon))
        else:
            orthogonalize(rows.t(), self.comp.orthogonalization_epsilon)

    def compute_q(self):
        self.pt = synchronize(self.handle)
        self._orthogonalize(self.pt)
        torch.mm(self.pt, self.m_view, out=self.qt)  # (M^T P)^T
        self.handle = None
        self.stage = 2

    def finish(self):
        if self.stage == 1:
            start_q_reductions([self])
        q_group, index = self.handle
        self.qt = q_group.output(index)
        comp = self.comp
        if self.fused:
            result = self._finish_fused()
        else:
            approx = low_rank_product(self.pt, self.qt)  # the gradient: P Q^T
            if comp.use_error_feedback:
                # The error is M - P Q^T: computed in M's own memory, which the error then
                # keeps; the gradient becomes the new tensor (no copy back).
                comp.errors[self.name] = self.m_view.sub_(approx).view(self.grad.shape)
                result = approx.view(self.grad.shape)
            else:
                self.m_view.copy_(approx)
                result = self.work
        if self.work is not self.grad:  # channels-last: back into the gradient's layout
            self.grad.copy_(result)
            result = self.grad
        if comp.warm_start:
            comp.qs[self.name] = self.qt.t()
        self.stage = 3
        return result

    def _finish_fused(self):
        """P Q^T into the gradient and M - P Q^T into M (the new error), in one pass. The
        gradient goes into the previous error's buffer, read in __init__ and free since:
        two buffers take turns and a step allocates none."""
        n, m = self.m_view.shape
        r = self.pt.shape[0]
        keep_error = self.comp.use_error_feedback
        out = self.spare if keep_error else self.m_view  # (into M itself: M = P Q^T, no error)
        if out is None or keep_error and out.data_ptr() == self.m_view.data_ptr():
            out = torch.empty(n, m, dtype=torch.float32)
        _core.low_rank_finish(self.m_view.data_ptr(), self.pt.data_ptr(), self.qt.data_ptr(),
                              r, n, m, out.data_ptr(), torch.get_num_threads())
        self.spare = None
        if not keep_error:
            return self.work
        self.comp.errors[self.name] = self.m_view.view(self.grad.shape)
        return out.view(self.grad.shape)


class PowerSGD(object):
    """PowerSGD compression for ``hvd.DistributedOptimizer(..., compression=...)``; build it with
    ``hvd.Compression.powersgd(...)``. Arguments as PyTorch's ``PowerSGDState``:

    * ``matrix_approximation_rank`` (1): the rank r of each approximation; higher is more
      exact and sends more ((n + m) * r numbers for an n x m gradient);
    * ``start_powerSGD_iter`` (1000): steps averaged exactly before compression starts;
    * ``min_compression_rate`` (2): a matrix is compressed only when that saves more than this
      factor;
    * ``use_error_feedback`` (True), ``warm_start`` (True), ``orthogonalization_epsilon`` (0);
    * ``random_seed`` (0): the seed of the random Qs (the same on every rank);
    * ``adaptive`` (True; not in PyTorch): compress only while it pays. From
      ``start_powerSGD_iter`` on, a probe alternates blocks of exact and compressed steps
      (``PROBE_BLOCKS`` of each, ``PROBE_BLOCK`` steps long, the first step of each block not
      counted) and compares the median step times, each the slowest rank's; the job then
      compresses only if compressed steps were faster. The probe is repeated after
      ``PROBE_INTERVAL`` steps, twice as long after each probe that did not change the
      decision (up to ``PROBE_INTERVAL_MAX``), so a link that gets slower or faster is
      followed. An exact step sends each rank's error with its gradient (and drops it), so
      nothing that error feedback kept is lost. ``adaptive=False``: PyTorch's behaviour,
      compress every step from ``start_powerSGD_iter`` on. ``decisions`` lists each probe's
      (step, compressed ms, exact ms, compress?).

    One instance per optimizer: it keeps each matrix's Q and error, and the step count.
    ``state_dict()`` / ``load_state_dict()`` save them with a checkpoint; ``hvd.elastic.
    TorchState`` commits and restores them (the errors as their mean over the ranks, which is
    all that the averaged gradients depend on, so a job of another size goes on exactly).
    """

    stateful = True
    # float32 CPU matrices at rank <= 4 take the core's fused passes (hvd.LowRankStart and
    # LowRankFinish); False: torch's operations, as before those (for comparison: the bench's
    # "powersgd-unfused").
    fused_passes = True
    PROBE_BLOCK = 3
    PROBE_BLOCKS = 3
    PROBE_INTERVAL = 250
    PROBE_INTERVAL_MAX = 4000

    def __init__(self, matrix_approximation_rank=1, start_powerSGD_iter=1000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0, adaptive=True):
        if int(matrix_approximation_rank) < 1:
            raise ValueError("matrix_approximation_rank must be >= 1, got %r"
                             % (matrix_approximation_rank,))
        if int(start_powerSGD_iter) < 0:
            raise ValueError("start_powerSGD_iter must be >= 0, got %r" % (start_powerSGD_iter,))
        if min_compression_rate < 0 or orthogonalization_epsilon < 0:
            raise ValueError("min_compression_rate and orthogonalization_epsilon must be >= 0")
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = float(orthogonalization_epsilon)
        self.random_seed = int(random_seed)
        self.adaptive = bool(adaptive)
        self.iter = 0
        self.qs = {}
        self.errors = {}
        # The adaptive policy: the decision, when the next probe starts, the interval after it.
        self.compressing = True
        self.next_probe = self.start_powerSGD_iter
        self.probe_interval = self.PROBE_INTERVAL
        self.decisions = []
        self.clock = time.perf_counter  # (tests replace it)
        self._probe_times = {True: [], False: []}
        self._last_step_end = None
        self._process_set = None
        self.numel_before = 0  # of the last compressed step: numbers each rank would send
        self.numel_after = 0   # and what it sent

    # As a Compressor of hvd.allreduce: refused, with the reason.
    @staticmethod
    def compress(tensor):
        raise TypeError("PowerSGD compresses an optimizer's gradients (hvd.DistributedOptimizer"
                        "(..., compression=hvd.Compression.powersgd(...))): it keeps state per "
                        "gradient between steps. hvd.allreduce takes Compression.none, fp16 or "
                        "bf16.")

    decompress = compress

    def _probe_length(self):
        return 2 * self.PROBE_BLOCKS * self.PROBE_BLOCK

    def _mode(self):
        """(compress?, timed for the probe?) of the current step."""
        if self.iter < self.start_powerSGD_iter:
            return False, False
        if not self.adaptive:
            return True, False
        k = self.iter - self.next_probe
        if 0 <= k < self._probe_length():
            block, position = divmod(k, self.PROBE_BLOCK)
            return block % 2 == 1, position > 0
        return self.compressing, False

    def compresses(self, tensor):
        """Whether this gradient travels compressed at the current step."""
        if not self._mode()[0] or tensor.is_sparse:
            return False
        nmr = matrix_rank(tensor.shape, self.matrix_approximation_rank)
        return nmr is not None and should_compress(*nmr, self.min_compression_rate)

    def reduce_async(self, tensor, name, process_set):
        """Starts the reduction of the gradient ``tensor`` (averaged in place): a
        LowRankReduction, or None when it goes uncompressed (the caller averages it; a
        matrix that kept an error from a compressed step sends it with this gradient)."""
        self._process_set = process_set
        if not self.compresses(tensor):
            error = self.errors.pop(name, None)
            if error is not None and error.shape == tensor.shape and not tensor.is_sparse:
                tensor.add_(error)
            return None
        return LowRankReduction(self, name, tensor, process_set)

    def step_done(self, tensors):
        """Called once per optimizer step with every gradient reduced in it."""
        compressed, timed = self._mode()
        now = self.clock()
        if timed and self._last_step_end is not None:
            self._probe_times[compressed].append(now - self._last_step_end)
        self._last_step_end = now
        if compressed:
            before = after = 0
            for t in tensors:
                before += t.numel()
                if self.compresses(t):
                    n, m, r = matrix_rank(t.shape, self.matrix_approximation_rank)
                    after += (n + m) * r
                else:
                    after += t.numel()
            self.numel_before, self.numel_after = before, after
        if (self.adaptive and self.iter >= self.start_powerSGD_iter
                and self.iter - self.next_probe == self._probe_length() - 1):
            self._decide()
        self.iter += 1

    def _decide(self):
        """Ends a probe: the median step time of each kind on each rank, the slowest rank's
        (a maximum: the same bits on every rank, whatever the reduction order), and every
        rank takes the same decision."""
        medians = [statistics.median(self._probe_times[kind]) if self._probe_times[kind]
                   else 0.0 for kind in (True, False)]
        slowest = allreduce(torch.tensor(medians, dtype=torch.float64), op=Max,
                            name="powersgd.probe",
                            process_set=self._process_set or global_process_set)
        compressed_s, exact_s = slowest.tolist()
        compress = compressed_s < exact_s
        if compress == self.compressing:
            self.probe_interval = min(2 * self.probe_interval, self.PROBE_INTERVAL_MAX)
        else:
            self.probe_interval = self.PROBE_INTERVAL
        self.compressing = compress
        self.next_probe = self.iter + 1 + self.probe_interval
        self._probe_times = {True: [], False: []}
        self.decisions.append((self.iter + 1, 1e3 * compressed_s, 1e3 * exact_s, compress))

    def compression_rate(self):
        """Numbers a step would send uncompressed / what it sends (of the last step)."""
        return self.numel_before / self.numel_after if self.numel_after else 1.0

    def state_dict(self):
        return {"iter": self.iter,
                "qs": {k: v.clone() for k, v in self.qs.items()},
                "errors": {k: v.clone() for k, v in self.errors.items()},
                "adaptive": {"compressing": self.compressing, "next_probe": self.next_probe,
                             "probe_interval": self.probe_interval}}

    def load_state_dict(self, state):
        self.iter = int(state["iter"])
        self.qs = {k: v.clone() for k, v in state["qs"].items()}
        self.errors = {k: v.clone() for k, v in state["errors"].items()}
        adaptive = state.get("adaptive")
        if adaptive is not None:  # (a state saved before the adaptive policy: its defaults)
            self.compressing = bool(adaptive["compressing"])
            self.next_probe = int(adaptive["next_probe"])
            self.probe_interval = int(adaptive["probe_interval"])
        # A probe under way starts again (its times were of another world, or another run).
        if self.next_probe <= self.iter < self.next_probe + self._probe_length():
            self.next_probe = self.iter
        self._probe_times = {True: [], False: []}
        self._last_step_end = None

    def _elastic_commit(self, process_set):
        """The state with every error replaced by its mean over the ranks (collective: rank 0's
        names, zeros where a rank has none)."""
        names = broadcast_object(sorted((k, tuple(v.shape), str(v.dtype))
                                        for k, v in self.errors.items()), root_rank=0,
                                 name="powersgd.error_names", process_set=process_set)
        state = self.state_dict()
        if names:
            local = []
            for k, shape, dtype in names:
                e = self.errors.get(k)
                local.append(e.clone() if e is not None and tuple(e.shape) == shape else
                             torch.zeros(shape, dtype=getattr(torch, dtype.split(".")[-1])))
            means = grouped_allreduce(local, name="powersgd.error_mean", op=Average,
                                      process_set=process_set)
            state["errors"] = {k: v for (k, _, _), v in zip(names, means)}
        else:
            state["errors"] = {}
        return state
