"""The throughput model fitted online from the step times a job actually sees. Plain Python.

Each measurement is one optimizer step at a configuration (hosts, ranks, micro-batch,
accumulation steps): its whole time and the compute time of one micro-batch (forward and
backward, without waiting for the reduction). ``Profile`` keeps a running mean per
configuration (bounded: a job sees few configurations), and ``fit()`` turns them into the
goodput model's PerfParams in two parts:

* compute: ``alpha_c + beta_c * micro_batch`` by weighted least squares over the
  configurations (closed form). With one micro-batch size seen so far, the time is split half
  and half between the two terms, which is optimistic about larger batches (as Pollux does);
* network and overlap: ``alpha_r, beta_r`` (one host), ``alpha_n, beta_n`` (several hosts) and
  ``gamma`` minimise the squared error of log step time (Nelder-Mead over log-parameters, with
  a small pull of gamma towards 1 and of the beta terms towards 0). A term never observed stays
  at its optimistic floor (no network cost across hosts before the job has run across hosts,
  no growth with ranks before more than 2 ranks), so a scheduler is willing to try it.
"""
import math

from horovod_cpp.adaptive.goodput import PerfParams, step_time

_FLOOR = 1e-8        # seconds: "nothing observed" for a time term
_MAX_CONFIGS = 256   # configurations kept (the least measured ones go first)


class Profile(object):
    """Step-time measurements, averaged per configuration."""

    def __init__(self):
        self._configs = {}   # (hosts, ranks, atomic_bsz, accum) -> [count, step sum, compute sum]

    def record(self, hosts, ranks, atomic_bsz, accumulation_steps, step_seconds,
               compute_seconds):
        """One step's times; non-positive or non-finite ones are ignored."""
        if not (0 < step_seconds < math.inf and 0 < compute_seconds < math.inf):
            return False
        key = (int(hosts), int(ranks), int(atomic_bsz), int(accumulation_steps))
        entry = self._configs.setdefault(key, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += step_seconds
        entry[2] += compute_seconds
        if len(self._configs) > _MAX_CONFIGS:
            del self._configs[min(self._configs, key=lambda k: self._configs[k][0])]
        return True

    def observations(self):
        """[(hosts, ranks, atomic_bsz, accum, count, mean step time, mean compute time)]."""
        return [key + (n, step / n, compute / n)
                for key, (n, step, compute) in sorted(self._configs.items())]

    def __len__(self):
        return len(self._configs)

    def state_dict(self):
        """Plain lists and numbers: loads with torch.load(weights_only=True)."""
        return {"configs": [list(k) + list(v) for k, v in sorted(self._configs.items())]}

    def load_state_dict(self, state):
        self._configs = {tuple(int(x) for x in row[:4]): [int(row[4]), float(row[5]),
                                                          float(row[6])]
                         for row in state["configs"]}

    def fit(self):
        """PerfParams fitted to the measurements; None before any."""
        obs = self.observations()
        if not obs:
            return None
        alpha_c, beta_c = _fit_compute(obs)
        free, fixed = _network_terms(obs)

        def params(x):
            values = dict(fixed)
            values.update(zip(free, x))
            return PerfParams(alpha_c, beta_c, values["alpha_n"], values["beta_n"],
                              values["alpha_r"], values["beta_r"], values["gamma"])

        if not free:
            return params([])

        def bounded(logx):  # the free parameters from their logarithms, within their ranges
            return [min(max(math.exp(v), 1.0), 10.0) if name == "gamma" else
                    min(max(math.exp(v), _FLOOR), 1e4) for name, v in zip(free, logx)]

        def loss(logx):
            p = params(bounded(logx))
            err = 0.0
            weight = 0
            for hosts, ranks, atomic, accum, n, step, _ in obs:
                predicted = step_time(p, hosts, ranks, atomic, accum)
                err += n * (math.log(predicted) - math.log(step)) ** 2
                weight += n
            reg = 1e-3 * (p.gamma - 1) ** 2
            reg += 1e-2 * sum((getattr(p, b) / max(getattr(p, a), _FLOOR)) ** 2
                              for a, b in (("alpha_n", "beta_n"), ("alpha_r", "beta_r"))
                              if b in free)
            return err / weight + reg

        start = [math.log(_initial(name, obs, alpha_c, beta_c)) for name in free]
        return params(bounded(_nelder_mead(loss, start)))


def _fit_compute(obs):
    """(alpha_c, beta_c) by weighted least squares of compute time on the micro-batch."""
    weights = [o[4] for o in obs]
    xs = [o[2] for o in obs]
    ys = [o[6] for o in obs]
    total = float(sum(weights))
    mean_x = sum(w * x for w, x in zip(weights, xs)) / total
    mean_y = sum(w * y for w, y in zip(weights, ys)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs))
    if sxx <= 0:       # one micro-batch size: half constant, half proportional
        return mean_y / 2, mean_y / 2 / mean_x
    beta = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, xs, ys)) / sxx
    beta = max(beta, _FLOOR)
    alpha = max(mean_y - beta * mean_x, _FLOOR)
    return alpha, beta


def _network_terms(obs):
    """The network and overlap parameters the measurements can tell, and the others' values."""
    multi_host = any(h > 1 and r > 1 for h, r, *_ in obs)
    one_host = any(h == 1 and r > 1 for h, r, *_ in obs)
    grows = {"n": any(h > 1 and r > 2 for h, r, *_ in obs),
             "r": any(h == 1 and r > 2 for h, r, *_ in obs)}
    free, fixed = [], {}
    for kind, seen in (("n", multi_host), ("r", one_host)):
        if seen:
            free.append("alpha_" + kind)
        else:
            fixed["alpha_" + kind] = _FLOOR
        if seen and grows[kind]:
            free.append("beta_" + kind)
        else:
            fixed["beta_" + kind] = _FLOOR
    if multi_host or one_host:
        free.append("gamma")
    else:
        fixed["gamma"] = 1.0
    return free, fixed


def _initial(name, obs, alpha_c, beta_c):
    if name == "gamma":
        return 1.5
    # The mean excess of step time over compute, as a start for the network terms.
    excess = [max(step - (alpha_c + beta_c * atomic) * (accum + 1), _FLOOR * 10)
              for hosts, ranks, atomic, accum, n, step, _ in obs if ranks > 1]
    base = sum(excess) / len(excess) if excess else 1e-3
    return base if name.startswith("alpha") else base / 10


def _nelder_mead(f, start, steps=400, scale=0.5, tolerance=1e-10):
    """Minimises f from start (a list of floats) with the Nelder-Mead simplex."""
    n = len(start)
    simplex = [list(start)] + [[v + (scale if i == j else 0.0) for j, v in enumerate(start)]
                               for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(steps):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < tolerance:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (v - b) for b, v in zip(best, p)]
                                    for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=values.__getitem__)]
