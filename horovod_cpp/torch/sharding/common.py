"""What every sharding stage checks and computes over its gradient slices: the gradient checks,
the non-finite flag that AMP's GradScaler reads, clipping by the global norm, the gradient
statistics of adaptive training, and the checks of saved per-rank state."""
import math

import torch

from horovod_cpp.torch.basics import HorovodNotSupportedError, Max, Sum, _core
from horovod_cpp.torch.collectives import allreduce
from horovod_cpp.torch.tensor_bridge import process_set_id


def check_gradient(p, name, passes, backward_passes_per_step, who):
    """Refuses a sparse gradient, and one more backward pass than backward_passes_per_step."""
    if p.grad.is_sparse:
        raise HorovodNotSupportedError("%s: the gradient of %s is sparse" % (who, name))
    if passes >= backward_passes_per_step:
        raise AssertionError(
            "Gradients were computed more than backward_passes_per_step times "
            "before call to step(). Increase backward_passes_per_step to "
            "accumulate gradients locally.")


def nonfinite_flag_grad(grads, process_set, name):
    """Collective: the gradient of the optimizer's 1-element finite flag: +inf when any rank's
    ``grads`` (its slices) hold a non-finite value, 0 otherwise (one 4-byte allreduce)."""
    nonfinite = False
    for g in grads:
        if g is not None and g.numel():
            # One pass: a non-finite element makes the sum non-finite (summed in fp32 at
            # least, so that finite half-precision values cannot overflow it).
            total = g.sum(dtype=torch.float32 if g.element_size() < 4 else g.dtype)
            if not bool(torch.isfinite(total)):
                nonfinite = True
                break
    flag = allreduce(torch.tensor([1.0 if nonfinite else 0.0]), op=Max, name=name,
                     process_set=process_set)
    return torch.full((1,), math.inf) if flag.item() > 0 else torch.zeros(1)


class SliceStats(object):
    """Adaptive training's gradient statistics for a sharded optimizer (the interface of
    ``DistributedOptimizer._measure_gradients`` / ``_take_gradient_stats``), per flat buffer:

    * local: the core measures each flat's input as it reduces it, every backward pass (a
      pass's own gradient: ``local_per_pass``), times ``scale`` (size^2 where the flat was
      divided by the number of ranks before the reduction); a compressed flat is measured
      here before compression;
    * reduced: each rank's slices of the reduced gradient, measured here (1/size of the
      data) and summed over the ranks by one allreduce of one float64 per flat.

    The slices' gradients are the sums over the passes (``sums_passes``)."""

    local_per_pass = True
    sums_passes = True

    def __init__(self):
        self.on = False
        self._scale = {}       # flat -> what its measured local norm is multiplied by
        self._framework = {}   # flat -> local squared norm measured here (compressed flats)

    def group(self, index, scale, full, wire):
        """The stats group of flat ``index``'s reduction of ``full`` sent as ``wire``
        (``scale``: see above): its index, or -1 when not measuring or measured here."""
        if not self.on:
            return -1
        self._scale[index] = scale
        if wire is not full or full.device.type != "cpu":
            self._framework[index] = self._framework.get(index, 0.0) + scale * float(
                torch.linalg.vector_norm(full, dtype=torch.float64)) ** 2
            return -1
        return index

    def take(self, slices, process_set, name):
        """{flat: [local, reduced]} (collective); ``slices``: [(flat, its slice's gradient)]."""
        core = _core.take_all_grad_stats(process_set_id(process_set))
        mine = torch.tensor([float(torch.linalg.vector_norm(g, dtype=torch.float64)) ** 2
                             if g is not None and g.numel() else 0.0 for _, g in slices],
                            dtype=torch.float64)
        reduced = allreduce(mine, op=Sum, name=name, process_set=process_set).tolist() \
            if len(slices) else []
        out = {}
        for (index, _), r in zip(slices, reduced):
            local = core.get(index, (0.0,))[0] * self._scale.get(index, 1.0)
            out[index] = [local + self._framework.get(index, 0.0), r]
        self._framework = {}
        return out


def clip_slices_by_global_norm(grads, max_norm, norm_type, process_set, name):
    """Collective: clips every rank's gradient slices by the norm of the whole gradient (as
    ``torch.nn.utils.clip_grad_norm_`` would, unsharded) and returns that norm."""
    norm_type = float(norm_type)
    grads = [g for g in grads if g is not None]
    if norm_type == math.inf:
        local = max([float(g.abs().max()) for g in grads if g.numel()] or [0.0])
        total = allreduce(torch.tensor([local], dtype=torch.float64), op=Max, name=name,
                          process_set=process_set)[0]
    else:
        local = sum(float(torch.linalg.vector_norm(g.double(), norm_type)) ** norm_type
                    for g in grads if g.numel())
        total = allreduce(torch.tensor([local], dtype=torch.float64), op=Sum, name=name,
                          process_set=process_set)[0]
        total = total ** (1.0 / norm_type)
    coef = float(max_norm) / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    dtypes = {g.dtype for g in grads}
    return total.to(dtypes.pop() if len(dtypes) == 1 else torch.float32)



def is_element_state(value, shard):
    """State that has one value per element of the slice (momentum, exp_avg), as opposed to
    scalars (Adam's step)."""
    return torch.is_tensor(value) and value.dim() == 1 and value.shape == shard.shape



def check_saved_ranks(saved, what):
    """The saved per-rank dicts, sorted by rank, checked to be one whole job's."""
    saved = sorted(saved, key=lambda sd: sd["rank"])
    sizes = {sd["world_size"] for sd in saved}
    if len(sizes) != 1 or [sd["rank"] for sd in saved] != list(range(sizes.pop())):
        raise ValueError("%s: give the dicts of every rank of the saved job (got ranks %s of "
                         "world sizes %s)" % (what, [sd["rank"] for sd in saved],
                                              sorted({sd["world_size"] for sd in saved})))
    return saved
