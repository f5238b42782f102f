"""DistributedOptimizer, as in horovod.torch.optimizer.

Each parameter's gradient is allreduced as soon as it has been accumulated, so communication
overlaps the rest of the backward pass; ``step()`` waits for the allreduces and then runs the
wrapped optimizer's step.

Gradient readiness comes from ``grad_hooks.register_grad_ready_hook``, which the sharded
optimizers use too: a post-accumulate-grad hook on PyTorch 2.1+, a hook on the parameter's
gradient accumulator node on 1.13.

Reading ``optimizer.param_groups`` while gradients are still being reduced (as
``GradScaler.unscale_``/``GradScaler.step`` and ``optimizer.state_dict()`` do) first waits for
the reductions: a plain ``scaler.step(optimizer)`` then unscales and checks the averaged
gradients, the same on every rank, and ``step()`` does not reduce them a second time.
"""
import os
import warnings
from contextlib import contextmanager

import torch

from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.functions import broadcast_object
from horovod_cpp.torch.basics import Adasum, Average, size
from horovod_cpp.torch.basics import _core
from horovod_cpp.torch.collectives import (_allreduce_in_place, _grouped_allreduce_async,
                                           allreduce_async_, grouped_allreduce_async_,
                                           sparse_allreduce_async)
from horovod_cpp.torch.compression.powersgd import LowRankReduction, start_q_reductions
from horovod_cpp.torch.grad_hooks import register_grad_ready_hook
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.tensor_bridge import in_place_target, process_set_id, synchronize

_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")


def _checked_named_parameters(param_groups, named_parameters):
    """``named_parameters`` as a list of (name, parameter), checked as Horovod checks it (or
    generated names when it is None)."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("allreduce.noname.%s.%s" % (i, j), v)
                            for i, param_group in enumerate(param_groups)
                            for j, v in enumerate(param_group["params"])]
    # make sure that named_parameters are tuples
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    dups = _DistributedOptimizer.find_duplicates([k for k, _ in named_parameters])
    if len(dups) > 0:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         "Found duplicates: %s" % ", ".join(dups))
    all_param_ids = {id(v) for param_group in param_groups for v in param_group["params"]}
    named_param_ids = {id(v) for k, v in named_parameters}
    unnamed_param_ids = all_param_ids - named_param_ids
    if len(unnamed_param_ids):
        raise ValueError("named_parameters was specified, but one or more model parameters "
                         "were not named. Python object ids: "
                         "%s" % ", ".join(str(i) for i in unnamed_param_ids))
    return named_parameters


def _register_hooks(opt):
    """opt._make_hook(p) runs once each parameter's gradient has been accumulated."""
    for param_group in opt.param_groups:
        for p in param_group["params"]:
            if p.requires_grad:
                # No dense zero gradient is preset (as Horovod does not): autograd would
                # accumulate a sparse gradient (nn.Embedding(sparse=True)) into it and
                # densify it, and sparse optimizers (SparseAdam) would then refuse it.
                opt._requires_update.add(p)
                opt._grad_accs.append(register_grad_ready_hook(p, opt._make_hook(p)))


class _DistributedOptimizer(torch.optim.Optimizer):
    _is_horovod_cpp_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        # A stateful compressor (PowerSGD) reduces a gradient itself; the others are a codec
        # around the ordinary allreduce.
        self._powersgd = compression if getattr(compression, "stateful", False) else None
        self._compression = Compression.none if self._powersgd is not None else compression
        if self._powersgd is not None:
            if op != Average:
                raise ValueError("PowerSGD averages gradients: op must be Average")
            if groups is not None:
                raise ValueError("PowerSGD does not take groups: the runtime already fuses "
                                 "neighbouring gradients' P and Q matrices")

        named_parameters = _checked_named_parameters(self.param_groups, named_parameters)

        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: self.backward_passes_per_step
                                 for _, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._sparse_params = set()  # parameters whose gradient has been sparse
        self._wire = {}  # p -> its gradient's wire buffer (fp16/bf16 compression, _compress)
        self._synchronized = False  # the user called synchronize() since the last step()
        self._should_synchronize = True
        self._reduced = False  # every gradient reduced, and no backward pass since
        self._in_flight = False  # a hook has started a reduction that nobody waited for yet
        # Adaptive training (horovod_cpp.torch.adaptive, _measure_gradients): p -> the stats
        # group its gradient's squared norms go into (None: nothing is measured); the gradients
        # measured here rather than by the core (compressed or CUDA ones: p -> local squared
        # norm); and the divisor of the averaged gradient (micro-batches summed per step).
        self._stats_groups = None
        self._framework_measured = {}
        self._gradient_divisor = 1.0
        # Called once per step just before its first gradient reduction starts (adaptive
        # training sends its per-step statistics with the gradients).
        self._before_reductions = None
        self._reductions_started = False

        # groups: an int splits the parameters into that many groups (the split decided on
        # rank 0, so every rank agrees); a list of lists of parameters gives them explicitly.
        self._groups = None
        self._p_to_group = {}
        self._group_counts = {}
        if groups is not None:
            if isinstance(groups, int):
                if groups <= 0:
                    raise ValueError("groups must be a positive int or a list of lists of "
                                     "parameters")
                ordered = [v for _, v in sorted(named_parameters, key=lambda kv: kv[0])
                           if v.requires_grad]
                names = broadcast_object([self._parameter_names[p] for p in ordered], root_rank=0,
                                         name="optimizer.groups", process_set=process_set)
                by_name = {self._parameter_names[p]: p for p in ordered}
                ordered = [by_name[n] for n in names]
                chunk = (len(ordered) + groups - 1) // groups
                groups = [ordered[i:i + chunk] for i in range(0, len(ordered), chunk)]
            elif not (isinstance(groups, list) and all(isinstance(g, list) for g in groups)):
                raise ValueError("groups must be a positive int or a list of lists of parameters")
            self._groups = []
            for group in groups:
                group = [p for p in group if p.requires_grad]
                if not group:
                    continue
                key = tuple(group)
                self._groups.append(key)
                for p in group:
                    self._p_to_group[p] = key
                self._group_counts[key] = 0

        if self.process_set.included() and (size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._in_flight = False
        self._synchronized = False
        self._reduced = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    @staticmethod
    def find_duplicates(lst):
        seen = set()
        dups = set()
        for el in lst:
            if el in seen:
                dups.add(el)
            seen.add(el)
        return dups

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _register_hooks(self):
        _register_hooks(self)

    def _start_reductions(self):
        if not self._reductions_started:
            self._reductions_started = True
            if self._before_reductions is not None:
                self._before_reductions()

    def _allreduce_grad_async(self, p):
        self._start_reductions()
        if p.grad is None:
            # Gradient was not computed, but we still need to submit a tensor to allreduce as
            # one of the other ranks may have computed it (due to dynamic graphs): zeros, of
            # the kind (sparse or dense) this parameter's gradient had before.
            p.grad = p.data.new(p.size()).zero_()
            if p in self._sparse_params and not self.sparse_as_dense:
                p.grad = p.grad.to_sparse()
        name = self._parameter_names.get(p)
        tensor = p.grad
        if p.grad.is_sparse:
            self._sparse_params.add(p)
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return self._sparse_allreduce_grad_async(p, name)
        if self._powersgd is not None:
            work = self._powersgd.reduce_async(tensor, name, self.process_set)
            if work is not None:  # compressed: P's allreduce started
                return work, None
        tensor_compressed, ctx = self._compress(p, tensor)
        prescale_factor, postscale_factor = self._scale_factors()
        group = self._stats_group(p, tensor, tensor_compressed)
        if group >= 0:
            handle = _allreduce_in_place(in_place_target(tensor_compressed, "allreduce_"), name,
                                         self.op, prescale_factor, postscale_factor,
                                         self.process_set, group)
        else:
            handle = allreduce_async_(tensor_compressed, name=name, op=self.op,
                                      prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor,
                                      process_set=self.process_set)
        return handle, ctx

    def _measure_gradients(self, groups):
        """Adaptive training: measure each gradient's squared norms (before and after the
        reduction) into ``groups[p]``, a stats group per parameter (None: stop measuring).
        Taken after each step's reductions by ``_take_gradient_stats``."""
        if groups is not None and self._powersgd is not None:
            raise ValueError("adaptive training measures the exact gradients; it does not work "
                             "with PowerSGD compression")
        self._stats_groups = groups
        self._framework_measured = {}

    def _stats_group(self, p, tensor, wire):
        """The stats group the core measures ``p``'s reduction into, or -1. A gradient sent
        compressed, or on a GPU, is measured here instead: its local norm now, in float64 and
        before compression, its reduced one when taken."""
        if self._stats_groups is None or p not in self._stats_groups:
            return -1
        if wire is not tensor or tensor.device.type != "cpu":
            self._framework_measured[p] = float(
                torch.linalg.vector_norm(tensor, dtype=torch.float64)) ** 2
            return -1
        return self._stats_groups[p]

    def _take_gradient_stats(self):
        """{stats group: [local squared norm, reduced squared norm]} of the gradients reduced
        since the last take; call it once the step's reductions are done."""
        if self._stats_groups is None:
            return {}
        out = {g: [v[0], v[1]]
               for g, v in _core.take_all_grad_stats(process_set_id(self.process_set)).items()}
        for p, local in self._framework_measured.items():
            reduced = float(torch.linalg.vector_norm(p.grad, dtype=torch.float64)) ** 2
            entry = out.setdefault(self._stats_groups[p], [0.0, 0.0])
            entry[0] += local
            entry[1] += reduced
        self._framework_measured = {}
        return out

    def _compress(self, p, tensor):
        """compression.compress(tensor); for a compressor that can (fp16, bf16), into the
        wire buffer kept for ``p``'s dense gradient (see _decompress)."""
        if tensor is p.grad and hasattr(self._compression, "compress_into"):
            wire, ctx = self._compression.compress_into(tensor, self._wire.get(p))
            if wire is not tensor:
                self._wire[p] = wire
            return wire, ctx
        return self._compression.compress(tensor)

    def _decompress(self, p, output, ctx):
        """p.grad = decompress(output, ctx), in place where _compress used a wire buffer."""
        if self._wire.get(p) is output:
            self._compression.decompress_into(output, ctx, p.grad)
        else:
            p.grad.set_(self._compression.decompress(output, ctx))

    def _scale_factors(self):
        """(prescale, postscale) of a gradient allreduce. Average is split into a division
        before and after the sum, to avoid overflow of low-precision types: prescale 1/f,
        postscale f (the core divides by size)."""
        divisor = self._gradient_divisor
        if self.op == Average:
            return 1.0 / (self.gradient_predivide_factor * divisor), \
                self.gradient_predivide_factor
        return 1.0 / divisor, 1.0

    def _grouped_allreduce_grad_async(self, ps):
        self._start_reductions()
        name = self._parameter_names.get(ps[0])
        tensors_compressed, ctxs = zip(*[self._compress(p, p.grad) for p in ps])
        prescale_factor, postscale_factor = self._scale_factors()
        if self._stats_groups is None:
            handle = grouped_allreduce_async_(list(tensors_compressed), name=name, op=self.op,
                                              prescale_factor=prescale_factor,
                                              postscale_factor=postscale_factor,
                                              process_set=self.process_set)
        else:
            groups = [self._stats_group(p, p.grad, t) for p, t in zip(ps, tensors_compressed)]
            targets = [in_place_target(t, "grouped_allreduce_") for t in tensors_compressed]
            handle = _grouped_allreduce_async(targets, targets, name, self.op, prescale_factor,
                                              postscale_factor, self.process_set, groups)
        return handle, ctxs

    def _sparse_allreduce_grad_async(self, p, name):
        handle = sparse_allreduce_async(p.grad, name=name, op=self.op,
                                        process_set=self.process_set)
        return handle, None

    def _make_hook(self, p):
        def hook(*ignore):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            assert not p.grad.requires_grad
            self._reduced = False
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0:
                self._handles[p] = (None, None)  # still accumulating locally
                return
            group = self._p_to_group.get(p)
            self._in_flight = True
            if group is None:
                self._handles[p] = self._allreduce_grad_async(p)
                return
            self._group_counts[group] += 1
            if self._group_counts[group] < len(group):
                self._handles[p] = (None, None)  # waiting for the rest of its group
                return
            for gp in group:
                self._handles.pop(gp, None)
            self._handles[group] = self._grouped_allreduce_grad_async(group)
            self._group_counts[group] = 0

        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those whose hook did not fire, so
        that every rank submits the same set) and writes the results into ``p.grad``."""
        self._synchronized = True
        self._reduce_all()

    @property
    def param_groups(self):
        # Whoever reads the parameter groups while gradients are in flight (GradScaler's
        # unscale_ and inf check, state_dict(), a scheduler) sees them reduced: waiting here
        # keeps the background thread from writing a gradient that is being read.
        if self.__dict__.get("_in_flight"):
            self._reduce_all()
        return self.__dict__["_hvd_param_groups"]

    @param_groups.setter
    def param_groups(self, value):
        self.__dict__["_hvd_param_groups"] = value

    def _reduce_all(self):
        if not self.process_set.included():
            self._reduced = True
            return

        completed = set()
        for x in self._handles.keys():
            completed.update(x) if isinstance(x, tuple) else completed.add(x)
        missing_p = self._requires_update - completed
        if self._groups is not None:
            for group in self._groups:
                if any(p in missing_p for p in group) or \
                        any(p in self._handles and self._handles[p][0] is None for p in group):
                    for p in group:
                        self._handles.pop(p, None)
                        missing_p.discard(p)
                    self._handles[group] = self._grouped_allreduce_grad_async(group)
                    self._group_counts[group] = 0
        for p in missing_p:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)

        if self._powersgd is not None:
            # Every compressed gradient's Q allreduce starts, in one group, before any is
            # waited for.
            start_q_reductions([handle for handle, _ in self._handles.values()
                                if isinstance(handle, LowRankReduction)])
        for p, (handle, ctx) in self._handles.items():
            if isinstance(handle, LowRankReduction):
                output = handle.finish()
                self._allreduce_delay[p] = self.backward_passes_per_step
                if output is not p.grad:  # a new tensor (or a dense copy of a sparse one)
                    p.grad = output.to_sparse() if p.grad.is_sparse else output
                continue
            if isinstance(p, tuple):  # a group
                outputs = synchronize(handle)
                for gp, output, c in zip(p, outputs, ctx):
                    self._allreduce_delay[gp] = self.backward_passes_per_step
                    self._decompress(gp, output, c)
                continue
            if callable(handle):  # sparse
                output = handle()
            else:
                output = synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if p.grad.is_sparse and not self.sparse_as_dense:
                p.grad = output
            elif p.grad.is_sparse:
                p.grad = self._compression.decompress(output, ctx).to_sparse()
            else:
                self._decompress(p, output, ctx)
        self._handles.clear()
        self._in_flight = False
        self._reduced = True
        self._reductions_started = False
        if self._powersgd is not None:
            self._powersgd.step_done([p.grad for p in self._requires_update
                                      if p.grad is not None and not p.grad.is_sparse])

    @contextmanager
    def skip_synchronize(self):
        """A context manager within which ``step()`` does not synchronize (because you called
        ``synchronize()`` yourself, e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
                self._reduce_all()
            elif not self._reduced:
                # (reduced already when param_groups was read after the backward pass, e.g.
                # by GradScaler.step's unscale_)
                self._reduce_all()
        self._synchronized = False
        self._reduced = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() "
                                 "but before optimizer.step() or optimizer.synchronize(). "
                                 "This is prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """``op=hvd.Adasum`` (Horovod's delta optimizer): as soon as a parameter's gradient is
    accumulated, the wrapped optimizer takes that parameter's step locally, and the step's
    change (the delta), not the gradient, is combined over the ranks with Adasum while the
    backward pass goes on; ``step()`` then sets each parameter to where it started plus the
    combined delta. Use the learning rate that suits one rank (docs/adasum.md)."""
    _is_horovod_cpp_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        named_parameters = _checked_named_parameters(self.param_groups, named_parameters)
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False)
                                 for _, p in named_parameters}
        _register_hooks(self)

    def _make_hook(self, p):
        def hook(*ignore):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            self._allreduce_delay[p] -= 1
            self._handles[p] = (self._allreduce_delta_async(p) if self._allreduce_delay[p] == 0
                                else (None, None))
        return hook

    def _allreduce_delta_async(self, p):
        """This parameter's own optimizer step, then its delta's Adasum started (in p)."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        start.data.copy_(p.data)
        try:
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)
        delta, ctx = self._compression.compress(p.data)
        return allreduce_async_(delta, name=self._parameter_names.get(p), op=Adasum), ctx

    def synchronize(self):
        """Nothing to do: Adasum's step() itself waits for the deltas (as in Horovod)."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")
        yield  # pragma: no cover

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        # Parameters whose hook did not fire on this rank still take part (a zero delta).
        for p in self._requires_update - set(self._handles):
            self._handles[p] = (None, None)
        # Every delta is started before any is waited for: a rank that starts one here while
        # another rank started it in its hook must not wait on one the other has not started.
        for p, (handle, _) in list(self._handles.items()):
            if handle is None:  # before backward_passes_per_step passes, or no gradient
                self._handles[p] = self._allreduce_delta_async(p)
        for p, (handle, ctx) in self._handles.items():
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starting_models[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    zero_grad = _DistributedOptimizer.__dict__["zero_grad"]  # refused while deltas are in flight


def _wrapping_class(optimizer_class, wrapper):
    """A class named as ``optimizer_class`` that inherits from it with ``wrapper``'s methods
    (``step()`` with the reductions, ...): the wrapped optimizer stays an instance of its own
    class. Also used to make an optimizer distributed in place (horovod_cpp.torch.adaptive)."""
    return type(optimizer_class.__name__, (optimizer_class,), dict(wrapper.__dict__))


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a torch optimizer so that gradients are averaged over every rank before each step.

    The result is an instance of the wrapped optimizer's own class. Gradients are allreduced
    as soon as they are accumulated, overlapping the backward pass; ``step()`` waits for them.

    Arguments follow horovod.torch: ``named_parameters`` (``model.named_parameters()``, names
    the allreduces), ``compression`` (``Compression.none``, ``fp16``, ``bf16``, or
    ``Compression.powersgd(...)``: low-rank, with error feedback), ``backward_passes_per_step`` (accumulate locally over
    that many backward passes), ``op`` (Average, Sum, or Adasum: each rank steps locally and
    the deltas are combined, as Horovod's Adasum optimizer), ``gradient_predivide_factor``,
    ``groups`` (an int or a list of lists of parameters to allreduce together),
    ``sparse_as_dense``, ``process_set``.
    """
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and size() > 1:
        if process_set is not global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        if size() & (size() - 1):
            raise ValueError("op=Adasum needs a power-of-two number of ranks (as in Horovod); "
                             "this job has %d" % size())
        if getattr(compression, "stateful", False):
            raise ValueError("op=Adasum combines the optimizer's deltas, which PowerSGD does not "
                             "compress; use Compression.none, fp16 or bf16")
        cls = _wrapping_class(optimizer.__class__, _DistributedAdasumOptimizer)
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step)

    cls = _wrapping_class(optimizer.__class__, _DistributedOptimizer)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
