"""A downstream outage: how fast failures are handed to the tiers, and how soon all is applied.

Three sides on one topic of one broker, each in a process of its own (``benchmarks.method``:
read-ahead capped equally, timed from subscribe to the N-th record, alternated, >= 3 runs,
medians, spreads, CPU of the side and of the broker):

- ``raw``: the ceiling. A hand-written confluent-kafka loop that consumes each record and
  produces it to the tier topic with a failure record of the same shape as kworkers' (eleven
  headers), on an idempotent producer with kworkers' hand-off settings, counting delivery
  reports; once a second it waits for every outstanding report, then commits (so it commits
  only what the broker acknowledged, as kworkers does);
- ``noop``: the worker with a no-op handler (the baseline the aim is a ratio of);
- ``handoff``: the worker whose handler raises at once for every record (a dependency that is
  down), no idempotency store; the retry policy's first delay (1 h) is far beyond the run, so
  every record is handed to the first tier exactly once. Counted when the hand-off was
  acknowledged and its offset completed (the worker's ``retried`` count, read every 2 ms).
  The tier is emptied before each run (the worker reads it too: a fresh group would read
  the hand-offs of every earlier run from the earliest offset).

Then ``recovery``, in this process: a smaller storm where the downstream is down for
``outage`` seconds while every record fails through short tiers, then comes back: seconds from
its return until every record was applied, and the process's peak RSS (VmHWM).

Aims (issue #32): ``handoff`` >= 0.3x ``noop`` (``ratio``), CPU per failed record <= 5x CPU
per no-op record (``cpu_ratio``). ``--profile`` runs the ``handoff`` side once more under
py-spy instead (``benchmarks.profile``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

from benchmarks.child import Meter
from benchmarks.common import Mode, console, fmt, kafka, produce_fill, quiet_logs, result
from benchmarks.method import Comparison, Side, summary_table
from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.kafka.admin import admin_client, create_topics
from kworkers.topic_plan import TopicSpec

PARTITIONS = 6
VALUE_SIZE = 100
#: the first (and only) tier of the timed sides: nothing comes back during a run
TIER_S = 3600.0
SIDES = (Side("storm_raw", "raw"), Side("kworkers", "noop"),
         Side("storm_handoff", "handoff"))


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _policy() -> tuple[RetryPolicy, TierLadder]:
    return (RetryPolicy(initial=TIER_S, max_interval=TIER_S, max_attempts=5),
            TierLadder((TIER_S,)))


# ---------------------------------------------------------------------------- the sides


def _empty(bootstrap: str, topic: str) -> None:
    """Deletes every record of ``topic`` (up to its end): a fresh group reads the tier from its
    earliest offset, so without this each run would also read the hand-offs of every run
    before it (each earlier ``raw`` and ``handoff`` run adds N), and grow slower run by run."""
    from confluent_kafka import OFFSET_END, TopicPartition

    admin = admin_client(bootstrap)
    parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
    done = admin.delete_records([TopicPartition(topic, p, OFFSET_END) for p in parts])
    for fut in done.values():
        fut.result(30)


def handoff_side(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """The worker whose handler always raises; ``meter`` counts completed hand-offs. Its tier
    is emptied first (set-up, before the clock starts): the run reads only its own."""
    from benchmarks.sides_kworkers import run_worker

    _empty(spec["bootstrap"], spec["options"]["tier"])
    policy, ladder = _policy()
    group = spec["group"]

    def register(w: Worker) -> None:
        @w.handler
        def down(msg: Message) -> None:
            raise ConnectionError("downstream is down")

        retried = w.metrics.records.labels(group, "retried")

        def count() -> None:  # the worker's count of acknowledged, completed hand-offs
            seen = 0
            while not meter.done.is_set():
                now = int(retried._value.get())
                if now > seen:
                    meter.hit_many(now - seen)
                    seen = now
                time.sleep(0.002)

        threading.Thread(target=count, name="bench-counter", daemon=True).start()

    return run_worker(spec, meter, register, retry=policy, tiers=ladder)


def raw_side(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """The ceiling: consume, produce to the tier with a failure record, count acknowledgements.

    Per record it builds what kworkers' failure record holds (attempt, origin, group, failure
    times, error type and message, due time) as plain header bytes, and leaves out what it
    would not do: routing, checks, offset tracking, lanes, metrics."""
    from confluent_kafka import KafkaException, Producer

    from benchmarks.sides_peers import raw_consumer
    from kworkers.kafka.settings import producer_settings

    c = raw_consumer(spec)
    p = Producer(producer_settings(spec["bootstrap"]))
    hit = meter.hit
    tier = spec["options"]["tier"]
    group = spec["group"].encode()
    topic_b = spec["topic"].encode()

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            hit()

    deadline = time.monotonic() + float(spec.get("timeout", 600))
    commits = 0
    meter.start()
    c.subscribe([spec["topic"]])
    last_commit = time.monotonic()
    try:
        while not meter.done.is_set():
            now_ms = b"%d" % round(time.time() * 1000)
            due = b"%d" % round(time.time() * 1000 + TIER_S * 1000)
            for m in c.consume(500, 0.1):
                if m.error() is not None:
                    continue
                headers = [("kw-attempt", b"2"), ("kw-original-topic", topic_b),
                           ("kw-original-partition", b"%d" % int(m.partition() or 0)),
                           ("kw-original-offset", b"%d" % int(m.offset() or 0)),
                           ("kw-original-timestamp", b"%d" % m.timestamp()[1]),
                           ("kw-group", group), ("kw-first-failure-at", now_ms),
                           ("kw-last-failure-at", now_ms), ("kw-error-type", b"ConnectionError"),
                           ("kw-error-message", b"downstream is down"), ("kw-due-at", due)]
                while True:
                    try:
                        p.produce(tier, value=m.value(), key=m.key(), headers=headers,
                                  on_delivery=delivered)
                        break
                    except BufferError:
                        p.poll(0.05)
            p.poll(0)
            now = time.monotonic()
            if now - last_commit >= 1.0:
                last_commit = now
                p.flush(30)  # every record consumed so far is acknowledged: commit them
                with contextlib.suppress(KafkaException):
                    c.commit(asynchronous=False)
                    commits += 1
            if now > deadline:
                meter.wait(0)  # raises: too slow
        p.flush(30)
        with contextlib.suppress(KafkaException):
            c.commit(asynchronous=False)
    finally:
        c.close()
    return {"commits": commits}


# ---------------------------------------------------------------------------- recovery


def _recovery(bs: str, n: int, outage: float) -> tuple[float, int]:
    topic = f"storm-rec-{int(time.time())}"
    create_topics(admin_client(bs), [TopicSpec(topic, PARTITIONS)])
    produce_fill(bs, topic, n, PARTITIONS)
    applied: set[bytes] = set()
    lock = threading.Lock()
    down = threading.Event()
    down.set()
    w = Worker(topics=[topic], group_id="storm-recovery", bootstrap_servers=bs,
               retry=RetryPolicy(initial=0.5, backoff=2.0, max_interval=2.0, max_attempts=100),
               tiers=TierLadder((0.5, 1.0, 2.0)))
    w.create_topics(PARTITIONS)

    @w.handler
    def handle(msg: Message) -> None:
        if down.is_set():
            raise ConnectionError("downstream is down")
        with lock:
            applied.add(msg.value or b"")

    from benchmarks.common import running, wait_for

    with running(w):
        time.sleep(outage)
        down.clear()
        back = time.monotonic()
        done = wait_for(lambda: len(applied) >= n, 900, "every record applied", poll=0.02)
    handed = int(w.metrics.records.labels("storm-recovery", "retried")._value.get())
    return done - back, handed


# ---------------------------------------------------------------------------- main


def main(mode: Mode, profile: bool = False) -> None:
    quiet_logs()
    n = mode.pick(20_000, 100_000, 300_000)
    rounds = mode.pick(1, 3, 3)
    rec_n, outage = mode.pick((2_000, 2.0), (20_000, 10.0), (30_000, 30.0))
    with kafka() as bs:
        cmp = Comparison.on_new_topic(bs, "storm", n, PARTITIONS, VALUE_SIZE)
        tier = TierLadder((TIER_S,)).tiers(cmp.topic)[0].topic
        create_topics(admin_client(bs), [TopicSpec(tier, PARTITIONS)])
        sides = [Side(s.name, s.label, options={"tier": tier}) for s in SIDES]
        if profile:
            from benchmarks.profile import profile_side

            profile_side(cmp, sides[2])
            return
        cmp.measure_read_ahead(sys.executable)
        summaries = cmp.alternate(sides, rounds)
        rec_s, handed = _recovery(bs, rec_n, outage)
    raw, noop, handoff = summaries["raw"], summaries["noop"], summaries["handoff"]
    summary_table(f"failure storm: {n:,} records x {VALUE_SIZE} B, {PARTITIONS} partitions, "
                  f"timed from subscribe to the N-th record, {rounds} run(s) each, alternated",
                  summaries.values(), "noop", cmp.read_ahead)
    us = {k: (s.median(lambda r: r.cpu_s) or 0.0) / s.n * 1e6 for k, s in summaries.items()}
    ratio = handoff.mps / noop.mps
    cpu_ratio = us["handoff"] / us["noop"]
    console.print(f"handoff/noop = {ratio:.3f} (aim >= 0.3: {'met' if ratio >= 0.3 else 'MISSED'})"
                  f"; CPU per failed record {us['handoff']:.1f} us = {cpu_ratio:.1f}x a no-op "
                  f"record's {us['noop']:.1f} us (aim <= 5x: "
                  f"{'met' if cpu_ratio <= 5 else 'MISSED'}); handoff/raw (the ceiling) = "
                  f"{handoff.mps / raw.mps:.3f}, raw {us['raw']:.1f} us per record")
    console.print(f"recovery: {rec_n:,} records failing for {outage:.0f}s ({handed:,} hand-offs)"
                  f", all applied {fmt(rec_s, 2)}s after the downstream came back")
    result("storm", {"handoff_mps": round(handoff.mps), "noop_mps": round(noop.mps),
                     "raw_mps": round(raw.mps), "ratio": round(ratio, 3),
                     "raw_ratio": round(handoff.mps / raw.mps, 3),
                     "cpu_us_handoff": round(us["handoff"], 1),
                     "cpu_us_noop": round(us["noop"], 1), "cpu_us_raw": round(us["raw"], 1),
                     "cpu_ratio": round(cpu_ratio, 2), "recovery_s": round(rec_s, 2),
                     "peak_rss_mb": round(_peak_rss_mb(), 1),
                     "short_commits": sum(s.short_commits for s in summaries.values()),
                     "n": n, "runs": rounds})
