"""The goodput scheduling policy: which jobs get how many slots on which hosts (Pollux's
objective, OSDI'21, searched by a greedy on marginal gains, a transfer search and a placement
that keeps jobs where they are). Plain Python: no numpy, Ray or Spark, so that the Ray scheduler
(``horovod_cpp.ray``), Pollux's simulator (``examples/scheduling/pollux_sim_adapter.py``) and
the tests call the same code.

**Objective.** Each job j has a speedup function ``speedup(hosts, replicas)``: its best goodput
at that size over its goodput at a fair share of the cluster (the goodput model of
``horovod_cpp.adaptive.goodput``; 0 at 0 replicas). The policy maximises the power mean with
exponent ``p`` (default -1: the harmonic mean, which favours fairness) of

    s_j = speedup_j(hosts_j, replicas_j) * share * f_j,   share = len(hosts) / total slots

where ``f_j`` is 1 if job j keeps its current allocation or is not running, and otherwise
Pollux's restart factor ``max(age - restarts * cost, 0) / (age + cost)``, ``cost`` being the
pause one reallocation costs (Pollux: a flat 30 s checkpoint-restart; here the measured
in-process resize pause). Pollux also charges a queued job's start; a start costs its pause
whenever it happens, and a job just submitted (age 0) would never be worth starting
(``charge_start=True`` charges it as Pollux does: for comparing searches on one objective). The
power mean of ``s_j + 1e-3`` is, for p < 0, a decreasing function of ``sum (s_j + 1e-3)^p``: the
objective is a sum of one term per job, which is what makes a greedy search work.

**Constraints.** At most the host's free slots on each host; between ``min_replicas`` (or 0)
and ``max_replicas`` per job; at most ``max_hosts_per_job`` hosts per job; and, for interference
avoidance, at most one job spanning several hosts on any host. A job of at most one host's slots
runs on one host.

**Search.** (1) Replica counts: every job starts at 0 (or its minimum) and a heap hands out
slots by the best gain per slot over any larger count (not only the next one, so that a count
whose speedup jumps, or the unpenalised current allocation, is reached across a dip), within the
total free slots. (2) Transfers: k slots moved from one job to another while the sum improves.
(3) Placement: jobs keeping their count keep their hosts (no restart); the others are placed
largest first, spanning jobs on hosts with no other spanning job, the rest best fit; a job that
does not fit is shrunk to what does, and freed slots go to whoever gains most and fits.
``tests/adaptive/test_policy.py`` checks it against an exhaustive search on small clusters.
"""
import heapq
import math
import time

_EPS = 1e-3


class JobInfo(object):
    """What the policy knows of a job: ``speedup(hosts, replicas)`` (a float; 0 at 0 replicas),
    ``min_replicas``/``max_replicas``, ``submitted`` (a timestamp, for the order of ties),
    ``attained_service`` (slot-seconds), ``restarts`` (reallocations so far) and ``age``
    (seconds since submission). ``preemptible=False``: a job that must keep its minimum when
    the minimums do not all fit (a running in-process job has no checkpoint to resume from)."""

    def __init__(self, speedup, min_replicas=0, max_replicas=1, submitted=0.0,
                 attained_service=0.0, restarts=0, age=0.0, preemptible=True):
        if max_replicas < max(1, min_replicas):
            raise ValueError("max_replicas (%r) must be at least 1 and min_replicas (%r)"
                             % (max_replicas, min_replicas))
        self.speedup = speedup
        self.min_replicas = int(min_replicas)
        self.max_replicas = int(max_replicas)
        self.submitted = submitted
        self.attained_service = float(attained_service)
        self.restarts = int(restarts)
        self.age = float(age)
        self.preemptible = bool(preemptible)


def restart_factor(job, cost, horizon=0.0):
    """Pollux's penalty on a job whose allocation changes: the share of its life not spent
    restarting, if it restarts once more. ``horizon``: the life counted is at least that many
    seconds (Pollux: 0, its age alone)."""
    if cost <= 0:
        return 1.0
    life = max(job.age, horizon)
    return max(life - job.restarts * cost, 0.0) / (life + cost)


class _Options(dict):
    """A job's options {replicas: (utility if changed, utility if kept or None)}, with what
    values a placement the table does not list (more hosts than the fewest)."""

    def __init__(self, job, share, factor):
        super().__init__()
        self.job, self.share, self.factor = job, share, factor


def _counts(allocation):
    """[(host, replicas on it)] of an allocation (a list with a host per replica), sorted."""
    counts = {}
    for host in allocation:
        counts[host] = counts.get(host, 0) + 1
    return sorted(counts.items(), key=lambda kv: str(kv[0]))


class Policy(object):
    """``Policy(p=-1, restart_cost=30).optimize(jobs, hosts, current)`` -> allocation.

    ``jobs``: {key: JobInfo}; ``hosts``: {host: free slots}; ``current``: {key: [host per
    replica]} (jobs not in ``jobs`` and hosts not in ``hosts`` are dropped from it). Returns
    {key: [host per replica]} for every job (an empty list: queued). ``horizon``: the
    restart factor counts a job's life as at least this many seconds (the Ray scheduler: its
    re-plan interval, the least time a change usually stays in effect), so that a job seconds
    old is not kept from growing by a pause of seconds; 0 is Pollux's rule."""

    def __init__(self, p=-1.0, restart_cost=30.0, max_hosts_per_job=16,
                 avoid_interference=True, time_limit=0.5, horizon=0.0, charge_start=False):
        self.p = float(p)
        self.charge_start = bool(charge_start)
        self.restart_cost = float(restart_cost)
        self.horizon = float(horizon)
        self.max_hosts_per_job = int(max_hosts_per_job)
        self.avoid_interference = bool(avoid_interference)
        self.time_limit = float(time_limit)

    # ---- the objective -------------------------------------------------------------------

    def utility(self, s):
        """One job's term: increasing in its scaled speedup ``s``."""
        if self.p == 0:
            return math.log(s + _EPS)
        value = (s + _EPS) ** self.p
        return -value if self.p < 0 else value

    def power_mean(self, total, count):
        """The power mean from the sum of the terms of ``count`` jobs."""
        if count == 0:
            return 0.0
        if self.p == 0:
            return math.exp(total / count)
        return (abs(total) / count) ** (1.0 / self.p)

    def objective(self, jobs, hosts, current, allocation):
        """The power mean of the scaled speedups of ``allocation`` (what ``optimize``
        maximises), restart factors counted against ``current``."""
        share = self._share(hosts)
        total = 0.0
        for key, job in jobs.items():
            alloc = allocation.get(key, [])
            counts = _counts(alloc)
            s = job.speedup(len(counts), len(alloc)) * share if alloc else 0.0
            if (current.get(key) or self.charge_start) and counts != _counts(
                    current.get(key, [])):
                s *= restart_factor(job, self.restart_cost, self.horizon)
            total += self.utility(s)
        return self.power_mean(total, len(jobs))

    @staticmethod
    def _share(hosts):
        slots = sum(hosts.values())
        return len(hosts) / float(slots) if slots else 0.0

    # ---- the search ----------------------------------------------------------------------

    def optimize(self, jobs, hosts, current=None):
        start = time.perf_counter()
        current = current or {}
        hosts = {h: int(n) for h, n in hosts.items() if int(n) > 0}
        keys = sorted(jobs, key=lambda k: (jobs[k].attained_service, jobs[k].submitted,
                                           str(k)))
        if not keys or not hosts:
            return {k: [] for k in jobs}
        self._start = start
        widest = self._widest = max(hosts.values())
        share = self._share(hosts)
        base = {}
        for k in keys:  # the current allocations that are still possible
            alloc = [h for h in current.get(k, []) if h in hosts]
            if len(alloc) == len(current.get(k, [])) and alloc:
                base[k] = alloc
        tables = {k: self._table(jobs[k], widest, share, len(hosts), base.get(k),
                                 bool(current.get(k))) for k in keys}
        counts = self._greedy(keys, tables, sum(hosts.values()))
        counts = self._transfer(keys, tables, counts)
        allocation = self._place(keys, jobs, hosts, tables, counts, base)
        allocation = self._improve(keys, hosts, tables, allocation, base)
        return {k: allocation.get(k, []) for k in jobs}

    def _table(self, job, widest, share, n_hosts, base, running):
        """The job's options: [(replicas, utility changed, utility kept or None)] for 0 (where
        allowed) and min..max replicas, each on the fewest hosts that hold it. Only a running
        job pays the restart factor for a change (a queued job's start costs its pause
        whenever it starts), unless ``charge_start``."""
        factor = (restart_factor(job, self.restart_cost, self.horizon)
                  if running or self.charge_start else 1.0)
        top = min(job.max_replicas, widest * min(self.max_hosts_per_job, n_hosts))
        base_r = len(base) if base else None
        base_hosts = len(set(base)) if base else None
        rows = _Options(job, share, factor)
        if job.min_replicas == 0:
            rows[0] = (self.utility(0.0), None)
        for r in range(max(1, job.min_replicas), top + 1):
            n = -(-r // widest)
            s = job.speedup(n, r) * share
            kept = None
            if r == base_r:
                kept = self.utility(job.speedup(base_hosts, r) * share)
            rows[r] = (self.utility(s * factor), kept)
        return rows

    @staticmethod
    def _value(row):
        changed, kept = row
        return changed if kept is None else max(changed, kept)

    def _at(self, table, r):
        """The job's best term at count r (nothing's where r is not an option: a queued job
        below its minimum)."""
        return self._value(table[r]) if r in table else self.utility(0.0)

    def _greedy(self, keys, tables, capacity):
        """Replica counts within the total slots: the best gain per slot first."""
        counts = {}
        used = 0
        order = {k: i for i, k in enumerate(keys)}  # (ties: the earlier job)
        for k in keys:
            low = min(tables[k])
            counts[k] = low
            used += low
        if used > capacity:
            # The minimums alone do not fit: start the jobs whose minimum gains most per slot
            # (ties: the earlier in order), those that may not be preempted first; the others
            # are queued this round.
            nothing = self.utility(0.0)
            rank = sorted(keys, key=lambda k: (
                tables[k].job.preemptible,
                -(self._value(tables[k][counts[k]]) - nothing) / max(counts[k], 1), order[k]))
            used = 0
            for k in rank:
                if used + counts[k] <= capacity:
                    used += counts[k]
                else:
                    counts[k] = 0
        heap = []

        def push(k):
            best = self._best_step(tables[k], counts[k], capacity - used)
            if best is not None:
                ratio, r = best
                heapq.heappush(heap, (-ratio, order[k], r, counts[k]))

        for k in keys:
            push(k)
        while heap:
            _, index, r, at = heapq.heappop(heap)
            k = keys[index]
            if counts[k] != at:
                continue  # stale
            if r - at > capacity - used:
                push(k)   # no longer fits: the best step that does
                continue
            used += r - at
            counts[k] = r
            push(k)
        return counts

    def _best_step(self, table, r, room):
        """(gain per slot, new count) of the best larger count within ``room`` more slots, or
        None when nothing gains."""
        here = self._at(table, r)
        best = None
        for r2, row in table.items():
            if r2 <= r or r2 - r > room:
                continue
            ratio = (self._value(row) - here) / (r2 - r)
            if ratio > 1e-12 and (best is None or ratio > best[0]):
                best = (ratio, r2)
        return best

    def _transfer(self, keys, tables, counts, max_k=8):
        """Moves k slots from one job to another while the sum of the terms improves."""
        for _ in range(4 * len(keys)):
            if time.perf_counter() - self._start > self.time_limit * 0.5:
                break
            gains, losses = {}, {}
            for k in keys:
                table, r = tables[k], counts[k]
                here = self._at(table, r)
                for step in range(1, max_k + 1):
                    if r + step in table:
                        g = self._value(table[r + step]) - here
                        if g > gains.get(step, (0.0, None))[0]:
                            gains[step] = (g, k)
                    if r - step in table:
                        loss = here - self._value(table[r - step])
                        if loss < losses.get(step, (math.inf, None))[0]:
                            losses[step] = (loss, k)
            best = None
            for step in gains:
                if step in losses and gains[step][1] != losses[step][1]:
                    net = gains[step][0] - losses[step][0]
                    if net > 1e-9 and (best is None or net > best[0]):
                        best = (net, step)
            if best is None:
                break
            step = best[1]
            counts[gains[step][1]] += step
            counts[losses[step][1]] -= step
        return counts

    def _place(self, keys, jobs, hosts, tables, counts, base):
        """Hosts for the counts: kept jobs where they are, then spanning jobs, then the rest
        best fit; what does not fit shrinks, and free slots go to whoever gains most."""
        free = dict(hosts)
        spanning = set()  # hosts holding a job that spans several
        allocation = {}
        # Jobs keeping their count keep their hosts (as long as the count is the base's).
        for k in keys:
            alloc = base.get(k)
            if alloc is None or counts[k] != len(alloc):
                continue
            need = {}
            for h in alloc:
                need[h] = need.get(h, 0) + 1
            if all(free.get(h, 0) >= n for h, n in need.items()) and not (
                    len(need) > 1 and self.avoid_interference and
                    any(h in spanning for h in need)):
                for h, n in need.items():
                    free[h] -= n
                if len(need) > 1:
                    spanning.update(need)
                allocation[k] = list(alloc)
        rest = sorted((k for k in keys if k not in allocation and counts[k] > 0),
                      key=lambda k: -counts[k])
        for k in rest:
            r = counts[k]
            while r > 0:
                placed = self._fit(r, free, spanning, base.get(k))
                if placed is not None:
                    break
                r = self._smaller(tables[k], r)
            if not r:
                allocation[k] = []
                counts[k] = 0 if 0 in tables[k] else counts[k]
                continue
            self._take(placed, free, spanning)
            counts[k] = r
            allocation[k] = [h for h, n in placed for _ in range(n)]
        self._fill(keys, jobs, tables, counts, allocation, free, spanning, base)
        return allocation

    def _term(self, table, alloc, base):
        """A job's term for an allocation: the kept utility on its base allocation, else the
        changed one at its count and hosts."""
        r = len(alloc)
        if r not in table:
            return self.utility(0.0) if r == 0 else -math.inf
        changed, kept = table[r]
        if kept is not None and sorted(alloc) == sorted(base or []):
            return kept
        hosts = len(set(alloc))
        if r and hosts != -(-r // self._widest):  # not on the fewest hosts: its own speedup
            return self.utility(table.job.speedup(hosts, r) * table.share * table.factor)
        return changed

    def _improve(self, keys, hosts, tables, allocation, base):
        """Local search on placed allocations: one job re-placed (any count, any host that
        holds it alone, or spanning), or two jobs re-placed together (either order), while
        the sum of the terms improves, within the time limit."""
        free = dict(hosts)
        spanning = {}
        for k in keys:
            for h, n in _counts(allocation.get(k, [])):
                free[h] -= n
            if len(set(allocation.get(k, []))) > 1:
                for h in set(allocation[k]):
                    spanning[h] = k
        terms = {k: self._term(tables[k], allocation.get(k, []), base.get(k)) for k in keys}

        def release(k):
            for h, n in _counts(allocation.get(k, [])):
                free[h] += n
                if spanning.get(h) == k:
                    del spanning[h]

        def occupy(k, alloc):
            for h, n in _counts(alloc):
                free[h] -= n
            if len(set(alloc)) > 1:
                for h in set(alloc):
                    spanning[h] = k
            allocation[k] = alloc

        def options(k):
            """[(term, alloc)] of job k's placements in the free slots now."""
            out = [(self._term(tables[k], [], base.get(k)), [])] if 0 in tables[k] else []
            b = base.get(k)
            if b and all(free.get(h, 0) >= n for h, n in _counts(b)) and not (
                    len(set(b)) > 1 and self.avoid_interference and
                    any(h in spanning for h in b)):
                out.append((self._term(tables[k], b, b), list(b)))
            for r in tables[k]:
                if r == 0:
                    continue
                for h, n in free.items():
                    if n >= r:
                        alloc = [h] * r
                        out.append((self._term(tables[k], alloc, b), alloc))
                placed = self._fit(r, free, set(spanning), b)
                if placed is not None and len(placed) > 1:
                    alloc = [h for h, n in placed for _ in range(n)]
                    out.append((self._term(tables[k], alloc, b), alloc))
            return out

        improved = True
        while improved and time.perf_counter() - self._start < self.time_limit:
            improved = False
            for k in keys:  # one job
                old = allocation.get(k, [])
                release(k)
                best = max(options(k), key=lambda o: o[0], default=(-math.inf, old))
                if best[0] > terms[k] + 1e-12:
                    occupy(k, best[1])
                    terms[k] = best[0]
                    improved = True
                else:
                    occupy(k, old)
            crowded = [k for k in keys if len(set(allocation.get(k, []))) > 1 or
                       not allocation.get(k)]
            for a in crowded:  # two jobs: a split or queued one with each job it could meet
                if time.perf_counter() - self._start > self.time_limit:
                    break
                for b in keys:
                    if b == a:
                        continue
                    if time.perf_counter() - self._start > self.time_limit:
                        break  # (one job's pairs can take long with many jobs: the limit holds)
                    old_a, old_b = allocation.get(a, []), allocation.get(b, [])
                    before = terms[a] + terms[b]
                    release(a)
                    release(b)
                    best = None
                    for first, second in ((a, b), (b, a)):
                        for t1, alloc1 in options(first):
                            occupy(first, alloc1)
                            t2, alloc2 = max(options(second), key=lambda o: o[0],
                                             default=(-math.inf, []))
                            release(first)
                            if best is None or t1 + t2 > best[0]:
                                best = (t1 + t2, first, alloc1, second, alloc2, t1, t2)
                    if best is not None and best[0] > before + 1e-12:
                        _, first, alloc1, second, alloc2, t1, t2 = best
                        occupy(first, alloc1)
                        occupy(second, alloc2)
                        terms[first], terms[second] = t1, t2
                        improved = True
                    else:
                        occupy(a, old_a)
                        occupy(b, old_b)
        return allocation

    def _smaller(self, table, r):
        smaller = [x for x in table if 0 < x < r]
        return max(smaller) if smaller else 0

    def _fit(self, r, free, spanning, current=()):
        """[(host, replicas)] for r replicas, or None: one host if it can hold them (the
        fullest that does: best fit), else the emptiest hosts without a spanning job. Among
        hosts that fit alike, those holding more of the job's ``current`` slots first: a
        worker that stays needs no start, and two resized jobs do not trade hosts (each one's
        new workers would wait for the other's old ones to leave)."""
        here = dict(_counts(current)) if current else {}
        single = [h for h, n in free.items() if n >= r]
        if single:
            h = min(single, key=lambda x: (free[x], -here.get(x, 0), str(x)))
            return [(h, r)]
        allowed = [h for h, n in free.items() if n > 0 and
                   not (self.avoid_interference and h in spanning)]
        allowed.sort(key=lambda x: (-free[x], -here.get(x, 0), str(x)))
        placed, left = [], r
        for h in allowed[:self.max_hosts_per_job]:
            take = min(free[h], left)
            placed.append((h, take))
            left -= take
            if not left:
                return placed
        return None

    def _take(self, placed, free, spanning):
        for h, n in placed:
            free[h] -= n
        if len(placed) > 1:
            spanning.update(h for h, _ in placed)

    def _fill(self, keys, jobs, tables, counts, allocation, free, spanning, base):
        """Free slots left by placement: the job that gains most from growing to a count that
        fits takes them, until none gains."""
        while any(free.values()) and time.perf_counter() - self._start < self.time_limit:
            best = None
            for k in keys:
                table, r = tables[k], counts[k]
                here = self._at(table, r)
                current = allocation.get(k, [])
                for r2 in sorted(x for x in table if x > r):
                    # grow where it is if the hosts have room, else anywhere it fits
                    trial = dict(free)
                    for h, n in _counts(current):
                        trial[h] += n
                    trial_spanning = set(spanning)
                    if len(set(current)) > 1:
                        trial_spanning.difference_update(current)
                    placed = self._fit(r2, trial, trial_spanning, current)
                    if placed is None:
                        break
                    row = table[r2]
                    value = row[0]
                    if row[1] is not None and sorted(
                            h for h, n in placed for _ in range(n)) == sorted(base.get(k, [])):
                        value = max(value, row[1])
                    gain = value - here
                    if gain > 1e-12 and (best is None or gain / (r2 - r) > best[0]):
                        best = (gain / (r2 - r), k, r2, placed)
            if best is None:
                return
            _, k, r2, placed = best
            current = allocation.get(k, [])
            for h, n in _counts(current):
                free[h] += n
            if len(set(current)) > 1:
                spanning.difference_update(current)
            self._take(placed, free, spanning)
            counts[k] = r2
            allocation[k] = [h for h, n in placed for _ in range(n)]
