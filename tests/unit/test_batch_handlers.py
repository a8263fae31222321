"""Batch handlers through the front door (``Worker(consumer=..., sender=...)``): how batches are
cut, what a return, a ``BatchError`` and a plain exception complete or hand off, the receiver
per record, the deadline per batch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from kworkers import BatchError, BatchPolicy, ConfigError, Message, Worker, activity
from kworkers.envelope.envelope import ids_to_headers
from kworkers.idempotency import SqliteStore
from tests.unit.test_loop_with_fake_consumer import RecordingSender, ScriptedConsumer

TP = tuple[str, int]


def _msgs(n: int, partitions: int = 1, headers: bool = False) -> list[Message]:
    return [Message("t", i % partitions, i // partitions, b"k%d" % (i % 3), b"%d" % i,
                    ids_to_headers("wf", f"a{i}") if headers else ())
            for i in range(n)]


def _run(w: Worker, consumer: ScriptedConsumer, until: Callable[[], bool]) -> None:
    consumer.go.set()
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    t.join(30)
    assert not t.is_alive()


def _worker(consumer: ScriptedConsumer, sender: RecordingSender, **kw: Any) -> Worker:
    idle = ScriptedConsumer([], [], "g.retry")
    idle.go.set()
    return Worker(topics=["t"], group_id="g", concurrency=2, sender=sender,
                  consumer=lambda g: consumer if g == "g" else idle, **kw)


def _final(consumer: ScriptedConsumer) -> dict[TP, int]:
    out: dict[TP, int] = {}
    for positions, outcome in consumer.commits:
        if outcome == "ok":
            out.update(positions)
    return out


def test_batches_are_cut_at_max_size_in_order_and_returning_completes_them() -> None:
    consumer, sender = ScriptedConsumer(_msgs(23), []), RecordingSender()
    w = _worker(consumer, sender, consume_batch=23)
    batches: list[list[int]] = []

    @w.batch_handler(max_size=10)
    def handle(msgs: list[Message]) -> None:
        batches.append([m.offset for m in msgs])

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 23)
    assert batches == [list(range(10)), list(range(10, 20)), [20, 21, 22]]
    assert sender.sent == []


def test_a_batch_error_hands_off_only_the_records_it_names() -> None:
    consumer, sender = ScriptedConsumer(_msgs(6), []), RecordingSender()
    w = _worker(consumer, sender)

    @w.batch_handler
    def handle(msgs: list[Message]) -> None:
        raise BatchError({m: ConnectionError("down") for m in msgs if m.offset in (1, 4)})

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 6)
    assert sorted(cast(bytes, v) for _t, v in sender.sent) == [b"1", b"4"]
    assert {t for t, _v in sender.sent} == {"t.retry.1s"}


def test_any_other_exception_hands_off_every_record_of_the_batch() -> None:
    consumer, sender = ScriptedConsumer(_msgs(4), []), RecordingSender()
    w = _worker(consumer, sender, consume_batch=4)

    @w.batch_handler(max_size=4)
    def handle(msgs: list[Message]) -> None:
        raise ValueError("the bulk request failed")

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 4)
    assert sorted(cast(bytes, v) for _t, v in sender.sent) == [b"0", b"1", b"2", b"3"]


def test_key_ordering_batches_per_partition_keys_in_order() -> None:
    consumer, sender = ScriptedConsumer(_msgs(30, partitions=2), []), RecordingSender()
    w = _worker(consumer, sender, ordering="key", consume_batch=30)
    seen: list[tuple[int, list[int]]] = []
    lock = threading.Lock()

    @w.batch_handler(max_size=5)
    def handle(msgs: list[Message]) -> None:
        assert len({m.partition for m in msgs}) == 1  # one partition per batch
        with lock:
            seen.append((msgs[0].partition, [m.offset for m in msgs]))

    _run(w, consumer, lambda: _final(consumer) == {("t", 0): 15, ("t", 1): 15})
    for p in (0, 1):
        offsets = [o for part, batch in seen if part == p for o in batch]
        assert offsets == list(range(15))  # each key's records in order, none twice


def test_the_receiver_works_per_record_and_key_of_reads_each_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.apply_once("wf/a2", lambda conn: None)  # a2 was done by an earlier attempt
    consumer, sender = ScriptedConsumer(_msgs(5, headers=True), []), RecordingSender()
    w = _worker(consumer, sender, idempotency=store)
    keys: list[str] = []

    @w.batch_handler
    def handle(msgs: list[Message]) -> None:
        keys.extend(activity.key_of(m) for m in msgs)
        raise BatchError({msgs[0]: ConnectionError("down")})

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 5)
    assert keys == ["wf/a0", "wf/a1", "wf/a3", "wf/a4"]  # a2 absorbed, never run
    assert [v for _t, v in sender.sent] == [b"0"]
    assert [k for k in ("wf/a0", "wf/a1", "wf/a3", "wf/a4") if store.is_done(k)] == [
        "wf/a1", "wf/a3", "wf/a4"]  # the failed one was released, not completed


def test_an_async_batch_handler() -> None:
    consumer, sender = ScriptedConsumer(_msgs(12), []), RecordingSender()
    w = _worker(consumer, sender, consume_batch=12)
    sizes: list[int] = []

    @w.batch_handler(max_size=5)
    async def handle(msgs: list[Message]) -> None:
        await asyncio.sleep(0)
        sizes.append(len(msgs))

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 12)
    assert sizes == [5, 5, 2]


def test_the_deadline_applies_per_batch() -> None:
    consumer, sender = ScriptedConsumer(_msgs(6), []), RecordingSender()
    w = _worker(consumer, sender, message_timeout=0.3, consume_batch=6)
    release = threading.Event()

    @w.batch_handler(max_size=3)
    def handle(msgs: list[Message]) -> None:
        if msgs[0].offset == 0:
            release.wait(10)  # the first batch is stuck past its deadline

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 6)
    release.set()
    # the batch timed out
    assert sorted(cast(bytes, v) for _t, v in sender.sent) == [b"0", b"1", b"2"]


def test_outside_a_batch_idempotency_key_says_what_to_use() -> None:
    consumer, sender = ScriptedConsumer(_msgs(1, headers=True), []), RecordingSender()
    w = _worker(consumer, sender)
    errors: list[str] = []

    @w.batch_handler
    def handle(msgs: list[Message]) -> None:
        try:
            activity.idempotency_key()
        except RuntimeError as exc:
            errors.append(str(exc))

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 1)
    assert errors and "activity.key_of(msg)" in errors[0]


@pytest.mark.parametrize("kw", [{"max_size": 0}, {"max_size": 1.5}, {"max_wait_s": -1},
                                {"max_wait_s": 0}, {"max_wait_s": 120}])
def test_bad_batch_settings_are_one_clear_error(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"batch\."):
        BatchPolicy(**kw)  # type: ignore[arg-type]


def test_a_worker_has_one_handler_of_either_kind() -> None:
    w = Worker(topics=["t"], group_id="g")
    w.handler(lambda m: None)
    with pytest.raises(ConfigError, match="one handler"):
        w.batch_handler(lambda ms: None)
