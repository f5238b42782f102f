#!/usr/bin/env python3
"""Checks the timelines written by tests/mpi/timeline_test.cc.

usage: check_timeline.py normal DIR NP     (run.json, phase1.json, phase2.json)
       check_timeline.py killed DIR NP     (killed.json: a crash left it unterminated)
Exits non-zero with a message on the first problem.
"""
import json
import sys


def fail(msg):
    print("check_timeline: " + msg, file=sys.stderr)
    sys.exit(1)


def rows(events):
    """pid -> tensor name, from the process_name metadata."""
    return {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name" and e["pid"] != 0}


def spans(events, pid):
    """Top-level spans of one row as (name, begin_ts, children, instants), checking nesting."""
    stack, top = [], []
    for e in events:
        if e.get("pid") != pid or e.get("ph") not in ("B", "E", "i"):
            continue
        if e["ph"] == "B":
            node = [e["name"], e["ts"], [], []]
            (stack[-1][2] if stack else top).append(node)
            stack.append(node)
        elif e["ph"] == "E":
            if not stack:
                fail("row %d: an E event without an open span" % pid)
            stack.pop()
        else:
            if not stack:
                fail("row %d: instant %r outside any span" % (pid, e["name"]))
            stack[-1][3].append(e["name"])
    if stack:
        fail("row %d: spans left open: %s" % (pid, [s[0] for s in stack]))
    return top


def by_name(events):
    return {name: pid for pid, name in rows(events).items()}


def load(path):
    with open(path) as f:
        return json.load(f)


def check_start_metadata(events, path):
    meta = [e for e in events if e.get("ph") == "M" and e.get("pid") == 0]
    if not meta or "start_time_since_epoch_in_micros" not in meta[0].get("args", {}):
        fail("%s: no start_time_since_epoch_in_micros metadata on row 0" % path)


def check_run(path, np):
    events = load(path)
    check_start_metadata(events, path)
    names = by_name(events)
    expected = ["small_%dof8" % i for i in range(8)] + ["big", "gathered", "bcast"]
    for n in expected:
        if n not in names:
            fail("%s: no row for tensor %r (rows: %s)" % (path, n, sorted(names)))
    collective_ts = {}
    for n in expected:
        top = spans(events, names[n])
        op = {"gathered": "ALLGATHER", "bcast": "BROADCAST"}.get(n, "ALLREDUCE")
        shape = [s[0] for s in top]
        if shape != ["NEGOTIATE_" + op, op] * 2:
            fail("%s: row %r has top-level spans %s" % (path, n, shape))
        first_negotiation = top[0]
        ready = set(first_negotiation[3])
        if ready != {str(r) for r in range(np)}:
            fail("%s: %r negotiation shows ready ranks %s, expected all %d" % (path, n, sorted(ready), np))
        if "0" not in top[2][3]:
            fail("%s: second negotiation of %r lacks rank 0's ready instant" % (path, n))
        mpi = {"ALLREDUCE": "MPI_ALLREDUCE", "ALLGATHER": "MPI_ALLGATHER", "BROADCAST": "MPI_BCAST"}[op]
        fused = n.startswith("small_")
        want = (["QUEUE", "MEMCPY_IN_FUSION_BUFFER", mpi, "MEMCPY_OUT_FUSION_BUFFER"] if fused
                else ["QUEUE", mpi])
        for it, execution in enumerate((top[1], top[3])):
            got = [c[0] for c in execution[2]]
            if got != want:
                fail("%s: %r iteration %d has activities %s, expected %s" % (path, n, it, got, want))
            collective_ts[(n, it)] = [c[1] for c in execution[2] if c[0] == mpi][0]
    for it in range(2):
        small = {collective_ts[("small_%dof8" % i, it)] for i in range(8)}
        if len(small) != 1:
            fail("%s: fused tensors do not share one collective span in iteration %d: %s" % (path, it, small))
        if collective_ts[("big", it)] in small:
            fail("%s: 'big' shares the fused span although it exceeds the threshold" % path)


def check_phases(d):
    """phase1.json records tensor "phase1", phase2.json "phase2". Another rank can already ask
    for the next tensor ("between" after phase1, "after.bad.path" after phase2) while rank 0
    is still recording: that tensor may then appear, but only as a negotiation closed at the
    stop, without rank 0's ready instant and without any execution."""
    p1, p2 = load(d + "/phase1.json"), load(d + "/phase2.json")
    for path, events, want, next_name, marks in (
            (d + "/phase1.json", p1, "phase1", "between", True),
            (d + "/phase2.json", p2, "phase2", "after.bad.path", False)):
        check_start_metadata(events, path)
        names = by_name(events)
        if want not in names or set(names) - {want, next_name}:
            fail("%s: rows %s, expected %r (and perhaps %r)" % (path, sorted(names), want, next_name))
        top = spans(events, names[want])
        if [s[0] for s in top] != ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"]:
            fail("%s: row %r has top-level spans %s" % (path, want, [s[0] for s in top]))
        if "0" not in top[0][3]:  # the others' may have come before the start
            fail("%s: %r negotiation lacks rank 0's ready instant" % (path, want))
        if next_name in names:
            early = spans(events, names[next_name])
            if [s[0] for s in early] != ["NEGOTIATE_ALLREDUCE"] or "0" in early[0][3]:
                fail("%s: row %r (another rank's next tensor) has spans %s, instants %s"
                     % (path, next_name, [s[0] for s in early], early and early[0][3]))
        cycles = [e for e in events if e.get("name") == "CYCLE_START" and e.get("ph") == "i"]
        if marks and not cycles:
            fail("%s: mark_cycles was on but there is no CYCLE_START" % path)
        if not marks and cycles:
            fail("%s: CYCLE_START without mark_cycles" % path)


def check_killed(d):
    path = d + "/killed.json"
    text = open(path).read()
    try:
        json.loads(text)
        fail("%s: a killed writer left a complete file, which this test cannot have produced" % path)
    except json.JSONDecodeError:
        pass
    try:
        events = json.loads(text + "]")
    except json.JSONDecodeError as e:
        fail("%s: not a JSON array missing only its ']': %s (ends with %r)" % (path, e, text[-80:]))
    names = set(by_name(events))
    if not {"killed.0", "killed.19"} <= names:
        fail("%s: rows %s lack the tensors recorded before the kill" % (path, sorted(names)))


def main():
    mode, d, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "normal":
        check_run(d + "/run.json", np)
        check_phases(d)
    elif mode == "killed":
        check_killed(d)
    else:
        fail("unknown mode " + mode)
    print("check_timeline: %s timelines OK" % mode)


if __name__ == "__main__":
    main()
