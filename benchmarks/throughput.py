"""throughput: raw confluent-kafka consume loop vs the full kworkers pipeline, no-op handler.

One pre-produced topic (100-byte values, 6 partitions) is read four times with fresh groups:
raw, kworkers, raw, kworkers; the better run of each side is reported. Time runs from the
first record received (raw) or handled (kworkers) to the last.

The raw baseline is what a hand-written consumer does at best: ``consume(500)`` in a loop,
``enable.auto.commit=false`` and one synchronous commit per second. kworkers runs its whole
pipeline: conversion to ``Message``, per-partition lanes on handler threads, offset tracking,
the commit policy and metrics.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException

from benchmarks.common import (
    Mode,
    console,
    counter_value,
    cpu_delta,
    fmt,
    kafka,
    produce_fill,
    quiet_logs,
    result,
    running,
    table,
    thread_cpu,
)
from kworkers import Message, Worker
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6
VALUE_SIZE = 100


@dataclass(frozen=True)
class Run:
    side: str
    records: int
    seconds: float
    cpu: float  # process CPU seconds over the run
    threads: dict[str, float] = field(default_factory=dict)  # CPU seconds per thread group

    @property
    def mps(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class KwRun(Run):
    commits: float = 0.0  # successful commits until the last record was handled


def raw_fields_run(bootstrap: str, topic: str, n: int, timeout: float = 600.0) -> Run:
    """The raw loop, but reading each record's fields as any real consumer does."""
    r = raw_run(bootstrap, topic, n, timeout, read_fields=True)
    return Run("raw+fields", r.records, r.seconds, r.cpu)


def raw_run(bootstrap: str, topic: str, n: int, timeout: float = 600.0,
            read_fields: bool = False) -> Run:
    """``consume(500)`` until ``n`` records arrived; a synchronous commit once a second."""
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": unique("raw"),
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "log_level": 3,
    })
    c.subscribe([topic])
    count = 0
    cpu0 = time.process_time()
    first: float | None = None
    last_commit = time.monotonic()
    deadline = time.monotonic() + timeout
    try:
        while count < n:
            msgs = c.consume(500, 0.1)
            now = time.monotonic()
            for m in msgs:
                if m.error() is None:
                    if read_fields:  # what a handler gets: coordinates, key, value, time
                        handle((m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                m.headers(), m.timestamp()))
                    else:
                        handle(m)
                    count += 1
            if first is None and count:
                first = now
            if now - last_commit >= 1.0:
                last_commit = now
                with contextlib.suppress(KafkaException):  # nothing to commit yet
                    c.commit(asynchronous=False)
            if now > deadline:
                raise TimeoutError(f"raw consumer read {count} of {n} records")
        end = time.monotonic()
        cpu = time.process_time() - cpu0
        with contextlib.suppress(KafkaException):  # nothing new since the last commit
            c.commit(asynchronous=False)
    finally:
        c.close()
    assert first is not None
    return Run("raw", count, end - first, cpu)


def handle(_msg: object) -> None:
    """The raw loop's no-op handler."""


def kworkers_worker(bootstrap: str, topic: str, n: int,
                    **settings: Any) -> tuple[Worker, threading.Event, list[float]]:
    """A worker with a no-op handler that notes when the first and the ``n``-th record ran."""
    w = Worker(topics=[topic], group_id=unique("kw"), bootstrap_servers=bootstrap, **settings)
    seq = itertools.count()
    marks = [0.0, 0.0]
    done = threading.Event()

    @w.handler
    def handle(msg: Message) -> None:
        i = next(seq)  # atomic under the GIL
        if i == 0:
            marks[0] = time.monotonic()
        elif i == n - 1:
            marks[1] = time.monotonic()
            done.set()

    return w, done, marks


def kworkers_run(bootstrap: str, topic: str, n: int, timeout: float = 600.0,
                 side: str = "kworkers", **settings: Any) -> KwRun:
    """The full pipeline over ``n`` pre-produced records (``settings`` go to ``Worker``)."""
    w, done, marks = kworkers_worker(bootstrap, topic, n, **settings)
    w.create_topics()
    before = thread_cpu()
    cpu0 = time.process_time()
    with running(w):
        if not done.wait(timeout):
            raise TimeoutError(f"kworkers did not handle {n} records in {timeout:.0f}s")
        cpu = time.process_time() - cpu0
        threads = cpu_delta(before, thread_cpu())
        commits = counter_value(w.metrics.commits, w.config.group_id)
    return KwRun(side, n, marks[1] - marks[0], cpu, threads, commits)


def profile_run(bootstrap: str, topic: str, n: int, out: str | None) -> None:
    """The kworkers side once more, under pyinstrument, which samples one thread per profiler.

    Two profiles: the poll loop (``Processor``: poll, convert, dispatch, complete, commit),
    run on the main thread here; and one handler-pool thread (``_run_sync`` and the invoker
    around the handler), sampled from 10% to 90% of the records.
    """
    try:
        from pyinstrument import Profiler
    except ImportError as exc:  # an optional tool, not a dependency of kworkers
        raise SystemExit("--profile needs pyinstrument: .venv/bin/pip install pyinstrument") \
            from exc
    w = Worker(topics=[topic], group_id=unique("kw-prof"), bootstrap_servers=bootstrap)
    seq = itertools.count()
    done = threading.Event()
    lock = threading.Lock()
    runner: dict[str, Any] = {"thread": None, "profiler": None, "stopped": False}

    @w.handler
    def handle(msg: Message) -> None:
        i = next(seq)
        if i == n - 1:
            done.set()
        if runner["stopped"] or i < n // 10:
            return
        me = threading.get_ident()
        if runner["thread"] is None:
            with lock:
                if runner["thread"] is None:
                    runner["thread"] = me
                    runner["profiler"] = Profiler(interval=0.0005)
                    runner["profiler"].start()
        elif runner["thread"] == me and i >= n * 9 // 10:
            runner["profiler"].stop()
            runner["stopped"] = True

    w.create_topics()

    def stopper() -> None:
        done.wait(600)
        w.stop()

    threading.Thread(target=stopper, daemon=True).start()
    profiler = Profiler(interval=0.0005)
    profiler.start()
    w.run(install_signals=False)
    profiler.stop()
    console.rule("poll loop thread")
    console.print(profiler.output_text(unicode=True, color=False, show_all=False))
    console.rule("one handler-pool thread (10% to 90% of the records)")
    if runner["stopped"]:
        console.print(runner["profiler"].output_text(unicode=True, color=False,
                                                     show_all=False))
    else:
        console.print("(the sampled thread ran no record after 90%: no profile this time)")
    if out:
        with open(out, "w") as f:
            f.write(profiler.output_html())
        console.print(f"poll loop profile written to {out}")


def main(mode: Mode, profile: bool = False, profile_out: str | None = None) -> None:
    quiet_logs()
    n = mode.pick(20_000, 200_000, 1_000_000)
    with kafka() as bs:
        topic = make_topic(bs, unique("tput"), PARTITIONS)
        secs = produce_fill(bs, topic, n, PARTITIONS, VALUE_SIZE)
        console.print(f"produced {n:,} records of {VALUE_SIZE} B over {PARTITIONS} partitions "
                      f"in {secs:.1f}s ({n / secs:,.0f}/s)")
        if profile:
            profile_run(bs, topic, n, profile_out)
            return
        runs: list[Run] = []
        for _ in range(2):
            for fn in (raw_run, raw_fields_run, kworkers_run):
                r = fn(bs, topic, n)
                console.print(f"  {r.side:9s} {r.records:,} records in {r.seconds:.2f}s "
                              f"= {r.mps:,.0f} records/s, {r.cpu / r.records * 1e6:.1f} us CPU "
                              "per record")
                runs.append(r)
    raw = max((r for r in runs if r.side == "raw"), key=lambda r: r.mps)
    raw_fields = max((r for r in runs if r.side == "raw+fields"), key=lambda r: r.mps)
    kw = max((r for r in runs if r.side == "kworkers"), key=lambda r: r.mps)
    ratio = kw.mps / raw.mps
    ratio_fields = kw.mps / raw_fields.mps
    if kw.threads:
        total = sum(kw.threads.values())
        table("kworkers CPU by thread (best run; the main loop runs poll, dispatch, commit)",
              ["thread", "CPU s", "share"],
              [[k, fmt(v, 2), f"{v / total:.0%}"]
               for k, v in sorted(kw.threads.items(), key=lambda kv: -kv[1])])
    table(f"throughput, {n:,} records x {VALUE_SIZE} B, {PARTITIONS} partitions (best of 2)",
          ["side", "records/s", "seconds"],
          [["raw confluent-kafka", f"{raw.mps:,.0f}", fmt(raw.seconds, 2)],
           ["raw, reading each record's fields", f"{raw_fields.mps:,.0f}",
            fmt(raw_fields.seconds, 2)],
           ["kworkers Worker", f"{kw.mps:,.0f}", fmt(kw.seconds, 2)],
           ["ratio kworkers/raw (aim >= 0.6)", fmt(ratio, 3), ""],
           ["ratio kworkers/raw reading fields", fmt(ratio_fields, 3), ""]])
    result("throughput", {"ratio": round(ratio, 3), "raw_mps": round(raw.mps),
                          "kworkers_mps": round(kw.mps),
                          "raw_fields_mps": round(raw_fields.mps),
                          "ratio_fields": round(ratio_fields, 3), "records": n})
