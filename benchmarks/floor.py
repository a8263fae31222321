"""What a record costs before any of kworkers' own work: ``python -m benchmarks floor``.

Issue #32's hot-path aims are ratios to the raw loop (``consume(500)`` and nothing else), and
any design that hands a handler a Python ``Message`` pays, on top of that loop, for building
one per record and for the garbage collector walking the records still in flight. This
benchmark measures those layers alone, against a real broker, so the floor under kworkers'
figures is a measurement and not an estimate. Each variant reads the same topic with a fresh
group from its start, in this process, alternated round by round, 3 rounds:

- ``consume``: the raw client loop (``consume(500, 0.1)``), records dropped;
- ``messages``: the same through kworkers' consumer adapter (``poll_batch``: a ``Message``
  built per record, what the poll thread does first with every fetch);
- ``in_flight``: and the last ``WINDOW`` records kept alive, as records waiting in lanes and
  in flight are (the garbage collector walks them);
- ``in_flight_gc_off``: the same with the collector off (the collector's share).

CPU is ``time.process_time`` (librdkafka's threads included) from subscribe to the N-th record,
per record; no commits, no handler. The layers' differences are what each costs; kworkers'
sides in ``throughput`` and ``peers`` do all of it plus their own work.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer

from benchmarks.common import Mode, console, kafka, produce_fill, quiet_logs, result, table
from benchmarks.method import CAP
from kworkers.kafka.consumer import KafkaConsumerAdapter
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6
VALUE_SIZE = 100
#: records kept alive in ``in_flight``: about what a backlogged worker holds in its lanes
WINDOW = 8_000
TIMEOUT_S = 600.0


def _conf(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": unique("bench-floor"),
            "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 3,
            **CAP}


def _until(n: int, step: Callable[[], int]) -> float:
    """CPU seconds until ``step`` (one poll, returning its records) has returned ``n``."""
    got = 0
    deadline = time.monotonic() + TIMEOUT_S
    c0 = time.process_time()
    while got < n:
        got += step()
        if time.monotonic() > deadline:
            raise SystemExit(f"floor: {got:,} of {n:,} records in {TIMEOUT_S:.0f}s")
    return time.process_time() - c0


def consume(bootstrap: str, topic: str, n: int) -> float:
    c = Consumer(_conf(bootstrap))
    c.subscribe([topic])
    try:
        return _until(n, lambda: sum(1 for m in c.consume(500, 0.1) if m.error() is None))
    finally:
        c.close()


def messages(bootstrap: str, topic: str, n: int, window: int = 0, collect: bool = True) -> float:
    a = KafkaConsumerAdapter(_conf(bootstrap))
    kept: deque[object] = deque(maxlen=max(window, 1))
    a.subscribe([topic], lambda _tps: None, lambda _tps: None, lambda _tps: None)

    def step() -> int:
        got = a.poll_batch(500, 0.1)
        if window:
            kept.extend(got)
        return len(got)

    if not collect:
        gc.disable()
    try:
        return _until(n, step)
    finally:
        gc.enable()
        a.close()


VARIANTS: dict[str, Callable[[str, str, int], float]] = {
    "consume": consume,
    "messages": messages,
    "in_flight": lambda bs, t, n: messages(bs, t, n, WINDOW),
    "in_flight_gc_off": lambda bs, t, n: messages(bs, t, n, WINDOW, collect=False),
}


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 300_000, 1_000_000)
    rounds = mode.pick(1, 3, 3)
    got: dict[str, list[float]] = {k: [] for k in VARIANTS}
    with kafka() as bs:
        topic = make_topic(bs, unique("floor"), PARTITIONS)
        produce_fill(bs, topic, n, PARTITIONS, VALUE_SIZE)
        for r in range(rounds):
            for name, run in VARIANTS.items():
                us = run(bs, topic, n) / n * 1e6
                got[name].append(us)
                console.print(f"  round {r + 1}/{rounds} {name:17s} {us:.2f} us CPU per record")
    med = {k: statistics.median(v) for k, v in got.items()}
    base = med["consume"]
    table(f"floor: {n:,} records x {VALUE_SIZE} B, {PARTITIONS} partitions, CPU per record "
          f"from subscribe, {rounds} run(s) each, alternated",
          ["variant", "us CPU per record (median)", "spread", "above consume"],
          [[k, f"{med[k]:.2f}", f"{min(v):.2f}-{max(v):.2f}", f"{med[k] - base:+.2f}"]
           for k, v in got.items()])
    build = med["messages"] - base
    gc_share = med["in_flight"] - med["in_flight_gc_off"]
    console.print(f"a Message per record costs {build:.2f} us, the collector over {WINDOW:,} "
                  f"records in flight {gc_share:.2f} us, on top of the raw loop's {base:.2f} us")
    result("floor", {"consume_us": round(base, 2), "messages_us": round(med["messages"], 2),
                     "in_flight_us": round(med["in_flight"], 2),
                     "gc_off_us": round(med["in_flight_gc_off"], 2),
                     "build_us": round(build, 2), "gc_us": round(gc_share, 2),
                     "records": n, "runs": rounds})
