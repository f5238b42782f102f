"""AdaptiveDataParallel: the controller of adaptive training, with AdaptDL's name and arguments.

It wraps a model and its optimizer (a plain torch optimizer becomes a horovod_cpp
``DistributedOptimizer`` in place, so the user's own object keeps working, as AdaptDL's scripts
expect), and on every optimizer step:

1. waits for the gradient reductions, takes the squared norms the core measured during them
   (``meter``), and starts one small asynchronous allreduce that averages this rank's local
   norm and step times over the ranks; the result is used at the next step, so it never waits
   on the network;
2. scales the learning rate by the scaling rule's factor inside ``step()`` only (schedulers
   keep seeing their base rate) and counts progress in steps at the initial batch size;
3. at the loader's next step boundary (``begin_step``), every ``decide_every`` steps and on the
   first step after the world's size changed, picks the global batch, the per-rank micro-batch
   and the accumulation steps that maximise goodput (``horovod_cpp.adaptive.goodput``).

Every rank decides alike without a broadcast: the noise scale and the throughput profile are
built from values averaged over the ranks (the same bits everywhere), and the throughput fit,
which runs on a background thread, is applied at the first step at which every rank reported
it finished (a flag in the averaged values).
"""
import contextlib
import math
import threading
import time
import types

import torch

from horovod_cpp.adaptive import hints as _hints
from horovod_cpp.adaptive.goodput import GoodputModel
from horovod_cpp.adaptive.memory import MemoryModel
from horovod_cpp.adaptive.noise import NoiseScale
from horovod_cpp.adaptive.scaling import AdamScale, AdaScale, LEGWScale
from horovod_cpp.adaptive.throughput import Profile
from horovod_cpp.torch.basics import Average, Max, _core, cross_size, rank, size
from horovod_cpp.torch.collectives import allreduce, allreduce_async
from horovod_cpp.torch.compression import Compression
from horovod_cpp.torch.optimizer import _DistributedOptimizer, _wrapping_class
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.tensor_bridge import synchronize
from horovod_cpp.torch.adaptive.context import CONTEXT, Progress
from horovod_cpp.torch.adaptive.memory import NO_CEILING, MemoryControl, least
from horovod_cpp.torch.adaptive.meter import GradientMeter

_ADAM = (torch.optim.Adam, torch.optim.AdamW)


def _distributed(optimizer, model, process_set):
    """``optimizer`` itself, made a horovod_cpp DistributedOptimizer if it is not one yet (its
    class swapped in place: a scheduler made over it keeps working on the same object)."""
    if getattr(optimizer, "_is_horovod_cpp_distributed", False) or \
            hasattr(optimizer, "_gradient_slices"):  # (a ShardedOptimizer, stages 1-3)
        return optimizer
    if optimizer.state:
        raise ValueError("AdaptiveDataParallel needs an optimizer that has not stepped yet (it "
                         "makes it a DistributedOptimizer in place)")
    groups = optimizer.__dict__.pop("param_groups")
    base = optimizer.__class__
    optimizer.__class__ = _wrapping_class(base, _DistributedOptimizer)
    _DistributedOptimizer.__init__(optimizer, groups, list(model.named_parameters()),
                                   Compression.none, 1, Average, 1.0, None, False, process_set)
    return optimizer


class AdaptiveState(object):
    """What adaptive training keeps across an elastic reset and in a checkpoint: the epoch and
    the loaders' positions, the noise-scale average, the throughput profile, the progress and
    the chosen configuration. Plain numbers (loads with ``torch.load(weights_only=True)``).
    ``hvd.elastic.TorchState(model, optimizer)`` picks it up from an AdaptiveDataParallel
    model by itself."""

    def __init__(self, controller):
        self._c = controller

    def state_dict(self):
        c = self._c
        return {"progress": CONTEXT.progress.state_dict(),
                "noise": c.noise.state_dict() if c.noise is not None else None,
                "profile": c.profile.state_dict(), "steps": int(c.steps),
                "scale_progress": float(c.scale_progress),
                "config": ([int(c.atomic_bsz), int(c.accumulation_steps)]
                           if c.atomic_bsz is not None else None),
                "ranks": c._ranks, "since_decision": int(c._since_decision),
                "memory": c.memory.state_dict() if c.memory is not None else None,
                "perf": list(c._perf) if c._perf is not None else None,
                "oom_ceiling": c.oom_ceiling, "largest_fit": c.largest_fit}

    def load_state_dict(self, state):
        c = self._c
        CONTEXT.progress.load_state_dict(state["progress"])
        if state["noise"] is not None:
            c.noise = c.noise or NoiseScale(state["noise"]["horizon"])
            c.noise.load_state_dict(state["noise"])
        c.profile.load_state_dict(state["profile"])
        c.steps = int(state["steps"])
        c.scale_progress = float(state["scale_progress"])
        if state["config"] is not None:
            c.atomic_bsz, c.accumulation_steps = (int(x) for x in state["config"])
        # The world size the configuration was chosen for: a rank that joins in a resize
        # then sees the change as the others do, and every rank chooses again.
        c._ranks = state["ranks"]
        c._since_decision = int(state["since_decision"])
        c._perf = tuple(state["perf"]) if state["perf"] is not None else None
        if state.get("memory") is not None:
            c.memory = c.memory or MemoryModel(1.0, 0.0)
            c.memory.load_state_dict(state["memory"])
            if c._own_memory is None:  # (a rank that joins: the mean's, until it has its own)
                c._own_memory = (c.memory.budget, c.memory.base)
        # What is known of the memory (the least micro-batch that ran out, the largest that
        # completed a step) is kept where it is better than the saved: a rank rolling back
        # after running out keeps what it learned, and the ranks agree at their next step
        # (_agree_after_reset).
        c.oom_ceiling = least(c.oom_ceiling, state.get("oom_ceiling"))
        c.largest_fit = max(c.largest_fit or 0, state.get("largest_fit") or 0) or None
        c._fit = None  # a fit in flight on some ranks only: every rank starts the next alike
        c._hosts_unknown = True  # (counted again at the first step, by every rank)
        c._forget_pending()


class AdaptiveDataParallel(MemoryControl, torch.nn.Module):
    """Wraps ``model`` for adaptive training; ``optimizer`` (a torch optimizer or an
    ``hvd.DistributedOptimizer``) then steps with the learning rate scaled for the current
    batch size. ``scaling_rule``: AdaScale (default), AdamScale (default for Adam and AdamW),
    LinearScale, SqrtScale or LEGWScale. ``mp_scaler``: the ``torch.cuda.amp.GradScaler`` /
    ``torch.amp.GradScaler`` in use, whose scale is divided out of the measured norms.
    ``decide_every``: steps between batch-size decisions (always on the first step after a
    resize). ``horizon_samples``: the noise scale's averaging horizon (default: 1000 steps at
    the initial batch size, AdaptDL's smoothing of 0.999 per step). ``lr_scheduler`` and ``name`` are accepted for AdaptDL
    compatibility (the scheduler steps as the user calls it)."""

    def __init__(self, model, optimizer, lr_scheduler=None, mp_scaler=None, scaling_rule=None,
                 name="adaptdl-dataparallel", process_set=global_process_set, decide_every=20,
                 horizon_samples=None):
        super().__init__()
        self.module = model
        if scaling_rule is None:
            scaling_rule = AdamScale() if isinstance(optimizer, _ADAM) else AdaScale()
        self.scaling_rule = scaling_rule
        self.optimizer = _distributed(optimizer, model, process_set)
        self.lr_scheduler = lr_scheduler
        self.mp_scaler = mp_scaler
        self.name = name
        self.process_set = process_set
        self.decide_every = int(decide_every)
        self._horizon = horizon_samples
        self._sharded = hasattr(self.optimizer, "_gradient_slices")
        # (the Adam preconditioner weights a DistributedOptimizer's parameters, a
        # ShardedOptimizer's buckets or flats: what the core measures separately)
        self.meter = GradientMeter(self.optimizer, precondition=isinstance(
            scaling_rule, AdamScale), process_set=process_set)
        self.meter.start()
        self.optimizer._before_reductions = self._flush
        self.noise = None
        self.profile = Profile()
        self.steps = 0               # optimizer steps taken
        self.scale_progress = 0.0    # steps at the initial batch size they are worth
        self.atomic_bsz = None       # the configuration (None until a loader sets it up)
        self.accumulation_steps = 0
        self.lr_factor = 1.0
        self.gain = 1.0
        self._ranks = None           # the world size the configuration was chosen for
        self._perf = None            # the fitted PerfParams, once a fit has been applied
        self._fit = None             # [thread, result] of the fit under way
        self._outbox = None          # a step's values to average, not yet sent (_send)
        self._pending = None         # (handle, what they belong to): sent, not yet received
        self._since_decision = 0
        self._step_start = None      # when the loader began the step being drawn
        self._timed_config = None    # the configuration of the last step drawn
        self._stepped = True         # the optimizer stepped since the last step boundary
        self._step_norms = None      # this step's (local, global) squared norms
        # The resizes this process saw: step, sizes, when noticed, and when the first step at
        # the new size ended with which configuration.
        self.resizes = []
        self.memory = None           # the micro-batch memory model (no upper bound given)
        self._own_memory = None      # (this rank's budget, its base): the model's are the mean
        self._last_step_wall = None  # when the last step ended (time.time())
        self._resettable = True      # the memory high-water mark can be reset (_peak_memory)
        self.oom_ceiling = None      # the least micro-batch that ran out of memory (or None)
        self.largest_fit = None      # the largest micro-batch that completed a step
        self._in_flight = None       # the largest micro-batch of the step being drawn
        self._step_loader = None     # the loader that draws it
        self.out_of_memory = []      # this process's back-offs: step, micro-batch, limit, at
        self._hosts = 1              # hosts of the job (_agree_after_reset)
        self._hosts_unknown = True
        self.predicted_goodput = None
        self._hints_sent = None      # when rank 0 last sent goodput hints (_publish_hints)
        self.adaptive_state = AdaptiveState(self)
        self._hvd_adaptive_state = self.adaptive_state  # found by hvd.elastic.TorchState
        self._patch_optimizer()
        if CONTEXT.controller is not None:  # one controller at a time: the old one's last
            CONTEXT.controller._forget_pending()  # values are waited for, then it is done
        CONTEXT.controllers += 1
        self._stats_name = "adaptive.stats.%d" % CONTEXT.controllers  # the same on every rank
        self.meter.name = self._stats_name + ".preconditioner"
        CONTEXT.controller = self
        CONTEXT.progress = Progress()  # a new job: epoch 0 (a restore loads the saved one)

    # ---- the model ------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # ---- configuration --------------------------------------------------------------------

    def _setup(self, loader):
        """The first configuration: the initial batch split over the ranks, no accumulation."""
        if self.noise is None:
            horizon = self._horizon or 1000 * loader.batch_size
            self.noise = NoiseScale(horizon)
        if self.atomic_bsz is None:
            self.atomic_bsz = max(1, math.ceil(loader.batch_size / size()))
            self.accumulation_steps = 0
        bounds = loader.local_bsz_bounds or (None, None)
        if self.memory is None and loader.max_batch_size is not None and bounds[1] is None:
            # No upper bound given: the largest micro-batch that fits, learned from the peaks.
            budget = loader.memory_budget or self._default_budget()
            if budget is not None:
                self._peak_memory()  # (resets the mark: the first step's peak is its own)
                self.memory = MemoryModel(budget, base=self._current_memory(),
                                          monotone=not self._resettable)
                self._own_memory = (self.memory.budget, self.memory.base)

    def begin_step(self, loader):
        """The loader is about to draw a step: (atomic_bsz, accumulation_steps) for it, chosen
        again here when it is time to (see the module's docstring)."""
        self._setup(loader)
        self._in_flight = None
        self._step_loader = loader
        if not self._stepped:
            self.meter.discard()  # the last step did not happen (AMP skipped it)
        self._stepped = False
        ranks = size()
        resized = self._ranks is not None and ranks != self._ranks
        if resized:
            self._forget_pending()
            self.meter.reset()
            if self.memory is not None:
                self._peak_memory()  # (the old size's steps are not the new size's peak)
            self.resizes.append({"step": self.steps, "from": self._ranks, "to": ranks,
                                 "at": time.time(), "last_step": self._last_step_wall})
        self._ranks = ranks
        if self._hosts_unknown:
            self._agree_after_reset()
        limit = self.oom_limit()
        over = limit is not None and self.atomic_bsz > limit
        if loader.max_batch_size is None:
            self.atomic_bsz = max(1, math.ceil(loader.batch_size / ranks))
            self.accumulation_steps = 0
            if self.oom_ceiling is not None:  # (else the loader's own bounds do not apply)
                self._cap(loader)
        elif resized or over or self._since_decision >= self.decide_every:
            self._decide(loader, force=resized or over)
        if _hints.active() and rank() == 0:
            self._publish_hints(loader)
        # The step is timed from here (its data loading included) to the end of its optimizer
        # step, as AdaptDL does: whatever the loop does between steps (evaluation, logging, a
        # checkpoint, a barrier) is not the configuration's cost. The first step of a
        # configuration is not timed (the allocator's first allocations at a new size).
        config = (ranks, self.atomic_bsz, self.accumulation_steps)
        self._step_start = time.perf_counter() if config == self._timed_config else None
        self._timed_config = config
        return self.atomic_bsz, self.accumulation_steps

    def _agree_after_reset(self):
        """Collective, at the first step after a start or a reset on every rank alike: the
        hosts of the job (cross_size() is per rank: a host with more ranks than the others
        gives its extra ranks a smaller one; every host has a local rank 0, so the largest is
        the count), the same on every rank, as the goodput model needs it to be; the least
        micro-batch that ran out of memory on any rank (a rank that ran out knows it alone
        until here) and the largest that completed a step."""
        mine = self.oom_ceiling if self.oom_ceiling is not None else NO_CEILING
        got = allreduce(torch.tensor([cross_size(), -mine, self.largest_fit or 0],
                                     dtype=torch.int64), op=Max,
                        name=self._stats_name + ".hosts", process_set=self.process_set)
        self._hosts = max(1, int(got[0].item()))
        ceiling = -int(got[1].item())
        self.oom_ceiling = ceiling if ceiling < NO_CEILING else None
        self.largest_fit = int(got[2].item()) or None
        self._hosts_unknown = False

    def configure_step(self, accumulation_steps):
        """The step about to be drawn has ``accumulation_steps + 1`` micro-batches per rank
        (fewer than chosen in an epoch's last, short step): the optimizer reduces after that
        many backward passes and divides their sum by their number."""
        self.optimizer.set_backward_passes_per_step(accumulation_steps + 1)
        self.optimizer._gradient_divisor = float(accumulation_steps + 1)

    def _decide(self, loader, force):
        fit = self._fit
        if fit is not None and fit[1] is not None and (force or fit[2]):
            self._perf = fit[1]
            self._fit = None
        if self._perf is None or self.noise is None or not self.noise.ready:
            if force:  # no model yet: keep the global batch, re-split over the new world
                batch = self.atomic_bsz * size() if self.atomic_bsz else loader.batch_size
                self.atomic_bsz = max(1, math.ceil(batch / size()))
                self._cap(loader)
            return
        model = GoodputModel(self._perf, self.noise.grad_params(loader.batch_size),
                             loader.batch_size)
        current = None if force else (self.atomic_bsz, self.accumulation_steps)
        best = model.optimize(self._hosts, size(), loader.max_batch_size,
                              self._bounds(loader), loader.gradient_accumulation,
                              current=current)
        if best is not None:
            self.atomic_bsz, self.accumulation_steps = best.atomic_bsz, best.accumulation_steps
            self.predicted_goodput = best.goodput
        else:  # nothing within the bounds reaches B0 (a micro-batch ran out of memory)
            self._cap(loader)
        self._since_decision = 0
        self._start_fit()

    def _publish_hints(self, loader, interval=1.0):
        """Sends the job's goodput model to the scheduler (horovod_cpp.adaptive.hints), at
        most once per ``interval`` seconds; rank 0 only."""
        now = time.monotonic()
        if self._hints_sent is not None and now - self._hints_sent < interval:
            return
        self._hints_sent = now
        b0 = loader.batch_size
        pauses = [r["first_step"] - r["last_step"] for r in self.resizes[-8:]
                  if r.get("first_step") and r.get("last_step")]
        ready = self.noise is not None and self.noise.ready
        _hints.publish({
            "perf_params": list(self._perf) if self._perf is not None else None,
            "grad_params": list(self.noise.grad_params(b0)) if ready else None,
            "init_batch_size": b0, "max_batch_size": loader.max_batch_size,
            "local_bsz_bounds": list(self._bounds(loader)), "gradient_accumulation":
                bool(loader.gradient_accumulation) and loader.max_batch_size is not None,
            "max_profiled_replicas": max((o[1] for o in self.profile.observations()),
                                         default=size()),
            "resize_pauses": pauses, "progress": self.scale_progress, "steps": self.steps,
            "ranks": size(), "batch_size": (self.atomic_bsz or 0) *
                (self.accumulation_steps + 1) * size()})

    def _start_fit(self):
        if self._fit is not None or not len(self.profile):
            return
        snapshot = Profile()
        snapshot.load_state_dict(self.profile.state_dict())
        fit = [None, None, False]  # thread, result, every rank has finished it

        def run():
            fit[1] = snapshot.fit()

        fit[0] = threading.Thread(target=run, name="horovod_cpp-adaptive-fit", daemon=True)
        self._fit = fit
        fit[0].start()

    def _forget_pending(self):
        """Drops the averaged values in flight (a reset ended the world they were sent in)."""
        self._outbox = None
        if self._pending is not None:
            for handle in self._pending[0]:
                try:
                    synchronize(handle)
                except Exception:  # noqa: BLE001  (aborted with the old world)
                    pass
        self._pending = None

    # ---- the step -------------------------------------------------------------------------

    def _patch_optimizer(self):
        opt = self.optimizer
        base_step, base_zero_grad = opt.step, opt.zero_grad

        def step(_opt, *args, **kwargs):
            return self._step(base_step, *args, **kwargs)

        # A method, as torch's LR schedulers expect of optimizer.step: one built after this
        # wraps step.__func__; one built before wrapped the step that this one calls, and
        # its mark says so (without it, its first step() warns that the step was replaced;
        # the mark is _with_counter before torch 2.2).
        for mark in ("_wrapped_by_lr_sched", "_with_counter"):
            if hasattr(base_step, mark):
                setattr(step, mark, True)

        def zero_grad(*args, **kwargs):
            loader = CONTEXT.loader
            if loader is not None and loader._micro > 0:
                return None  # accumulating: keep the earlier micro-batches' gradients
            return base_zero_grad(*args, **kwargs)

        opt.step, opt.zero_grad = types.MethodType(step, opt), zero_grad

    def _is_reduced_locally(self):
        """One rank and no hooks: the optimizer reduces nothing, so it divides nothing."""
        return size() == 1 and not getattr(self.optimizer, "_grad_accs", None)

    def _step(self, base_step, *args, **kwargs):
        loader = CONTEXT.loader
        if loader is None:
            raise RuntimeError("AdaptiveDataParallel: optimizer.step() outside an "
                               "AdaptiveDataLoader's loop (the batch size would be unknown)")
        if loader._micro < loader._accum:
            return None  # an accumulation micro-batch: the step comes with the last one
        entry = time.perf_counter()
        opt = self.optimizer
        if not getattr(opt, "_reduced", False):
            opt.synchronize()
        micro = loader._accum + 1
        local_bsz, global_bsz, full = loader._step_sizes
        self._measure(full, local_bsz, global_bsz, micro)
        scale = global_bsz / loader.batch_size
        grad = self.noise.grad_params(loader.batch_size) if self.noise.ready else None
        if isinstance(self.scaling_rule, LEGWScale):
            self.scaling_rule.epoch_progress = loader.epoch_progress()
        self.lr_factor = self.scaling_rule.lr_factor(scale, grad)
        self.gain = self.scaling_rule.progress(scale, grad)
        base_lrs = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] = g["lr"] * self.lr_factor
        skip = getattr(opt, "skip_synchronize", None)  # (a sharded step does not reduce twice)
        try:
            with skip() if skip is not None else contextlib.nullcontext():
                result = base_step(*args, **kwargs)
        finally:
            for g, lr in zip(opt.param_groups, base_lrs):
                g["lr"] = lr
        self.scale_progress += self.gain
        self.steps += 1
        self.step_done()
        self._since_decision += 1
        self._stepped = True
        end = time.perf_counter()
        self._last_step_wall = time.time()
        if self.resizes and "first_step" not in self.resizes[-1]:
            self.resizes[-1].update(first_step=time.time(), batch_size=global_bsz,
                                    local_bsz=self.atomic_bsz, accumulation_steps=micro - 1,
                                    full=full)
        self._send(full, local_bsz, global_bsz, entry, end, micro)
        self._timeline(global_bsz, micro)
        return result

    def _timeline(self, global_bsz, micro):
        """The step's configuration and statistics as counters in the timeline (rank 0 writes
        it; a no-op while none records)."""
        if rank() != 0:
            return
        nan = float("nan")
        phi = self.gradient_noise_scale()
        _core.timeline_counter("adaptive", [
            ("batch_size", float(global_bsz)), ("local_bsz", float(self.atomic_bsz)),
            ("accumulation_steps", float(micro - 1)), ("lr_factor", float(self.lr_factor)),
            ("noise_scale", nan if phi is None else float(phi)),
            ("goodput", nan if self.predicted_goodput is None else
             float(self.predicted_goodput))])

    def _loss_scale_sq(self):
        if self.mp_scaler is None or not self.mp_scaler.is_enabled():
            return 1.0
        return float(self.mp_scaler.get_scale()) ** 2

    def _measure(self, full, local_bsz, global_bsz, micro):
        """This step's norms into the noise scale, and the step's gradient made the mean over
        its micro-batches where the optimizer summed them. One rank: the difference estimator
        now. Several: the local norm is sent to be averaged (``_send``), and the averaged
        values of the previous step, started with this step's reductions, are taken in."""
        self._receive()
        opt = self.optimizer
        if size() == 1:
            self._average_micro_batches(micro)
            pair = self.meter.take_consecutive()
            if pair is not None and full:
                s2 = self._loss_scale_sq()
                self.noise.update(pair[0] / s2, pair[1] / s2, global_bsz, 2 * global_bsz)
            self._step_norms = None
            return
        local, glob = self.meter.take()
        stats = getattr(opt, "_stats", None)
        if stats is not None and stats.sums_passes:
            glob /= float(micro) ** 2
        if stats is not None and stats.local_per_pass:
            # each micro-batch's own gradient: n = ranks x micro-batches of local_bsz / micro
            local, b = local / micro, local_bsz // micro
        else:
            local, b = local / float(micro) ** 2, local_bsz  # the mean over the micro-batches
        self._average_micro_batches(micro)
        s2 = self._loss_scale_sq()
        self._step_norms = (local / s2, glob / s2, b) if full else None

    def _average_micro_batches(self, micro):
        """Divides the step's gradient by its micro-batches where nobody did: a sharded
        optimizer's slices (the passes' sum), one rank's DistributedOptimizer (no reduction)."""
        if micro == 1:
            return
        if self._sharded:
            self.optimizer._scale_gradients(1.0 / micro)
        elif self._is_reduced_locally():
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.div_(micro)

    def _send(self, full, local_bsz, global_bsz, entry, end, micro):
        """This step's local norm, times and fit flag, to be averaged over the ranks. The
        allreduce starts with the next step's first gradient reduction (``_flush``), when the
        ranks are together anyway, so that it neither costs a negotiation round of its own nor
        leaves a rank waiting in it; one rank has nothing to average and takes them now."""
        start, self._step_start = self._step_start, None
        step_seconds = end - start if start is not None else 0.0
        compute_seconds = (entry - start) / micro if start is not None else 0.0
        fit_done = 1.0 if self._fit is not None and not self._fit[0].is_alive() else 0.0
        norms = self._step_norms if size() > 1 else None
        # The memory high-water mark is read (and reset) once per decision, two steps before
        # it (averaged values arrive a step late): the configuration changes only at
        # decisions, so the mark since the last reading is this configuration's peak, at a
        # fraction of the per-step cost (a /proc read and write).
        memory = self.memory if self._since_decision + 1 >= self.decide_every else None
        values = torch.tensor([norms[0] if norms else 0.0, 1.0 if norms else 0.0,
                               step_seconds, compute_seconds, fit_done,
                               1.0 if memory else 0.0,
                               self._own_memory[1] if memory else 0.0], dtype=torch.float64)
        # The memory is decided by the worst rank (op Max, the same ranks sending it: a
        # decision's step is every rank's): the highest peak above a rank's own base, and the
        # least room between a rank's base and its budget (negated). Averaged, a rank whose
        # peak grows more than the others' went past its own budget.
        worst = torch.tensor([self._peak_memory() - self._own_memory[1],
                              self._own_memory[1] - self._own_memory[0]],
                             dtype=torch.float64) if memory else None
        meta = ((self._hosts, size(), self.atomic_bsz, micro - 1),
                norms[1] if norms else None, norms[2] if norms else local_bsz, global_bsz,
                step_seconds > 0 and full)
        if size() == 1:
            self._apply(values.tolist(), meta, worst.tolist() if worst is not None else None)
        else:
            self._outbox = (values, worst, meta)

    def _flush(self):
        """Starts the allreduce of the values ``_send`` left (the optimizer calls it just
        before its first gradient reduction of a step)."""
        if self._outbox is None:
            return
        values, worst, meta = self._outbox
        self._outbox = None
        handles = [allreduce_async(values, name=self._stats_name, op=Average,
                                   process_set=self.process_set)]
        if worst is not None:
            handles.append(allreduce_async(worst, name=self._stats_name + ".memory", op=Max,
                                           process_set=self.process_set))
        self._pending = (handles, meta)

    def _receive(self):
        """The previous step's averaged values into the noise scale and the profile."""
        self._flush()  # (a step with no reduction of its own: started here)
        if self._pending is None:
            return
        handles, meta = self._pending
        self._pending = None
        got = [synchronize(h).tolist() for h in handles]
        self._apply(got[0], meta, got[1] if len(got) > 1 else None)

    def _apply(self, values, meta, worst=None):
        config, glob, local_bsz, global_bsz, timed = meta
        local, measured, step_seconds, compute_seconds, fit_done, has_memory, base = values
        if glob is not None and measured == 1.0:  # every rank measured the step
            self.noise.update(local, glob, local_bsz, global_bsz)
        if timed:
            self.profile.record(*config, step_seconds, compute_seconds)
        if self.memory is not None and has_memory > 0 and worst is not None:
            # In the ranks' mean base: the worst rank's room above it, its growth above it.
            growth, less_room = worst
            self.memory.budget, self.memory.base = base - less_room, base
            self.memory.record(config[2], base + growth)
        if self._fit is not None and fit_done == 1.0:
            self._fit[2] = True
        elif self._fit is None and self.noise.ready and len(self.profile):
            self._start_fit()

    # ---- reports --------------------------------------------------------------------------

    def gradient_noise_scale(self):
        """phi = B0 * var / sqr: the gradient noise scale in samples (None before it is
        measured)."""
        return self.noise.noise_scale() if self.noise is not None else None

    def stats(self):
        """The noise scale, the batch configuration, the learning-rate factor and gain, the
        progress, and the goodput model's prediction for the current configuration."""
        loader = CONTEXT.loader
        b0 = loader.batch_size if loader is not None else None
        batch = (self.atomic_bsz or 0) * (self.accumulation_steps + 1) * size()
        predicted = None
        if self._perf is not None and self.noise is not None and self.noise.ready and b0:
            model = GoodputModel(self._perf, self.noise.grad_params(b0), b0)
            predicted = model.goodput(self._hosts, size(), self.atomic_bsz,
                                      self.accumulation_steps)
        return {"noise_scale": self.gradient_noise_scale(), "batch_size": batch,
                "local_bsz": self.atomic_bsz, "accumulation_steps": self.accumulation_steps,
                "lr_factor": self.lr_factor, "gain": self.gain, "steps": self.steps,
                "progress": self.scale_progress, "goodput": predicted,
                "perf_params": list(self._perf) if self._perf is not None else None,
                "memory_limit": self.memory.limit() if self.memory is not None else None,
                "oom_ceiling": self.oom_ceiling, "oom_limit": self.oom_limit(),
                "sqr": self.noise.sqr if self.noise is not None else None,
                "var": self.noise.var if self.noise is not None else None}
