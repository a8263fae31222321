"""rebalance: a second member joins, then leaves, under steady load; how long does work stop?

Three group set-ups, each on a topic of its own (6 partitions, steady production):

- ``eager``: classic protocol, ``partition.assignment.strategy=range`` (eager in librdkafka:
  every member gives up every partition on every rebalance);
- ``cooperative``: classic protocol, cooperative-sticky (the kworkers default);
- ``consumer``: the KIP-848 protocol (``group_protocol="consumer"``), the broker assigns.

The classic set-ups use ``session.timeout.ms=6000`` and ``heartbeat.interval.ms=500`` so that
they notice a rebalance as fast as KIP-848 does with this broker's 500 ms heartbeat.

Member A runs alone, B joins, runs for a while, and stops cleanly. Every handled record is
stamped with its partition and time. "Moved" partitions are the ones B was assigned; the
others stayed with A ("retained"). Figures:

- gap: the longest pause between two handled records of a retained partition from B's join to
  the end (normal pauses at this rate are ~0.1 s, shown as "steady gap");
- resume: the longest pause on a moved partition, i.e. from A's last record before the move to
  B's first (join), and from B's last to A's first after B left (leave).

Method (``benchmarks.method``): each scenario runs in a process of its own (both members and the
steady producer), the read-ahead capped like every other benchmark's; the scenarios alternate
(eager, cooperative, consumer, eager, ...), at least 3 runs each outside smoke mode, and the
table gives the median and the spread. Throughput-style timing from subscribe does not apply
here: the figures are pauses between handled records.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks.child import Meter
from benchmarks.common import (
    Mode,
    SteadyProducer,
    console,
    kafka,
    quiet_logs,
    result,
    running,
    table,
    wait_for,
)
from benchmarks.method import CAP, run_child
from kworkers import Message, Worker
from kworkers.consumer.processor import Processor
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6
CLASSIC_TIMING = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
SCENARIOS: tuple[tuple[str, str, Mapping[str, str | int]], ...] = (
    ("eager", "classic", {"partition.assignment.strategy": "range", **CLASSIC_TIMING}),
    ("cooperative", "classic", dict(CLASSIC_TIMING)),
    ("consumer", "consumer", {}),
)
TP = tuple[str, int]
Event = tuple[float, int, str, bytes]  # (monotonic time, partition, member, value)


@dataclass(frozen=True)
class Outcome:
    name: str
    moved: frozenset[int]
    steady_gap: float
    gap_join: float
    gap_leave: float
    resume_join: float
    resume_leave: float
    duplicates: int
    handled: int
    a_history: list[tuple[str, list[TP]]]
    b_history: list[tuple[str, list[TP]]]

    @property
    def gap(self) -> float:
        return max(self.gap_join, self.gap_leave)

    @property
    def resume(self) -> float:
        return max(self.resume_join, self.resume_leave)


def _history(w: Worker) -> list[tuple[str, list[TP]]]:
    """The partitioned loop's rebalance history (this benchmark never runs share mode)."""
    if not w.loops:
        return []
    loop = w.loops[0]
    assert isinstance(loop, Processor)
    return loop.history


def _partitions(history: list[tuple[str, list[TP]]], kind: str, topic: str) -> set[int]:
    return {p for k, tps in history if k == kind for t, p in tps if t == topic}


def _max_gap(times: list[float], start: float, end: float) -> float:
    """Longest interval between consecutive times whose later end falls in (start, end]."""
    best = 0.0
    for a, b in itertools.pairwise(times):
        if start < b <= end:
            best = max(best, b - a)
    return best


def scenario(bootstrap: str, name: str, protocol: str, extra: Mapping[str, str | int],
             rate: float, warm: float, dwell: float) -> Outcome:
    topic, group = make_topic(bootstrap, unique(f"rebal-{name}"), PARTITIONS), unique("g")
    events: list[Event] = []  # list.append is atomic under the GIL

    def make(member: str) -> Worker:
        w = Worker(topics=[topic], group_id=group, bootstrap_servers=bootstrap,
                   group_protocol=protocol, consumer_config=dict(extra))

        @w.handler
        def handle(msg: Message) -> None:
            events.append((time.monotonic(), msg.partition, member, msg.value or b""))

        return w

    def seen(member: str, parts: set[int], since: float) -> bool:
        got = {p for t, p, m, _ in events if m == member and t > since}
        return parts <= got

    a = make("A")
    a.create_topics()
    producer = SteadyProducer(bootstrap, topic, PARTITIONS, rate).start()
    everything = set(range(PARTITIONS))
    try:
        with running(a):
            wait_for(lambda: seen("A", everything, 0.0), 90, f"{name}: A handling all partitions")
            t_warm = time.monotonic()
            time.sleep(warm)
            t_join = time.monotonic()
            b = make("B")
            with running(b):
                wait_for(lambda: bool(_partitions(_history(b), "assign", topic)), 90,
                         f"{name}: B assigned")
                wait_for(lambda: seen("B", _partitions(_history(b), "assign", topic),
                                      t_join), 90, f"{name}: B handling its partitions")
                time.sleep(dwell)
                t_leave = time.monotonic()
            moved = _partitions(_history(b), "assign", topic)
            wait_for(lambda: seen("A", moved, t_leave), 90, f"{name}: A taking back {moved}")
            time.sleep(dwell)
            t_end = time.monotonic()
    finally:
        producer.stop()

    per_part: dict[int, list[float]] = {p: [] for p in everything}
    for t, p, _, _ in events:
        if t <= t_end:
            per_part[p].append(t)
    for p in everything:
        per_part[p].sort()
        per_part[p].append(t_end)  # a partition that never resumed counts until the end
    retained = everything - moved

    def worst(parts: set[int], start: float, end: float) -> float:
        return max((_max_gap(per_part[p], start, end) for p in parts), default=0.0)

    values = Counter(v for _, _, _, v in events)
    return Outcome(
        name=name, moved=frozenset(moved),
        steady_gap=worst(everything, t_warm, t_join),
        gap_join=worst(retained, t_join, t_leave), gap_leave=worst(retained, t_leave, t_end),
        resume_join=worst(moved, t_join, t_leave), resume_leave=worst(moved, t_leave, t_end),
        duplicates=sum(c - 1 for c in values.values() if c > 1), handled=len(events),
        a_history=list(_history(a)),
        b_history=list(_history(b)))


def side(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """One scenario in a process of its own (``benchmarks.child``), the read-ahead capped like
    every other benchmark's; returns the outcome's figures."""
    o = spec["options"]
    name = o["scenario"]
    _, protocol, extra = next(s for s in SCENARIOS if s[0] == name)
    out = scenario(spec["bootstrap"], name, protocol, {**spec["consumer_config"], **extra},
                   float(o["rate"]), float(o["warm"]), float(o["dwell"]))
    return {"moved": sorted(out.moved), "steady_gap": out.steady_gap, "gap": out.gap,
            "gap_join": out.gap_join, "gap_leave": out.gap_leave, "resume": out.resume,
            "resume_join": out.resume_join, "resume_leave": out.resume_leave,
            "duplicates": out.duplicates, "handled": out.handled,
            "a": _summary(out.a_history), "b": _summary(out.b_history)}


def main(mode: Mode) -> None:
    quiet_logs()
    rate = 600.0  # records/s over 6 partitions
    options = {"rate": rate, "warm": mode.pick(0.5, 1.0, 3.0),
               "dwell": mode.pick(0.5, 1.0, 5.0)}
    rounds = mode.pick(1, 3, 3)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in SCENARIOS}
    with kafka() as bs:
        for r in range(rounds):
            for name, _, _ in SCENARIOS:  # alternated: eager, cooperative, consumer, eager, ...
                t0 = time.monotonic()
                spec = {"side": "rebalance", "bootstrap": bs, "consumer_config": CAP,
                        "options": {**options, "scenario": name}, "timeout": 600}
                o = run_child(sys.executable, spec, 900)["extra"]
                runs[name].append(o)
                console.print(f"  round {r + 1}/{rounds} {name:11s} moved {o['moved']}: gap "
                              f"{o['gap']:.2f}s (join {o['gap_join']:.2f}, leave "
                              f"{o['gap_leave']:.2f}), resume {o['resume']:.2f}s (join "
                              f"{o['resume_join']:.2f}, leave {o['resume_leave']:.2f}), "
                              f"{o['duplicates']} redelivered of {o['handled']:,} "
                              f"[{time.monotonic() - t0:.0f}s]")
                console.print(f"    [dim]A: {o['a']}  B: {o['b']}[/dim]")

    def cell(name: str, key: str) -> str:
        values = [float(o[key]) for o in runs[name]]
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    table(f"rebalance under {rate:.0f} records/s, {PARTITIONS} partitions: longest pause (s), "
          f"median (min-max) of {rounds} run(s) each, alternated",
          ["protocol", "steady gap", "retained gap: join", "retained gap: leave",
           "moved: resume join", "moved: resume leave", "redelivered"],
          [[name, cell(name, "steady_gap"), cell(name, "gap_join"), cell(name, "gap_leave"),
            cell(name, "resume_join"), cell(name, "resume_leave"),
            str(sum(int(o["duplicates"]) for o in runs[name]))] for name in runs])
    figures: dict[str, float | int | str] = {}
    for key in ("gap", "resume"):
        for name in runs:
            figures[f"{key}_s_{name}"] = round(
                statistics.median(float(o[key]) for o in runs[name]), 3)
    figures["redelivered"] = sum(int(o["duplicates"]) for v in runs.values() for o in v)
    figures["runs"] = rounds
    result("rebalance", figures)


def _summary(history: list[tuple[str, list[TP]]]) -> str:
    return " ".join(f"{k}{sorted(p for _, p in tps)}" for k, tps in history)
