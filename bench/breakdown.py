#!/usr/bin/env python3
"""bench/srun.sh --breakdown's report: reads the trace files of its runs (include/gantry/trace.hpp:
"<CLOCK_MONOTONIC ns> <pid> <what>", phases as "NAME +" / "NAME -") and prints, per phase and per
process, the median over the runs of each scenario, side by side.

Usage: breakdown.py DIR: DIR/<scenario>/<run>.trace and DIR/<scenario>/<run>.wall (the run's wall
time in ms as the bench measured it around srun), scenarios in the order of DIR/scenarios.
"""
import os
import statistics
import sys


def phases_of(path):
    """One run: {phase: ms}. Phases of one process add up; of several processes (the step's tasks,
    one per task) the longest counts, as they run side by side."""
    lines = []
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 2)
            if len(parts) == 3 and parts[0].isdigit():
                lines.append((int(parts[0]), parts[1], parts[2]))
    lines.sort()
    if not lines:
        return {}
    open_at, per_pid = {}, {}
    points = {}
    for ns, pid, what in lines:
        if what.endswith(" +"):
            open_at[(pid, what[:-2])] = ns
        elif what.endswith(" -") and (pid, what[:-2]) in open_at:
            name = what[:-2]
            d = (ns - open_at.pop((pid, name))) / 1e6
            per_pid.setdefault(name, {}).setdefault(pid, 0.0)
            per_pid[name][pid] += d
            points.setdefault(name + " -", []).append(ns)
        else:
            points.setdefault(what, []).append(ns)
        if what.endswith(" +"):
            points.setdefault(what, []).append(ns)
    out = {name: max(by_pid.values()) for name, by_pid in per_pid.items()}

    # The step's timeline, from srun's first point to its last.
    def first(what):
        return min(points[what]) if what in points else None

    def last(what):
        return max(points[what]) if what in points else None

    srun0, srun1 = first("srun init"), last("srun exit")
    prep0, prep1 = first("prepare_step +"), last("prepare_step -")
    task = last("join_step -")
    local_user = first("srun local_user_init")
    if None not in (srun0, local_user):
        out["[t] srun init -> srun local_user_init"] = (local_user - srun0) / 1e6
    if None not in (srun0, prep0):
        out["[t] srun init -> slurmstepd prepares"] = (prep0 - srun0) / 1e6
    if None not in (prep0, prep1):
        out["[t] prepare_step (the node's set-up)"] = (prep1 - prep0) / 1e6
    if None not in (prep1, task):
        out["[t] prepare_step done -> last task exec"] = (task - prep1) / 1e6
    if None not in (task, srun1):
        out["[t] last task exec -> srun exits"] = (srun1 - task) / 1e6
    # The holder's exec: its start by the creator (plainly, or to acquire the image first: --acquire-and-hold)
    # to its first point.
    starts = [t for t in (first("start gantry-holder"), first("start gantry-holder --acquire-and-hold")) if t is not None]
    start, main = (min(starts) if starts else None), first("holder main")
    if None not in (start, main):
        out["gantry-holder exec (start -> main)"] = (main - start) / 1e6
    return out


def main():
    root = sys.argv[1]
    with open(os.path.join(root, "scenarios")) as f:
        scenarios = [s.strip() for s in f if s.strip()]
    # "BUILD/MODE:STORE": one table per build.
    for build in dict.fromkeys(s.split("/")[0] for s in scenarios):
        print("== build %s" % build)
        table_of(root, [s for s in scenarios if s.split("/")[0] == build])


def table_of(root, scenarios):
    table, order, walls = {}, [], {}
    for sc in scenarios:
        d = os.path.join(root, sc)
        runs = sorted(r[:-6] for r in os.listdir(d) if r.endswith(".trace"))
        per_phase = {}
        for r in runs:
            for name, ms in phases_of(os.path.join(d, r + ".trace")).items():
                per_phase.setdefault(name, []).append(ms)
                if name not in order:
                    order.append(name)
            with open(os.path.join(d, r + ".wall")) as f:
                walls.setdefault(sc, []).append(float(f.read().strip()))
        # A phase missing from a run (e.g. an image server started only by a job's first step) counts 0 there.
        table[sc] = {name: statistics.median(v + [0.0] * (len(runs) - len(v))) for name, v in per_phase.items()}
    width = max(len(n) for n in order + ["wall (srun, as measured)"]) + 1
    cols = [s.split("/", 1)[-1] for s in scenarios]
    print("%-*s" % (width, "median ms") + "".join("%17s" % c[:16] for c in cols))
    print("%-*s" % (width, "wall (srun, as measured)") +
          "".join("%17.0f" % statistics.median(walls[s]) for s in scenarios))
    timeline = ["[t] srun init -> slurmstepd prepares", "[t] prepare_step (the node's set-up)",
                "[t] prepare_step done -> last task exec", "[t] last task exec -> srun exits"]
    for name in [n for n in timeline if n in order] + [n for n in order if not n.startswith("[t]")]:
        print("%-*s" % (width, name) + "".join(
            ("%17.1f" % table[s][name]) if name in table[s] else "%17s" % "-" for s in scenarios))


if __name__ == "__main__":
    main()
