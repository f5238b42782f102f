"""How DistributedGradientTape and Keras's DistributedOptimizer reduce a step's gradients,
whatever the framework: sparse ones gathered (or densified), dense ones in grouped allreduces
(``num_groups``/``groups`` split them), each scaled as Horovod scales it. The framework comes
in as a ``GradientOps`` (horovod_cpp.tensorflow's, horovod_cpp.torch's)."""
from horovod_cpp.common.basics import Adasum, Average, Sum, _core
from horovod_cpp.common.process_sets import global_process_set


class GradientOps:
    """What a framework lends the reducer: ``grouped_allreduce(tensors, op, prescale,
    postscale, name, compression, process_set)``, ``is_sparse(g)``, ``densify(g)`` and
    ``scale(g, factor)``."""

    def __init__(self, grouped_allreduce, is_sparse, densify, scale, none_compression):
        self.grouped_allreduce = grouped_allreduce
        self.is_sparse = is_sparse
        self.densify = densify
        self.scale = scale
        self.none_compression = none_compression


def split_into_groups(indices, num_groups=0, groups=None, variables=None):
    """The positions ``indices`` split as Horovod's ``num_groups`` (that many groups of
    consecutive gradients) or ``groups`` (lists of variables, each reduced together; the
    others one group of their own each)."""
    if groups is not None:
        if num_groups:
            raise ValueError("pass num_groups or groups, not both")
        if not isinstance(groups, (list, tuple)) or not all(
                isinstance(g, (list, tuple)) for g in groups):
            raise ValueError("groups must be a list of lists of variables")
        position = {id(v): i for i, v in enumerate(variables or [])}
        taken, result = set(), []
        for group in groups:
            members = [position[id(v)] for v in group if id(v) in position]
            members = [i for i in members if i in indices and i not in taken]
            taken.update(members)
            if members:
                result.append(members)
        result.extend([i] for i in indices if i not in taken)
        return result
    if num_groups and num_groups > 0:
        n = len(indices)
        per, extra = divmod(n, num_groups)
        result, start = [], 0
        for g in range(min(num_groups, n)):
            end = start + per + (1 if g < extra else 0)
            result.append(indices[start:end])
            start = end
        return result
    return [list(indices)] if indices else []


class DistributedReducer:
    """Reduces a list of gradients (None entries stay None) as DistributedGradientTape and
    Keras's DistributedOptimizer do: sparse ones gathered or densified, dense ones in grouped
    allreduces, each gradient scaled as Horovod scales it (``gradient_predivide_factor``:
    divided by it before the sum and by size/it after; ``scale_local_gradients``: the
    gradients of variables registered with ``register_local_source`` are not reduced and are
    divided by the size when set)."""

    def __init__(self, ops, name, compression=None, sparse_as_dense=False, op=Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None,
                 process_set=global_process_set, scale_local_gradients=True):
        if op == Adasum:
            raise ValueError("%s: Adasum is not implemented here; use op=hvd.Average or hvd.Sum"
                             % name)
        if op not in (Average, Sum):
            raise ValueError("%s: op must be hvd.Average or hvd.Sum, got %r" % (name, op))
        self.ops = ops
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        self.name = name
        self.compression = compression if compression is not None else ops.none_compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.predivide = float(gradient_predivide_factor)
        self.num_groups = num_groups
        self.groups = groups
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.local_sources = set()

    def register_local_source(self, var):
        """A variable whose gradient stays local (Horovod's ``register_local_source``)."""
        self.local_sources.add(id(var))

    def _size(self):
        ps = self.process_set
        return _core.size() if ps.process_set_id == 0 else ps.size()

    def reduce(self, grads, variables=None):
        grads = list(grads)
        out = list(grads)
        variables = list(variables) if variables is not None else [None] * len(grads)
        reduced = []
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            if v is not None and id(v) in self.local_sources:
                if self.scale_local_gradients and self.op == Average:
                    out[i] = self.ops.scale(g, 1.0 / self._size())
                continue
            if self.sparse_as_dense and self.ops.is_sparse(g):
                out[i] = g = self.ops.densify(g)
            reduced.append(i)
        if not reduced:
            return out
        op, pre, post = self.op, 1.0, 1.0
        if self.op == Average and self.predivide != 1.0:
            op, pre, post = Sum, 1.0 / self.predivide, self.predivide / self._size()
        for n, members in enumerate(split_into_groups(reduced, self.num_groups, self.groups,
                                                      variables)):
            name = "%s.%d.%d" % (self.name, n, len(members))
            results = self.ops.grouped_allreduce([out[i] for i in members], op, pre, post, name,
                                                 self.compression, self.process_set)
            for i, r in zip(members, results):
                out[i] = r
        return out




__all__ = ["GradientOps", "DistributedReducer", "split_into_groups"]
