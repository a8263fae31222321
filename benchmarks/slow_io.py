"""slow_io: an async handler that awaits 5-20 ms, one partition, many keys.

``ordering="key"`` with ``concurrency=200`` runs records of different keys at once while each
key stays in order; the default partition lane runs them one after another. Every record
carries its key's sequence number, and the handler counts a violation whenever a key's record
starts out of order (or twice).

The partition lane needs ~12.5 ms per record, so it is timed on its first records only and its
rate extrapolated (the output says so); after those it skips the wait, so it drains at once.

Method (``benchmarks.method``): each mode runs in a process of its own, the modes alternate,
at least 3 runs each outside smoke mode, timed from subscribe (the group join is inside the
window of both modes), read-ahead capped alike (it matters little here: the handler, not the
fetch, is the limit).
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from benchmarks.child import Meter
from benchmarks.common import (
    Mode,
    console,
    fast_producer,
    fmt,
    kafka,
    quiet_logs,
    result,
    table,
    wait_for,
)
from benchmarks.method import Comparison, Side, summary_table
from kworkers import Message, Worker
from kworkers.testing.workload import make_topic, unique

SEED = 20240611
PER_KEY = 3  # records per key, shuffled, so a key's records are interleaved with others
MIN_MS, MAX_MS = 5.0, 20.0


def produce_keyed(bootstrap: str, topic: str, keys: int, limit: int) -> tuple[int, int]:
    """``keys`` keys with ``PER_KEY`` records each (at most ``limit`` in all), seeded order.

    Value: ``<key>:<seq>:<delay_ms>``, so both runs see the same delays. Returns the number
    of records and of distinct keys.
    """
    rng = random.Random(SEED)
    order = [k for k in range(keys) for _ in range(PER_KEY)]
    rng.shuffle(order)
    order = order[:limit]
    seq: dict[int, int] = {}
    p = fast_producer(bootstrap)
    for k in order:
        s = seq.get(k, 0)
        seq[k] = s + 1
        delay = rng.uniform(MIN_MS, MAX_MS)
        p.produce(topic, key=b"k%d" % k, value=b"%d:%d:%.3f" % (k, s, delay), partition=0)
    if p.flush(60):
        raise RuntimeError("records not delivered")
    return len(order), len(seq)


@dataclass
class Probe:
    """What the handler saw: per-key order, and when the records ran."""

    limit: int | None = None  # records to time; later ones skip the wait
    meter: Meter | None = None
    last: dict[bytes, int] = field(default_factory=dict)
    violations: int = 0
    started: int = 0
    finished: int = 0

    async def handle(self, msg: Message) -> None:
        raw = (msg.value or b"").split(b":")
        key, s, delay_ms = raw[0], int(raw[1]), float(raw[2])
        if self.last.get(key, -1) != s - 1:
            self.violations += 1
        self.last[key] = s
        self.started += 1
        timed = self.limit is None or self.started <= self.limit
        if timed:
            await asyncio.sleep(delay_ms / 1000)
        self.finished += 1
        if self.meter is not None:
            self.meter.hit()


def side(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """One mode in a process of its own (``benchmarks.child``): the meter times the first
    ``n`` records from subscribe; the worker stops once every record of the topic ran."""
    options = spec["options"]
    total = int(options["records"])
    probe = Probe(limit=meter.n if meter.n < total else None, meter=meter)
    w = Worker(topics=[spec["topic"]], group_id=spec["group"],
               bootstrap_servers=spec["bootstrap"], ordering=options["ordering"],
               concurrency=int(options["concurrency"]),
               consumer_config=dict(spec["consumer_config"]))
    w.handler(probe.handle)
    w.create_topics()
    def stop_when_done() -> None:
        wait_for(lambda: probe.finished >= total, float(spec["timeout"]), "all records", 0.05)
        w.stop()

    stopper = threading.Thread(target=stop_when_done, daemon=True)
    stopper.start()
    meter.start()
    w.run(install_signals=False)
    return {"violations": probe.violations, "finished": probe.finished}


SIDES = (("key", "ordering='key', concurrency=200", "key", 200),
         ("partition", "partition lane", "partition", 8))


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(300, 2_000, 30_000)
    keys = mode.pick(100, 2_000, 10_000)
    timed = mode.pick(30, 200, 400)
    rounds = mode.pick(1, 3, 3)
    with kafka() as bs:
        topic = make_topic(bs, unique("slowio"), 1)
        n, distinct = produce_keyed(bs, topic, keys, n)
        console.print(f"produced {n:,} records over {distinct:,} distinct keys on 1 partition, "
                      f"handler awaits {MIN_MS:.0f}-{MAX_MS:.0f} ms (seeded)")
        cmp = Comparison(bs, topic, 1, n, cpu_bound=False)
        sides = [Side("slow_io", label, n=n if mode_ == "key" else timed,
                      options={"ordering": ordering, "concurrency": conc, "records": n})
                 for mode_, label, ordering, conc in SIDES]
        summaries = cmp.alternate(sides, rounds)
    by_key, lane = summaries[SIDES[0][1]], summaries[SIDES[1][1]]
    summary_table(f"slow_io, {n:,} records, 1 partition, async handler "
                  f"{MIN_MS:.0f}-{MAX_MS:.0f} ms, {rounds} run(s) each, alternated; the "
                  f"partition lane is timed on its first {timed} records, its rate "
                  "extrapolated", summaries.values(), SIDES[1][1])
    ratio = by_key.mps / lane.mps
    violations = sum(int(r.extra["violations"]) for s in summaries.values() for r in s.runs)
    table("slow_io", ["mode", "records/s (median)", "violations (all runs)"],
          [[SIDES[0][1], f"{by_key.mps:,.0f}",
            str(sum(int(r.extra["violations"]) for r in by_key.runs))],
           [f"{SIDES[1][1]} (first {timed} timed)", fmt(lane.mps, 1),
            str(sum(int(r.extra["violations"]) for r in lane.runs))],
           ["speed-up (aim >= 50, 0 violations)", fmt(ratio, 1), str(violations)]])
    result("slow_io", {"ratio": round(ratio, 1), "violations": violations,
                       "key_mps": round(by_key.mps), "partition_mps": round(lane.mps, 1),
                       "records": n, "keys": distinct})
