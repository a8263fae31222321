"""Where a failed record's CPU goes, without a broker: ``python -m benchmarks handoff_cpu``.

The storm benchmark measures hand-offs against a real broker, where librdkafka's threads, the
delivery reports and the retry loop reading the tier back share the process's core with the
failure path. This one takes the broker out to tell those apart from the Python the engine
runs per failed record: the worker is built through its front door with two seams of its own
(``Worker(consumer=..., sender=...)``, as the loop's unit tests do), a consumer that hands out
``n`` records in batches as fast as it is asked (paused partitions get none) and a sender that
acknowledges every record at once from a thread of its own (as a delivery-report thread would).

Sides, each ``n`` records, alternated, 3 runs each, medians and spreads: ``noop`` (a handler
that returns), ``batch`` (a batch handler that returns: the engine's own cost per record of a
batch, its records built before the clock starts, issue #50 item 2) and ``fail`` (a handler
that raises at once, first retry in an hour, so each record is handed to the first tier
exactly once), each with 1 handler thread and with the default 8. Reported: records per
second and CPU per record (``time.process_time`` of the whole process: poll loop, handler
threads, the sender's thread; less the benchmark's own thread waiting for the end), and the
ratios the storm's aims are written in (``cpu_ratio``: failing over no-op; ``contention``: 8
threads over 1, failing).

Beside them, each round, the floor of a failed record in this design (``floor_once``): the two
things every failed record needs whatever the engine around them does, each timed alone over
the same records, a thread, no worker: its plan (``FailureRouter.plan``: the rung, the due
time, the headers) and its send (a real confluent-kafka producer's ``produce()`` of the plan's
topic, key, value and headers with a delivery callback, to an address where nothing listens:
librdkafka copies and queues it, nothing leaves; purged after), each the CPU of the calling
thread only (``thread_time``: librdkafka's own threads, which with a broker serialise the
batch, are left out, as is the collector's walk of plans kept alive): a lower bound.
``floor_ratio`` is the two over a no-op record (1 handler thread): no engine built around a
plan and a send per failed record reaches a ``cpu_ratio`` below it. And a
what-if, not the format: the same send with the headers packed into one (``send_packed_us``):
what fewer headers per tier record would take off.
Timed from ``run`` to the n-th completion, read from the worker's own records counter (no
broker to read back from: this measures cost, not correctness; the storm checks the commits).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable
from queue import SimpleQueue
from typing import Any

from benchmarks.common import Mode, console, result, table
from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.consumer.ports import Delivered
from kworkers.message import Headers

PARTITIONS = 6
TP = tuple[str, int]


class _Feed:
    """A consumer port over records made up front; every port call is as cheap as it can be."""

    def __init__(self, n: int, group: str) -> None:
        self.group = group
        per = n // PARTITIONS if n else 0
        self.records = {p: [Message("t", p, o, b"k%d" % o, b"v" * 100) for o in range(per)]
                        for p in range(PARTITIONS if n else 0)}
        self.pos = dict.fromkeys(self.records, 0)
        self.paused: set[TP] = set()
        self.results: list[tuple[dict[TP, int], BaseException | None]] = []

    def subscribe(self, topics: Iterable[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None],
                  on_lost: Callable[[list[TP]], None]) -> None:
        if self.records:
            on_assign([("t", p) for p in self.records])

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        out: list[Message] = []
        share = max(1, n // max(1, len(self.records)))
        for p, recs in self.records.items():
            if ("t", p) in self.paused:
                continue
            i = self.pos[p]
            got = recs[i:i + share]
            self.pos[p] = i + len(got)
            out += got
        if not out:
            time.sleep(min(timeout, 0.005))
        return out

    def commit_async(self, positions: dict[TP, int]) -> None:
        self.results.append((dict(positions), None))

    def commit_results(self) -> list[tuple[dict[TP, int], BaseException | None]]:
        out, self.results = self.results, []
        return out

    def group_metadata(self) -> object:
        return ("group-metadata", self.group)

    def coordinator_contact(self) -> float | None:
        return None

    def session_timeout(self) -> float | None:
        return None

    def pause(self, tps: list[TP]) -> None:
        self.paused |= set(tps)

    def resume(self, tps: list[TP]) -> None:
        self.paused -= set(tps)

    def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
        raise LookupError("no broker")

    def caught_up(self, tp: TP) -> bool:
        return False  # unsure: backpressure pauses, never holds

    def position(self, tps: list[TP]) -> dict[TP, int | None]:
        return dict.fromkeys(tps)

    def close(self) -> None:
        pass

    def is_retryable(self, exc: BaseException) -> bool:
        return False

    def is_rebalancing(self, exc: BaseException) -> bool:
        return False


class _Acknowledger:
    """Acknowledges each record at once, from a thread of its own (a delivery-report thread)."""

    def __init__(self) -> None:
        self._q: SimpleQueue[Delivered | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="bench-acks", daemon=True)
        self._thread.start()

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None:
        self._q.put(done)

    def _serve(self) -> None:
        while (done := self._q.get()) is not None:
            done(None)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(5)


def run_once(side: str, n: int, concurrency: int) -> tuple[float, float]:
    """(records per second, CPU seconds per record) of one run."""
    feed = _Feed(n, "g")
    acks = _Acknowledger()
    w = Worker(topics=["t"], group_id="g", sender=acks, concurrency=concurrency,
               consumer=lambda group: feed if group == "g" else _Feed(0, group),
               retry=RetryPolicy(initial=3600, max_interval=3600, max_attempts=5),
               tiers=TierLadder((3600.0,)))
    if side == "noop":
        @w.handler
        def noop(msg: Message) -> None:
            pass
    elif side == "batch":
        def batch(msgs: list[Message]) -> None:
            pass

        w.batch_handler(batch)
    else:
        @w.handler
        def down(msg: Message) -> None:
            raise ConnectionError("downstream is down")
    counted: Any = w.metrics.records.labels("g", "retried" if side == "fail" else "ok")
    total = (n // PARTITIONS) * PARTITIONS
    thread = threading.Thread(target=w.run, args=(False,), name="bench-worker", daemon=True)
    t0, c0, own0 = time.monotonic(), time.process_time(), time.thread_time()
    thread.start()
    deadline = t0 + 600
    while counted._value.get() < total:
        if time.monotonic() > deadline:
            raise SystemExit(f"{side}: {counted._value.get()} of {total} in 600 s")
        time.sleep(0.002)
    # the engine's CPU: the process's less this thread's own waiting (a wake-up every 2 ms
    # costs the same per second on every side, so the slower side would pay more per record)
    wall = time.monotonic() - t0
    cpu = time.process_time() - c0 - (time.thread_time() - own0)
    w.stop()
    thread.join(30)
    acks.close()
    return total / wall, cpu / total


def floor_once(n: int) -> tuple[float, float, float]:
    """CPU seconds per record of a plan alone, of its send alone, and of the send with its
    headers packed into one (see the module doc)."""
    from confluent_kafka import Producer

    from kworkers.clock import SystemClock
    from kworkers.retry_tiers.policy import SeededJitter
    from kworkers.retry_tiers.router import FailureRouter

    router = FailureRouter(RetryPolicy(initial=3600, max_interval=3600, max_attempts=5),
                           TierLadder((3600.0,)), "g", SeededJitter(), SystemClock())
    records = [Message("t", o % PARTITIONS, o, b"k%d" % o, b"v" * 100) for o in range(n)]
    exc = ConnectionError("downstream is down")
    plan_of = router.plan
    c0 = time.thread_time()
    for m in records:  # each plan dropped at once: none kept alive for the collector to walk
        plan_of(m, exc)
    plan = (time.thread_time() - c0) / n
    plans = [plan_of(m, exc) for m in records]  # untimed: what the sends below send

    def delivered(err: Any, m: Any) -> None:
        pass

    def send(packed: bool) -> float:
        p = Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0, "linger.ms": 20,
                      "queue.buffering.max.messages": n + 1,
                      "queue.buffering.max.kbytes": 2_097_151})
        one: list[tuple[str, str | bytes | None]] = [
            ("kw-retry", b"".join(k.encode() + b"=" + (v or b"") + b"\n"
                                  for k, v in plans[0].headers))]
        c0 = time.thread_time()
        for h in plans:
            p.produce(h.topic, h.value, h.key, headers=one if packed else list(h.headers),
                      on_delivery=delivered)
        spent = time.thread_time() - c0
        p.purge()
        p.flush(0)
        return spent / n

    return plan, send(False), send(True)


def main(mode: Mode) -> None:
    n = mode.pick(6_000, 60_000, 300_000)
    runs = 3
    sides = [(s, c) for c in (1, 8) for s in ("noop", "batch", "fail")]
    got: dict[tuple[str, int], list[tuple[float, float]]] = {k: [] for k in sides}
    floors: list[tuple[float, float, float]] = []
    for r in range(runs):  # alternated: every side once per round
        for side, conc in sides:
            rate, cpu = run_once(side, n, conc)
            got[(side, conc)].append((rate, cpu))
            console.print(f"  round {r + 1}/{runs} {side:4s} x{conc}: {rate:,.0f}/s, "
                          f"{cpu * 1e6:.1f} us CPU per record")
        floors.append(floor_once(n))
        console.print(f"  round {r + 1}/{runs} floor: plan {floors[-1][0] * 1e6:.1f} us, send "
                      f"{floors[-1][1] * 1e6:.1f} us (packed headers {floors[-1][2] * 1e6:.1f})")

    def med(k: tuple[str, int], i: int) -> float:
        return statistics.median(x[i] for x in got[k])

    rows = []
    for k in sides:
        lo, hi = min(x[1] for x in got[k]), max(x[1] for x in got[k])
        rows.append([f"{k[0]} x{k[1]}", f"{med(k, 0):,.0f}", f"{med(k, 1) * 1e6:.1f}",
                     f"{lo * 1e6:.1f}-{hi * 1e6:.1f}"])
    table(f"hand-off CPU without a broker: {n:,} records, {runs} alternated runs per side",
          ["side (handler threads)", "records/s (median)", "us CPU per record (median)",
           "spread"], rows)
    figures = {
        "noop_us": med(("noop", 8), 1) * 1e6, "fail_us": med(("fail", 8), 1) * 1e6,
        "noop_us_1": med(("noop", 1), 1) * 1e6, "fail_us_1": med(("fail", 1), 1) * 1e6,
        "batch_us": med(("batch", 8), 1) * 1e6,
        "cpu_ratio": med(("fail", 8), 1) / med(("noop", 8), 1),
        "cpu_ratio_1": med(("fail", 1), 1) / med(("noop", 1), 1),
        "contention": med(("fail", 8), 1) / med(("fail", 1), 1),
        "ratio": med(("fail", 8), 0) / med(("noop", 8), 0),
        "plan_us": statistics.median(f[0] for f in floors) * 1e6,
        "send_us": statistics.median(f[1] for f in floors) * 1e6,
        "send_packed_us": statistics.median(f[2] for f in floors) * 1e6,
    }
    figures["floor_ratio"] = (figures["plan_us"] + figures["send_us"]) / figures["noop_us_1"]
    console.print(f"CPU per failed record {figures['fail_us']:.1f} us = "
                  f"{figures['cpu_ratio']:.1f}x a no-op record's {figures['noop_us']:.1f} us "
                  f"with 8 threads ({figures['cpu_ratio_1']:.1f}x with 1; 8 threads cost a "
                  f"failure {figures['contention']:.2f}x one); the storm's aim: <= 5x")
    console.print(f"the floor: a failed record's plan {figures['plan_us']:.1f} us and send "
                  f"{figures['send_us']:.1f} us alone are {figures['floor_ratio']:.1f}x a no-op "
                  f"record (1 thread): no engine around them reaches below that; the send "
                  f"with its headers packed into one {figures['send_packed_us']:.1f} us")
    console.print(f"a batch no-op record costs the engine {figures['batch_us']:.2f} us (its "
                  "records made up front: no Message built, no client): what a batch handler "
                  "pays on top of `floor`'s raw loop even if records cost nothing to build")
    result("handoff_cpu", {**figures, "n": n, "runs": runs})
