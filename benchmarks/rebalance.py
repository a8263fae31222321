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
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from benchmarks.common import (
    Mode,
    SteadyProducer,
    console,
    fmt,
    kafka,
    quiet_logs,
    result,
    running,
    table,
    wait_for,
)
from kworkers import Message, Worker
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
                wait_for(lambda: bool(_partitions(b.loops[0].history, "assign", topic)), 90,
                         f"{name}: B assigned")
                wait_for(lambda: seen("B", _partitions(b.loops[0].history, "assign", topic),
                                      t_join), 90, f"{name}: B handling its partitions")
                time.sleep(dwell)
                t_leave = time.monotonic()
            moved = _partitions(b.loops[0].history, "assign", topic)
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
        a_history=list(a.loops[0].history) if a.loops else [],
        b_history=list(b.loops[0].history) if b.loops else [])


def main(mode: Mode) -> None:
    quiet_logs()
    rate = 600.0  # records/s over 6 partitions
    warm = mode.pick(0.5, 1.0, 3.0)
    dwell = mode.pick(0.5, 1.0, 5.0)
    outcomes: dict[str, Outcome] = {}
    with kafka() as bs:
        for name, protocol, extra in SCENARIOS:
            t0 = time.monotonic()
            o = scenario(bs, name, protocol, extra, rate, warm, dwell)
            outcomes[name] = o
            console.print(f"  {name:11s} moved {sorted(o.moved)}: gap {o.gap:.2f}s (join "
                          f"{o.gap_join:.2f}, leave {o.gap_leave:.2f}), resume {o.resume:.2f}s "
                          f"(join {o.resume_join:.2f}, leave {o.resume_leave:.2f}), "
                          f"{o.duplicates} redelivered of {o.handled:,} "
                          f"[{time.monotonic() - t0:.0f}s]")
            console.print(f"    [dim]A: {_summary(o.a_history)}  B: {_summary(o.b_history)}"
                          "[/dim]")
    table(f"rebalance under {rate:.0f} records/s, {PARTITIONS} partitions: longest pause (s)",
          ["protocol", "steady gap", "retained gap (aim <= 1)", "moved: resume", "redelivered"],
          [[o.name, fmt(o.steady_gap, 2), f"{o.gap:.2f} (join {o.gap_join:.2f} / leave "
            f"{o.gap_leave:.2f})", f"{o.resume:.2f} (join {o.resume_join:.2f} / leave "
            f"{o.resume_leave:.2f})", str(o.duplicates)] for o in outcomes.values()])
    figures: dict[str, float | int | str] = {}
    for key in ("eager", "cooperative", "consumer"):
        figures[f"gap_s_{key}"] = round(outcomes[key].gap, 3)
    for key in ("eager", "cooperative", "consumer"):
        figures[f"resume_s_{key}"] = round(outcomes[key].resume, 3)
    figures["redelivered"] = sum(o.duplicates for o in outcomes.values())
    result("rebalance", figures)


def _summary(history: list[tuple[str, list[TP]]]) -> str:
    return " ".join(f"{k}{sorted(p for _, p in tps)}" for k, tps in history)
