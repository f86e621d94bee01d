#!/usr/bin/env python3
"""Summarise the launch phases that `AGENT_RUN_PHASES=/abs/file agent-run ...` appended.

    python3 bench/phases.py FILE [--markdown]

Each line of FILE is one wrapper's `{"pid": N, "phases": [{"name": ..., "us": ...}, ...]}`, the
microseconds from `main`'s entry at the end of each phase. A phase's own time is its mark minus
the one before (the first counts from `main`). Prints, per phase in launch order, the median and
p99 of its own time over every line that has it, and the same for the total (the `exit` mark).
Then the keeper's lines (`"role": "keeper"`): when it was forked, ready, saw EOF and exited, as
times since the wrapper's `main` (its clock), to set beside the wrapper's cumulative marks.
Last, each process's own CPU at its exit (the `cpu` object: user and system µs, whose sum is
exact, and minor faults).
"""
import json
import statistics
import sys


def q(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarise(lines):
    """(launches, [(phase, n, median µs, p99 µs)] in launch order, the total last) from the
    JSON lines of an AGENT_RUN_PHASES file."""
    order, own = [], {}
    n = 0
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("role", "wrapper") != "wrapper":
            continue  # a helper's line (the keeper's): see summarise_helpers
        prev = 0
        n += 1
        for p in doc.get("phases", []):
            name, us = p["name"], p["us"]
            if name not in own:
                own[name] = []
                order.append(name)
            own[name].append(us - prev)
            prev = us
        own.setdefault("total", []).append(prev)
    if "total" in order:
        order.remove("total")
    order.append("total")
    rows = []
    for name in order:
        v = own.get(name, [])
        if v:
            rows.append((name, len(v), statistics.median(v), q(v, 0.99)))
    return n, rows


def summarise_helpers(lines, role="keeper"):
    """[(mark, n, median µs, p99 µs)] of a helper's lines (`"role": role`): each mark is the
    time since the wrapper's `main` (the helper is forked from it and keeps its clock), not a
    phase's own time, so it lines up with the wrapper's cumulative marks."""
    order, at = [], {}
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("role") != role:
            continue
        for p in doc.get("phases", []):
            if p["name"] not in at:
                at[p["name"]] = []
                order.append(p["name"])
            at[p["name"]].append(p["us"])
    return [(k, len(at[k]), statistics.median(at[k]), q(at[k], 0.99)) for k in order]


def summarise_cpu(lines):
    """{role: [(field, n, median, p99)]} of the `cpu` object each line carries (the process's
    own user and system µs and minor faults at its exit, from getrusage), or {} for lines
    without one (older binaries)."""
    at = {}
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        cpu = doc.get("cpu")
        if not cpu:
            continue
        role = doc.get("role", "wrapper")
        for k in ("user_us", "sys_us", "minflt"):
            at.setdefault(role, {}).setdefault(k, []).append(cpu.get(k, 0))
        # The kernel splits a process's time between user and system by ticks: only the sum
        # is exact for a process that lives a few milliseconds.
        at[role].setdefault("cpu_us", []).append(cpu.get("user_us", 0) + cpu.get("sys_us", 0))
    return {
        role: [(k, len(v), statistics.median(v), q(v, 0.99)) for k, v in fields.items()]
        for role, fields in at.items()
    }


def outside_main(lines, spans):
    """{"before_main", "main", "after_exit", "wall": (median µs, p99 µs)} from the wrapper's
    lines (in launch order) and the harness's (monotonic µs at the spawn, after the wait) for
    each launch, or {} when the lines carry no `zero_monotonic_us` (older binaries)."""
    docs = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("role", "wrapper") == "wrapper":
            docs.append(doc)
    if len(docs) != len(spans) or not all(d.get("zero_monotonic_us") for d in docs):
        return {}
    parts = {"before_main": [], "main": [], "after_exit": [], "wall": []}
    for doc, (t0, t1) in zip(docs, spans):
        zero = doc["zero_monotonic_us"]
        end = doc["phases"][-1]["us"] if doc.get("phases") else 0
        parts["before_main"].append(zero - t0)
        parts["main"].append(end)
        parts["after_exit"].append(t1 - (zero + end))
        parts["wall"].append(t1 - t0)
    return {k: (statistics.median(v), q(v, 0.99)) for k, v in parts.items()}


def print_rows(rows, md, head):
    """(name, n, median µs, p99 µs) rows: a table under `head` with --markdown, else text."""
    if md:
        print(f"| {head} | n | median µs | p99 µs |")
        print("|---|---|---|---|")
    for name, count, m, p99 in rows:
        if md:
            print(f"| {name} | {count} | {m:.0f} | {p99:.0f} |")
        else:
            print(f"{name:16s} n {count:5d}  median {m:8.0f} us  p99 {p99:8.0f} us")


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 2
    md = "--markdown" in argv[1:]
    with open(argv[0]) as f:
        n, rows = summarise(f)
    if not md:
        print(f"{n} launches")
    print_rows(rows, md, "phase")
    with open(argv[0]) as f:
        helpers = summarise_helpers(f)
    if helpers:
        print("\nthe keeper's marks, µs since the wrapper's main:" if not md else "")
        print_rows(helpers, md, "keeper mark")
    with open(argv[0]) as f:
        cpu = summarise_cpu(f)
    if cpu:
        print("\neach process's own CPU at its exit (getrusage, user + system):" if not md else "")
        if md:
            print("| process | CPU µs median / p99 | minor faults median / p99 |")
            print("|---|---|---|")
        for role, fields in cpu.items():
            f = {k: (m, p99) for k, _, m, p99 in fields}
            if md:
                print(f"| {role} | {f['cpu_us'][0]:.0f} / {f['cpu_us'][1]:.0f} "
                      f"| {f['minflt'][0]:.0f} / {f['minflt'][1]:.0f} |")
            else:
                print(f"{role:16s} CPU median {f['cpu_us'][0]:6.0f} us  p99 {f['cpu_us'][1]:6.0f} us"
                      f"  minor faults median {f['minflt'][0]:4.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
