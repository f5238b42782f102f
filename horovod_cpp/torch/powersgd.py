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
  only, so every rank draws the same Q whatever order its hooks run in.

The P of a gradient is computed and its allreduce started by the gradient's hook, during the
backward pass; ``step()`` / ``synchronize()`` then starts every Q's allreduce before waiting
for any, so the runtime fuses the Ps of neighbouring layers into one buffer, and the Qs too.

One difference from DDP's hook, which keeps a single error over a whole bucket: only the
compressed matrices keep an error. For a tensor averaged exactly DDP's error is this rank's
input minus the average, whose sum over the ranks is zero, so it never changes the average
that every rank receives (``tests/python/test_powersgd.py`` checks the trajectory against a
one-process reference of the algorithm).
"""
import torch

from horovod_cpp.torch.mpi_ops import Average, Sum, allreduce_async_, synchronize

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


class _LowRankReduction(object):
    """One compressed gradient in flight: P's allreduce started (hook time); advance() waits
    for it and starts Q's; finish() waits for Q and writes P Q^T into the gradient.

    P and Q are held transposed (r x n, r x m, contiguous): the products then read M row by
    row (Q^T M^T and P^T M run 4-13x faster than M Q and M^T P for a 1024 x 1024 M, r = 4, on
    this machine's BLAS), and a column to orthonormalize is a contiguous row."""

    def __init__(self, comp, name, grad, process_set):
        self.comp, self.name, self.grad, self.process_set = comp, name, grad, process_set
        n, m, r = matrix_rank(grad.shape, comp.matrix_approximation_rank)
        # (a channels-last gradient is worked on as a contiguous copy, written back at the end)
        self.work = grad if grad.is_contiguous() else grad.contiguous()
        self.m_view = self.work.view(n, m)
        if comp.use_error_feedback:
            error = comp.errors.get(name)
            if error is not None and error.shape == grad.shape:
                self.m_view.add_(error.view(n, m))
        q = comp.qs.get(name) if comp.warm_start else None
        if q is None or q.shape != (m, r) or q.dtype != grad.dtype:
            g = torch.Generator()
            g.manual_seed(q_seed(comp.random_seed, name, comp.iter))
            q = torch.randn(m, r, generator=g, dtype=torch.float32).to(grad.dtype)
            q = q.to(grad.device)
        self.qt = q.t().contiguous()  # (the stored Q^T itself when warm: already contiguous)
        orthogonalize(self.qt.t(), comp.orthogonalization_epsilon)
        self.pt = torch.mm(self.qt, self.m_view.t())  # (M Q)^T
        self.handle = allreduce_async_(self.pt, name="powersgd.P." + name, op=Sum,
                                       process_set=process_set)
        self.stage = 1

    def advance(self):
        if self.stage != 1:
            return
        self.pt = synchronize(self.handle)
        orthogonalize(self.pt.t(), self.comp.orthogonalization_epsilon)
        torch.mm(self.pt, self.m_view, out=self.qt)  # (M^T P)^T
        self.handle = allreduce_async_(self.qt, name="powersgd.Q." + self.name, op=Average,
                                       process_set=self.process_set)
        self.stage = 2

    def finish(self):
        self.advance()
        self.qt = synchronize(self.handle)
        comp = self.comp
        approx = torch.mm(self.pt.t(), self.qt)  # the gradient: P Q^T
        if comp.use_error_feedback:
            # The error is M - P Q^T: computed in M's own memory, which the error then keeps;
            # the gradient becomes the new tensor (no copy back).
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


class PowerSGD(object):
    """PowerSGD compression for ``hvd.DistributedOptimizer(..., compression=...)``; build it with
    ``hvd.Compression.powersgd(...)``. Arguments as PyTorch's ``PowerSGDState``:

    * ``matrix_approximation_rank`` (1): the rank r of each approximation; higher is more
      exact and sends more ((n + m) * r numbers for an n x m gradient);
    * ``start_powerSGD_iter`` (1000): steps averaged exactly before compression starts;
    * ``min_compression_rate`` (2): a matrix is compressed only when that saves more than this
      factor;
    * ``use_error_feedback`` (True), ``warm_start`` (True), ``orthogonalization_epsilon`` (0);
    * ``random_seed`` (0): the seed of the random Qs (the same on every rank).

    One instance per optimizer: it keeps each matrix's Q and error, and the step count.
    ``state_dict()`` / ``load_state_dict()`` save them with a checkpoint; ``hvd.elastic.
    TorchState`` commits and restores them (the errors as their mean over the ranks, which is
    all that the averaged gradients depend on, so a job of another size goes on exactly).
    """

    stateful = True

    def __init__(self, matrix_approximation_rank=1, start_powerSGD_iter=1000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0):
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
        self.iter = 0
        self.qs = {}
        self.errors = {}
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

    def compresses(self, tensor):
        """Whether this gradient travels compressed at the current step."""
        if self.iter < self.start_powerSGD_iter or tensor.is_sparse:
            return False
        nmr = matrix_rank(tensor.shape, self.matrix_approximation_rank)
        return nmr is not None and should_compress(*nmr, self.min_compression_rate)

    def reduce_async(self, tensor, name, process_set):
        """Starts the reduction of the gradient ``tensor`` (averaged in place): a
        _LowRankReduction, or None when it goes uncompressed (the caller averages it)."""
        if not self.compresses(tensor):
            return None
        return _LowRankReduction(self, name, tensor, process_set)

    def step_done(self, tensors):
        """Called once per optimizer step with every gradient reduced in it."""
        if self.iter >= self.start_powerSGD_iter:
            before = after = 0
            for t in tensors:
                before += t.numel()
                if self.compresses(t):
                    n, m, r = matrix_rank(t.shape, self.matrix_approximation_rank)
                    after += (n + m) * r
                else:
                    after += t.numel()
            self.numel_before, self.numel_after = before, after
        self.iter += 1

    def compression_rate(self):
        """Numbers a step would send uncompressed / what it sends (of the last step)."""
        return self.numel_before / self.numel_after if self.numel_after else 1.0

    def state_dict(self):
        return {"iter": self.iter,
                "qs": {k: v.clone() for k, v in self.qs.items()},
                "errors": {k: v.clone() for k, v in self.errors.items()}}

    def load_state_dict(self, state):
        self.iter = int(state["iter"])
        self.qs = {k: v.clone() for k, v in state["qs"].items()}
        self.errors = {k: v.clone() for k, v in state["errors"].items()}

    def _elastic_commit(self, process_set):
        """The state with every error replaced by its mean over the ranks (collective: rank 0's
        names, zeros where a rank has none)."""
        from horovod_cpp.torch.functions import broadcast_object
        from horovod_cpp.torch.mpi_ops import grouped_allreduce
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
