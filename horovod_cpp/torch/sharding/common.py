"""What every sharding stage checks and computes over its gradient slices: the gradient checks,
the non-finite flag that AMP's GradScaler reads, clipping by the global norm, and the checks of
saved per-rank state."""
import math

import torch

from horovod_cpp.torch.basics import HorovodNotSupportedError, Max, Sum
from horovod_cpp.torch.collectives import allreduce


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
