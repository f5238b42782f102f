"""The gradient measurements of one optimizer step, for the noise scale.

With several ranks the core measures them while it reduces the gradients
(``DistributedOptimizer._measure_gradients``: a stats group per parameter, so that the Adam
preconditioner can weight each parameter): each rank's squared norm of its local gradient, and
the reduced gradient's. With one rank there is no reduction to measure, and the meter keeps the
previous step's gradient instead: two consecutive steps are two gradients of the same batch size
(the difference estimator), at the price of one copy of the gradient per step.

The Adam preconditioner (``AdamScale``) weights parameter p's norms by w_p^2, with
w_p = 1 / mean(sqrt(v_p / (1 - beta2^t)) + eps) over p's elements: Adam's own update scale,
one number per parameter tensor (AdaptDL weights each element; this needs no extra pass over
the gradients, and is refreshed after the first update, while no moments are known, and
every ``refresh`` steps from the second moments). Under a ``ShardedOptimizer`` the core measures per bucket (stages 1 and 2) or
per flat buffer (stage 3), so the weight is one per bucket or flat, the mean over every rank's
slices of it (their sums and counts summed by one small allreduce per refresh)."""
import torch

from horovod_cpp.torch.basics import Sum
from horovod_cpp.torch.collectives import allreduce


class GradientMeter(object):
    def __init__(self, optimizer, precondition=False, refresh=10, process_set=None,
                 name="adaptive.preconditioner"):
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.precondition = precondition
        self.refresh = int(refresh)
        self.process_set = process_set
        self.name = name
        self._weights = {}  # stats group -> weight (1 where absent)
        self._steps = 0
        self._previous = None  # one rank: the previous step's gradient, flat, float64

    def start(self):
        """Has the core measure every gradient from now on (several ranks)."""
        if hasattr(self.optimizer, "_measure_gradients"):
            self.optimizer._measure_gradients({p: i for i, p in enumerate(self.params)})

    def stop(self):
        if hasattr(self.optimizer, "_measure_gradients"):
            self.optimizer._measure_gradients(None)

    def discard(self):
        """Drops what was measured since the last take (a step that did not happen)."""
        if hasattr(self.optimizer, "_take_gradient_stats"):
            self.optimizer._take_gradient_stats()

    @staticmethod
    def _scale_sum(state, group):
        """(sum over the elements of sqrt(v / (1 - beta2^t)) + eps, their count), or None
        before the optimizer's first update."""
        v, step = state.get("exp_avg_sq"), state.get("step")
        if v is None or step is None or not v.numel() or not bool(v.any()):
            # (all zero: no update has happened, though the state exists: the zero-gradient
            # step of broadcast_optimizer_state, as an elastic job's sync takes, makes it;
            # weighed by 1 / eps, one step's norms would outweigh all others by 1e16)
            return None
        beta2, eps = group.get("betas", (0.9, 0.999))[1], group.get("eps", 1e-8)
        t = float(step)
        correction = 1.0 - beta2 ** t if t > 0 else 1.0
        return float((v.double() / correction).sqrt_().add_(eps).sum()), v.numel()

    def _refresh_weights(self):
        if not self.precondition or not (self._steps == 1 or self._steps % self.refresh == 0
                                         or not self._weights):
            return
        slices = getattr(self.optimizer, "_moment_slices", None)
        if slices is not None:
            return self._refresh_slice_weights(slices())
        groups = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        for i, p in enumerate(self.params):
            found = self._scale_sum(self.optimizer.state.get(p, {}), groups[id(p)])
            if found is not None and found[0] > 0:
                self._weights[i] = found[1] / found[0]

    def _refresh_slice_weights(self, entries):
        """Collective (every rank refreshes at the same steps): one weight per stats group
        from every rank's slices of it. ``entries``: [(stats group, state, param group)]."""
        order = [k for k, _ in self.optimizer._gradient_slices()]
        where = {k: i for i, k in enumerate(order)}
        sums = torch.zeros(2 * len(order), dtype=torch.float64)
        for k, state, group in entries:
            found = self._scale_sum(state, group)
            if found is not None and k in where:
                sums[2 * where[k]] += found[0]
                sums[2 * where[k] + 1] += found[1]
        if len(order):
            sums = allreduce(sums, op=Sum, name=self.name, process_set=self.process_set)
        for k, i in where.items():
            total, count = float(sums[2 * i]), float(sums[2 * i + 1])
            if total > 0:
                self._weights[k] = count / total

    def take(self):
        """(local_sqr, global_sqr) of the step just reduced, with the preconditioner's weights:
        local_sqr this rank's local gradient (before the reduction), global_sqr the averaged
        one. Call after the reductions, before the optimizer's update."""
        self._refresh_weights()
        self._steps += 1
        stats = self.optimizer._take_gradient_stats()
        local = glob = 0.0
        for group, (l, r) in stats.items():
            w2 = self._weights.get(group, 1.0) ** 2
            local += w2 * l
            glob += w2 * r
        return local, glob

    def take_consecutive(self):
        """One rank: (mean of the two consecutive gradients' squared norms, squared norm of
        their mean), or None at the first step; the pair counts as two gradients of the same
        batch size averaged into twice the batch."""
        self._refresh_weights()
        self._steps += 1
        self.discard()
        parts = []
        if hasattr(self.optimizer, "_gradient_slices"):  # sharded: its slices (one rank: all)
            slices = self.optimizer._gradient_slices()
            grads = [g for _, g in slices]
            weights = [self._weights.get(k, 1.0) for k, _ in slices]
        else:
            grads = [p.grad for p in self.params]
            weights = [self._weights.get(i, 1.0) for i in range(len(self.params))]
        for g, w in zip(grads, weights):
            if g is None:
                continue
            parts.append(g.detach().reshape(-1).to(torch.float64) * w)
        current = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
        previous, self._previous = self._previous, current
        if previous is None or previous.numel() != current.numel():
            return None
        local = 0.5 * (float(current.dot(current)) + float(previous.dot(previous)))
        mean = (current + previous) * 0.5
        return local, float(mean.dot(mean))

    def reset(self):
        """Forgets the previous gradient (after a resize or a restore)."""
        self._previous = None
