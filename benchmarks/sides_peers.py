"""The sides that are not kworkers: the raw client loop and the Python peers, each in its own
venv where its pins need one (see ``benchmarks.peer_envs``).

Every side does the same work per record: its handler calls ``meter.hit()`` once (a counter
step and two comparisons), nothing else. Every side gets the same librdkafka read-ahead cap,
through its own configuration API (``spec["consumer_config"]``, librdkafka names), starts at
the earliest offset with a fresh group, and commits about once a second where the library
lets us choose (see each function). Only the standard library and the side's own library are
imported: this module runs inside the peers' venvs.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from typing import Any

from benchmarks.child import Meter, stop_when_done

FETCH_KEYS = ("fetch.max.bytes", "max.partition.fetch.bytes")
QUEUE_KEYS = ("queued.min.messages", "queued.max.messages.kbytes")


def _cap(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(spec.get("consumer_config") or {})


def _timeout(spec: dict[str, Any]) -> float:
    return float(spec.get("timeout", 600))


# ------------------------------------------------------------------------------ raw client


def raw_consumer(spec: dict[str, Any], **extra: Any) -> Any:
    """The raw loops' consumer: a fresh group from the earliest offset, manual commits, the
    read-ahead cap (the storm's ceiling uses it too)."""
    from confluent_kafka import Consumer

    conf: dict[str, Any] = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "log_level": 3,
    }
    conf.update(_cap(spec))
    conf.update(extra)
    return Consumer(conf)


def raw(spec: dict[str, Any], meter: Meter, read_fields: bool = False) -> dict[str, Any]:
    """What a hand-written consumer does at best: ``consume(500)`` in a loop, one synchronous
    commit a second (``enable.auto.commit=false``), the handler called per record."""
    from confluent_kafka import KafkaException

    c = raw_consumer(spec)
    hit = meter.hit
    commit = spec.get("options", {}).get("commit", True)  # False: the read-back check's canary
    deadline = time.monotonic() + _timeout(spec)
    commits = 0
    meter.start()
    c.subscribe([spec["topic"]])
    last_commit = time.monotonic()
    try:
        while not meter.done.is_set():
            for m in c.consume(500, 0.1):
                if m.error() is None:
                    if read_fields:  # what a handler is given: coordinates, key, value, time
                        _fields = (m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                   m.headers(), m.timestamp())
                    hit()
            now = time.monotonic()
            if commit and now - last_commit >= 1.0:
                last_commit = now
                with contextlib.suppress(KafkaException):  # nothing to commit yet
                    c.commit(asynchronous=False)
                    commits += 1
            if now > deadline:
                meter.wait(0)  # raises: too slow
        if commit:
            with contextlib.suppress(KafkaException):  # nothing new since the last commit
                c.commit(asynchronous=False)
    finally:
        c.close()
    return {"commits": commits}


def raw_fields(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """The raw loop, reading each record's fields as any real handler does."""
    return raw(spec, meter, read_fields=True)


def readahead_probe(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """How many records librdkafka holds ahead of the application, measured, not assumed.

    Consume one record, then stop consuming for ``settle`` seconds while the client's
    background threads fetch as far as the caps let them. librdkafka's statistics
    (``rxmsgs``: records received from the broker so far) are taken during that pause; they
    reach us through a later ``consume()`` call. Read-ahead = rxmsgs at the last statistics
    taken during the pause, minus the one record consumed.
    """
    settle = float(spec.get("options", {}).get("settle_s", 3.0))
    samples: list[tuple[float, int]] = []

    def stats(text: str) -> None:  # "ts": librdkafka's CLOCK_MONOTONIC in microseconds
        doc = json.loads(text)
        samples.append((int(doc["ts"]) / 1e6, int(doc["rxmsgs"])))

    c = raw_consumer(spec, **{"statistics.interval.ms": 250, "stats_cb": stats})
    c.subscribe([spec["topic"]])
    deadline = time.monotonic() + _timeout(spec)
    try:
        while not c.consume(1, 0.2):
            if time.monotonic() > deadline:
                raise TimeoutError("no record to probe the read-ahead with")
        paused = time.monotonic()
        time.sleep(settle)
        resumed = time.monotonic()
        while not any(t >= resumed - 0.3 for t, _ in samples):
            if time.monotonic() > deadline + 10:
                raise TimeoutError("no statistics from librdkafka during the pause")
            c.consume(500, 0.1)  # serves the queued statistics callbacks
        during = [rx for t, rx in samples if paused + 0.5 <= t <= resumed]
    finally:
        c.close()
    import confluent_kafka

    return {"read_ahead": max(during) - 1, "samples": len(during),
            "librdkafka": confluent_kafka.libversion()[0],
            "confluent_kafka": confluent_kafka.version()[0]}


def raw_eos(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """The hand-written exactly-once loop at best: ``consume(500)``, one output produced per
    record by a transactional producer, and once a second ``send_offsets_to_transaction`` with
    the consumer's group metadata and ``commit_transaction`` (KIP-447), on one thread."""
    import uuid

    from confluent_kafka import Producer, TopicPartition

    c = raw_consumer(spec, **{"isolation.level": "read_committed"})
    p = Producer({"bootstrap.servers": spec["bootstrap"], "log_level": 3, "linger.ms": 5,
                  "transactional.id": f"bench-raw-eos-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    out = spec["options"]["output"]
    hit = meter.hit
    deadline = time.monotonic() + _timeout(spec)
    commits = 0
    positions: dict[tuple[str, int], int] = {}

    def commit() -> None:
        nonlocal commits
        if positions:
            p.send_offsets_to_transaction(
                [TopicPartition(t, part, o) for (t, part), o in positions.items()],
                c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            commits += 1
            positions.clear()
            p.begin_transaction()

    meter.start()
    c.subscribe([spec["topic"]])
    p.begin_transaction()
    last_commit = time.monotonic()
    try:
        while not meter.done.is_set():
            for m in c.consume(500, 0.1):
                if m.error() is None:
                    while True:
                        try:
                            p.produce(out, m.value(), m.key())
                            break
                        except BufferError:
                            p.poll(0.01)
                    positions[(m.topic(), m.partition())] = m.offset() + 1
                    hit()
            p.poll(0)
            now = time.monotonic()
            if now - last_commit >= 1.0:
                last_commit = now
                commit()
            if now > deadline:
                meter.wait(0)  # raises: too slow
        commit()
        p.abort_transaction(30)  # the empty one begun after the last commit
    finally:
        c.close()
    return {"commits": commits}


# ------------------------------------------------------------------------------ quixstreams


def quix(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """quixstreams ``Application`` + ``StreamingDataFrame.update``; values as bytes (no JSON
    decoding, as kworkers hands over bytes). ``commit_interval=1.0`` (default 5 s); the
    read-ahead cap goes in ``consumer_extra_config``. Quix polls one record per ``poll()``.
    With ``options.output`` (the eos benchmark) each record is also produced there
    (``StreamingDataFrame.to_topic``) under ``processing_guarantee`` = ``options.guarantee``
    (``exactly-once`` or ``at-least-once``)."""
    import logging

    from quixstreams import Application

    hit = meter.hit
    options = spec.get("options", {})
    extra = ({"processing_guarantee": options.get("guarantee", "exactly-once")}
             if "output" in options else {})
    with tempfile.TemporaryDirectory(prefix="kw-bench-quix-") as state_dir:
        app = Application(
            broker_address=spec["bootstrap"],
            consumer_group=spec["group"],
            auto_offset_reset="earliest",
            commit_interval=1.0,
            consumer_extra_config=_cap(spec),
            loglevel=logging.WARNING,
            state_dir=state_dir,
            **extra,
        )
        topic = app.topic(spec["topic"], value_deserializer="bytes", key_deserializer="bytes")
        sdf = app.dataframe(topic=topic)
        sdf = sdf.update(lambda _value: hit())
        if "output" in options:
            sdf.to_topic(app.topic(options["output"], value_serializer="bytes",
                                   key_serializer="bytes"))
        stop_when_done(meter, app.stop, _timeout(spec))
        meter.start()
        app.run()
    return {}


# ------------------------------------------------------------------------------ Arroyo


def arroyo(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """Arroyo's documented shape (getting-started guide, the one Sentry's consumers use):
    ``StreamProcessor`` + ``RunTask(fn, CommitOffsets(commit))``, ``ONCE_PER_SECOND``.

    ``build_kafka_consumer_configuration`` takes the queue caps as its own parameters and the
    other settings of the cap as ``override_params``. 2.48 defaults to
    ``enable_auto_commit=True`` (librdkafka commits what ``CommitOffsets`` stored, every 5 s);
    we pass False so that the processor commits synchronously at most once a second, as its
    docs describe and as the raw loop and kworkers do. Arroyo polls one record per ``poll()``.
    """
    from arroyo.backends.kafka import KafkaConsumer
    from arroyo.backends.kafka.configuration import build_kafka_consumer_configuration
    from arroyo.commit import ONCE_PER_SECOND
    from arroyo.processing import StreamProcessor
    from arroyo.processing.strategies import CommitOffsets, ProcessingStrategyFactory, RunTask
    from arroyo.types import Topic

    cap = _cap(spec)
    hit = meter.hit

    def task(message: Any) -> Any:
        hit()
        return message.payload

    class Factory(ProcessingStrategyFactory):  # type: ignore[misc]
        def create_with_partitions(self, commit: Any, partitions: Any) -> Any:
            return RunTask(task, CommitOffsets(commit))

    consumer = KafkaConsumer(build_kafka_consumer_configuration(
        default_config={"log_level": 3},
        bootstrap_servers=[spec["bootstrap"]],
        group_id=spec["group"],
        auto_offset_reset="earliest",
        queued_max_messages_kbytes=cap.get("queued.max.messages.kbytes"),
        queued_min_messages=cap.get("queued.min.messages"),
        override_params={k: v for k, v in cap.items() if k not in QUEUE_KEYS},
        enable_auto_commit=False,
    ))
    meter.start()
    processor = StreamProcessor(consumer, Topic(spec["topic"]), Factory(), ONCE_PER_SECOND)
    stop_when_done(meter, processor.signal_shutdown, _timeout(spec))
    processor.run()
    return {}


# ------------------------------------------------------------------------------ faststream


def faststream(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """faststream's confluent ``KafkaBroker`` with one default ``@subscriber`` (one record per
    call, ``async def``). The fetch sizes are subscriber parameters, the rest of the cap goes in
    the broker's ``config``. Its default ack policy (ACK_FIRST) is librdkafka's auto-commit, set
    to once a second (``auto_commit_interval_ms=1000``, default 5 s); note that it commits
    what was polled, not what was handled. Service logging is off (``logger=None``): it logs
    every record at INFO by default, which no other side does.

    ``options.batch``: the batch subscriber instead (``batch=True, max_records=500``: one
    ``consume(500)`` per executor hop, the handler gets a list), for comparison with
    kworkers' batch handlers.
    """
    import asyncio

    from faststream.confluent import KafkaBroker

    cap = _cap(spec)
    hit, hit_many = meter.hit, meter.hit_many
    fetch = {k.replace(".", "_"): cap[k] for k in FETCH_KEYS if k in cap}
    batch = bool(spec.get("options", {}).get("batch"))

    async def run() -> None:
        broker = KafkaBroker(spec["bootstrap"], logger=None,
                             config={k: v for k, v in cap.items() if k not in FETCH_KEYS})

        subscribe = broker.subscriber(spec["topic"], group_id=spec["group"],
                                      auto_offset_reset="earliest", auto_commit_interval_ms=1000,
                                      batch=batch, max_records=500 if batch else None, **fetch)
        if batch:
            @subscribe  # type: ignore[untyped-decorator]  # faststream: its own venv
            async def handle_batch(body: list[bytes]) -> None:
                hit_many(len(body))
        else:
            @subscribe  # type: ignore[untyped-decorator]
            async def handle(body: bytes) -> None:
                hit()

        deadline = time.monotonic() + _timeout(spec)
        meter.start()
        await broker.start()
        try:
            while not meter.done.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await broker.stop()

    asyncio.run(run())
    meter.wait(0)
    return {}
