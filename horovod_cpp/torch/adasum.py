"""Adasum (``op=hvd.Adasum``) on CPU tensors: every rank gathers every rank's tensor and
computes the same pairwise tree."""
import torch

from horovod_cpp.torch.basics import HorovodInternalError, HorovodNotSupportedError, _core
from horovod_cpp.torch.tensor_bridge import (check_tensor, describe, op_name, process_set_id,
                                             register)

# Maleki et al., "Scaling Distributed Training with Adaptive Summation" (arXiv 2006.02924), with
# Horovod's semantics: the ranks' tensors combined pairwise up a binary tree over the rank
# order (ranks 2i and 2i+1, then those results 4i and 4i+2, ...), each tensor of a group on its
# own, dot products in float64, a power-of-two number of ranks. Every rank gathers every rank's
# tensor through the core's fused allgather (MPI or Gloo) and computes the same tree in the same
# order, so all hold the same bits; that sends N times the bytes of Horovod's vector-halving,
# distance-doubling exchange (docs/differences.md).
_SQRT_DBL_MIN = 1.4916681462400413e-154  # sqrt(DBL_MIN): below it a norm counts as zero


def adasum_pair(a, b):
    """Adaptive sum of two tensors of one shape: (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b.
    Orthogonal gradients are summed, equal ones averaged; a zero tensor's coefficient is 1."""
    a64, b64 = a.reshape(-1).double(), b.reshape(-1).double()
    dot, anormsq, bnormsq = (float(torch.dot(a64, b64)), float(torch.dot(a64, a64)),
                             float(torch.dot(b64, b64)))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _SQRT_DBL_MIN else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _SQRT_DBL_MIN else 1.0
    return a * acoeff + b * bcoeff


def adasum_tree(rows):
    rows, distance = list(rows), 1
    while distance < len(rows):
        for i in range(0, len(rows), 2 * distance):
            rows[i] = adasum_pair(rows[i], rows[i + distance])
        distance *= 2
    return rows[0]


def adasum_async(tensors, outputs, name, prescale_factor, postscale_factor, process_set,
                  prefix, grouped):
    ranks = process_set.size()
    if ranks & (ranks - 1):
        raise ValueError("Adasum needs a power-of-two number of ranks (as in Horovod); %s has "
                         "%d" % ("the job" if process_set.process_set_id == 0 else
                                 "this process set", ranks))
    for t in tensors:
        check_tensor(t, prefix)
        if not t.is_floating_point():
            raise ValueError("Adasum reduces floating-point tensors, got %s" % t.dtype)
        if t.device.type != "cpu":
            raise HorovodNotSupportedError("horovod_cpp's Adasum takes CPU tensors (got %s)"
                                           % t.device)
    rows = [(t * prescale_factor if prescale_factor != 1.0 else t).reshape(1, -1).contiguous()
            for t in tensors]
    handle = _core.grouped_allgather_async([describe(r) for r in rows], op_name(prefix, name),
                                           process_set_id(process_set))

    def finish(gathered):
        for rows_of_all, out in zip(gathered, outputs):
            if rows_of_all.shape[0] != ranks:
                raise HorovodInternalError("Adasum: %d of %d ranks contributed (a rank has "
                                           "joined; Adasum does not take joined ranks)"
                                           % (rows_of_all.shape[0], ranks))
            half = rows_of_all.dtype not in (torch.float32, torch.float64)
            result = adasum_tree((rows_of_all.float() if half else rows_of_all).unbind(0))
            if postscale_factor != 1.0:
                result = result * postscale_factor
            out.copy_(result.view(out.shape))
        return outputs if grouped else outputs[0]

    return register(handle, "adasum", rows, finish, None)

