"""The outbox: records commit and roll back with the effect; the relay sends each, in order."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kworkers.errors import ConfigError
from kworkers.idempotency import Outbox, OutboxRecord
from kworkers.message import Headers
from tests.unit.test_idempotency_contract import effect, effect_count, make_spec

KEY = "wf-9/act-3"
HEADERS: Headers = (("kw-workflow-id", b"wf-9"), ("bin", b"\x00\xff"), ("bin", b"again"))


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[Any, Any, Outbox]]:
    spec = make_spec(request.param, tmp_path)
    store: Any = spec.open()
    with store.atomic() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {spec.effects} (key TEXT NOT NULL)", ())
    outbox = Outbox(store, table=spec.name + "_outbox")
    yield spec, store, outbox
    if spec.kind == "postgres":
        with store.atomic() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {outbox.table}, {spec.effects}, {spec.name}", ())
    store.close()


class Sink:
    def __init__(self, fail_on: int | None = None) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, Headers]] = []
        self.fail_on = fail_on

    def __call__(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        if self.fail_on is not None and len(self.sent) == self.fail_on:
            raise ConnectionError("broker did not acknowledge")
        self.sent.append((topic, key, value, headers))


def test_enqueue_commits_with_the_effect(env: Any) -> None:
    spec, store, outbox = env

    def fn(conn: Any) -> None:
        effect(spec, KEY)(conn)
        outbox.enqueue(conn, "payments.done", b"k", b"v", HEADERS)

    assert store.apply_once(KEY, fn)
    assert not store.apply_once(KEY, fn)  # no second effect, no second record
    assert outbox.pending() == [
        OutboxRecord(outbox.pending()[0].id, "payments.done", b"k", b"v", HEADERS)
    ]


def test_enqueue_rolls_back_with_the_effect(env: Any) -> None:
    spec, store, outbox = env
    c = store.claim(KEY, "w1", 30, now=0.0)
    with pytest.raises(RuntimeError), store.transaction(KEY, c.token) as conn:
        effect(spec, KEY)(conn)
        outbox.enqueue(conn, "t", None, None)
        raise RuntimeError("crash before the commit")
    assert outbox.pending() == []
    assert effect_count(store, spec, KEY) == 0
    with store.transaction(KEY, c.token) as conn:
        outbox.enqueue(conn, "t", None, None)
    got = [(r.topic, r.key, r.value, r.headers) for r in outbox.pending()]
    assert got == [("t", None, None, ())]


def test_relay_sends_in_order_and_marks_sent(env: Any) -> None:
    _spec, store, outbox = env
    with store.atomic() as conn:
        for i in range(5):
            outbox.enqueue(conn, "t", str(i).encode(), b"v%d" % i)
    sink = Sink()
    assert outbox.relay_once(sink, limit=3) == 3
    assert outbox.relay_once(sink, limit=3) == 2
    assert outbox.relay_once(sink, limit=3) == 0
    assert [k for _t, k, _v, _h in sink.sent] == [b"0", b"1", b"2", b"3", b"4"]
    assert outbox.pending() == []


def test_relay_failure_keeps_the_unsent(env: Any) -> None:
    _spec, store, outbox = env
    with store.atomic() as conn:
        for i in range(4):
            outbox.enqueue(conn, "t", str(i).encode(), None)
    sink = Sink(fail_on=2)
    with pytest.raises(ConnectionError):
        outbox.relay_once(sink)
    assert [r.key for r in outbox.pending()] == [b"2", b"3"]  # the acknowledged two are gone
    sink.fail_on = None
    assert outbox.relay_once(sink) == 2
    assert [k for _t, k, _v, _h in sink.sent] == [b"0", b"1", b"2", b"3"]


def test_mark_sent_counts_only_pending(env: Any) -> None:
    _spec, store, outbox = env
    with store.atomic() as conn:
        outbox.enqueue(conn, "t", None, b"x")
    [rec] = outbox.pending()
    assert outbox.mark_sent([rec.id, rec.id + 1000]) == 1
    assert outbox.mark_sent([rec.id]) == 0
    assert outbox.mark_sent([]) == 0


def test_relay_forever_stops_on_the_event(env: Any) -> None:
    _spec, store, outbox = env
    with store.atomic() as conn:
        outbox.enqueue(conn, "t", b"1", None)
    stop = threading.Event()
    sink = Sink()

    def send(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        sink(topic, key, value, headers)
        stop.set()

    t = threading.Thread(target=outbox.relay_forever, args=(send, stop), kwargs={"idle_s": 0.01})
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert len(sink.sent) == 1


def test_bad_input_is_a_config_error(env: Any) -> None:
    _spec, store, outbox = env
    with store.atomic() as conn:
        with pytest.raises(ConfigError):
            outbox.enqueue(conn, "", None, None)
        with pytest.raises(ConfigError):
            outbox.enqueue(conn, "t", None, None, (("h", "not bytes"),))
    with pytest.raises(ConfigError):
        outbox.pending(0)
    with pytest.raises(ConfigError):
        Outbox(store, table=f"bad-{uuid.uuid4().hex}")
