"""slow_io: an async handler that awaits 5-20 ms, one partition, many keys.

``ordering="key"`` with ``concurrency=200`` runs records of different keys at once while each
key stays in order; the default partition lane runs them one after another. Every record
carries its key's sequence number, and the handler counts a violation whenever a key's record
starts out of order (or twice).

The partition lane needs ~12.5 ms per record, so it is timed on its first records only and its
rate extrapolated (the output says so); after those it skips the wait, so it drains at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from benchmarks.common import (
    Mode,
    console,
    fast_producer,
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
    last: dict[bytes, int] = field(default_factory=dict)
    violations: int = 0
    started: int = 0
    finished: int = 0
    first_start: float = 0.0
    limit_end: float = 0.0
    last_end: float = 0.0

    async def handle(self, msg: Message) -> None:
        raw = (msg.value or b"").split(b":")
        key, s, delay_ms = raw[0], int(raw[1]), float(raw[2])
        if self.last.get(key, -1) != s - 1:
            self.violations += 1
        self.last[key] = s
        if self.started == 0:
            self.first_start = time.monotonic()
        self.started += 1
        timed = self.limit is None or self.started <= self.limit
        if timed:
            await asyncio.sleep(delay_ms / 1000)
        self.finished += 1
        now = time.monotonic()
        self.last_end = now
        if self.limit is not None and self.finished == self.limit:
            self.limit_end = now


def run(bootstrap: str, topic: str, n: int, ordering: str, concurrency: int,
        limit: int | None) -> Probe:
    probe = Probe(limit=limit)
    w = Worker(topics=[topic], group_id=unique(f"slow-{ordering}"), bootstrap_servers=bootstrap,
               ordering=ordering, concurrency=concurrency)
    w.handler(probe.handle)
    w.create_topics()
    with running(w):
        wait_for(lambda: probe.finished >= n, 600, f"{n} records ({ordering} ordering)", 0.05)
    return probe


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(300, 2_000, 30_000)
    keys = mode.pick(100, 2_000, 10_000)
    timed = mode.pick(30, 200, 400)
    with kafka() as bs:
        topic = make_topic(bs, unique("slowio"), 1)
        n, distinct = produce_keyed(bs, topic, keys, n)
        console.print(f"produced {n:,} records over {distinct:,} distinct keys on 1 partition, "
                      f"handler awaits {MIN_MS:.0f}-{MAX_MS:.0f} ms (seeded)")
        by_key = run(bs, topic, n, "key", 200, None)
        key_s = by_key.last_end - by_key.first_start
        key_rate = n / key_s
        console.print(f"  key ordering, concurrency 200: {n:,} records in {key_s:.2f}s "
                      f"= {key_rate:,.0f} records/s")
        lane = run(bs, topic, n, "partition", 8, timed)
        lane_s = lane.limit_end - lane.first_start
        lane_rate = timed / lane_s
        console.print(f"  partition lane: first {timed} records timed in {lane_s:.2f}s = "
                      f"{lane_rate:,.1f} records/s; {n:,} records extrapolated to "
                      f"{n / lane_rate:,.0f}s")
    ratio = key_rate / lane_rate
    violations = by_key.violations + lane.violations
    table(f"slow_io, {n:,} records, 1 partition, async handler {MIN_MS:.0f}-{MAX_MS:.0f} ms",
          ["mode", "records/s", "violations"],
          [["ordering='key', concurrency=200", f"{key_rate:,.0f}", str(by_key.violations)],
           [f"partition lane (first {timed} timed, extrapolated)", fmt(lane_rate, 1),
            str(lane.violations)],
           ["speed-up (aim >= 50, 0 violations)", fmt(ratio, 1), str(violations)]])
    result("slow_io", {"ratio": round(ratio, 1), "violations": violations,
                       "key_mps": round(key_rate), "partition_mps": round(lane_rate, 1),
                       "records": n, "keys": distinct})
