"""Helpers for tests, benchmarks and the demo: produce numbered records, read committed offsets."""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from kworkers.kafka.admin import admin_client, create_topics
from kworkers.topic_plan import TopicSpec


def full_runs() -> bool:
    """Whether this is a full-size run (``KWORKERS_FULL=1``: by hand, figures in the docs)."""
    return os.environ.get("KWORKERS_FULL", "") not in ("", "0")


#: CI sizes times this factor (rounded up), for the by-hand search of the smallest size at
#: which each scenario's canary still fails (docs/RELIABILITY.md, "CI and full sizes")
SIZE_SCALE_ENV = "KWORKERS_SIZE_SCALE"


def full_size(full: int, ci: int) -> int:
    """A test's size: ``full`` in a full-size run, else the small ``ci`` size that keeps CI
    short (scaled by ``KWORKERS_SIZE_SCALE`` when it is set: never in CI)."""
    if full_runs():
        return full
    raw = os.environ.get(SIZE_SCALE_ENV)
    if not raw:
        return ci
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SIZE_SCALE_ENV}={raw!r}: give a factor such as 0.5") from None
    if not scale > 0:
        raise ValueError(f"{SIZE_SCALE_ENV}={raw!r}: the factor must be > 0")
    return math.ceil(ci * scale)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_topic(bootstrap: str, name: str, partitions: int = 6) -> str:
    create_topics(admin_client(bootstrap), [TopicSpec(name, partitions)])
    return name


def produce_patiently(p: Producer, topic: str, **fields: Any) -> None:
    """One record produced, waiting for room in the client's queue (``BufferError``) instead
    of failing: a test or a benchmark filling a topic outruns the queue."""
    while True:
        try:
            p.produce(topic, **fields)
            return
        except BufferError:
            p.poll(0.05)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
            headers: list[tuple[str, str | bytes | None]] | None = None) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "log_level": 3})
    n = 0
    for key, value in records:
        produce_patiently(p, topic, key=key, value=value, headers=headers)
        n += 1
        if n % 10_000 == 0:
            p.poll(0)
    left = p.flush(60)
    if left:
        raise RuntimeError(f"{left} records not delivered to {topic}")
    return n


def produce_numbered(bootstrap: str, topic: str, n: int, keys: int = 16, start: int = 0) -> int:
    """Values b"<i>", keys b"k<i % keys>": a checker can tell lost from duplicated."""
    return produce(bootstrap, topic, ((f"k{i % keys}".encode(), str(i).encode())
                                      for i in range(start, start + n)))


def produce_activities(bootstrap: str, topic: str, n: int, prefix: str,
                       activity: str = "charge") -> list[str]:
    """``n`` activity records (workflow ``<prefix>-<i>``, the given activity id, as
    ``kw-workflow-id``/``kw-activity-id`` headers; key = workflow id, value = ``<i>``): their
    idempotency keys ``<prefix>-<i>/<activity>``, in order."""
    from kworkers.envelope.envelope import ids_to_headers

    keys = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "log_level": 3})
    for i in range(n):
        wf = f"{prefix}-{i}"
        keys.append(f"{wf}/{activity}")
        produce_patiently(p, topic, key=wf.encode(), value=str(i).encode(),
                          headers=list(ids_to_headers(wf, activity)))
    if p.flush(60):
        raise RuntimeError(f"activities not delivered to {topic}")
    return keys


def committed_total(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return sum(max(tp.offset, 0) for tp in tps)
    finally:
        c.close()


def end_offsets_total(bootstrap: str, topic: str, partitions: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kworkers-probe", "log_level": 3})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(partitions))
    finally:
        c.close()


Record = tuple[bytes | None, bytes | None, dict[str, bytes]]


def read_all(bootstrap: str, topic: str, timeout: float = 10.0) -> list[Record]:
    """Everything in ``topic`` (key, value, headers), read without a group commit."""
    import time

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "log_level": 3})
    c.subscribe([topic])
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    idle = 0
    try:
        while time.monotonic() < deadline:
            batch = c.consume(500, 0.5)
            if not batch:
                idle += 1
                if idle >= 3 and out:
                    break
                continue
            idle = 0
            for m in batch:
                if m.error() is None:
                    raw = m.headers() or []
                    pairs = raw.items() if isinstance(raw, dict) else raw
                    hs = {str(kv[0]): kv[1] if isinstance(kv[1], bytes) else b""
                          for kv in pairs}
                    out.append((m.key(), m.value(), hs))
    finally:
        c.close()
    return out


def produce_steady(bootstrap: str, topic: str, n: int, per_second: float, keys: int = 16,
                   stop: object = None) -> int:
    """Numbered records (as ``produce_numbered``) at a steady rate, through one producer.

    ``stop``: an Event that ends production early.
    """
    import time

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "log_level": 3})
    chunk = max(1, int(per_second / 20))
    sent = 0
    t0 = time.monotonic()
    while sent < n:
        if stop is not None and getattr(stop, "is_set", lambda: False)():
            break
        for i in range(sent, min(n, sent + chunk)):
            p.produce(topic, key=f"k{i % keys}".encode(), value=str(i).encode())
        sent = min(n, sent + chunk)
        p.poll(0)
        ahead = sent / per_second - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    left = p.flush(60)
    if left:
        raise RuntimeError(f"{left} records not delivered to {topic}")
    return sent
