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


def test_a_worker_runs_its_outbox_relay_while_it_runs(tmp_path: Any) -> None:
    """``Worker(outbox=...)``: the relay (a run hook, kept by ``with_config`` as ``kworkers
    run`` applies its flags) relays while the worker runs, says so in the metrics, and is
    gone after the stop; an outbox on another store than the worker's idempotency store is
    refused (its rows would not commit with the effect)."""
    import dataclasses

    from kworkers import Worker
    from kworkers.idempotency import SqliteStore
    from kworkers.idempotency.relay import OutboxRelay
    from tests.unit.test_loop_with_fake_consumer import RecordingSender, ScriptedConsumer, _idle

    class Closing(RecordingSender):
        closed = False

        def close(self, timeout: float = 30.0) -> None:
            self.closed = True

    store = SqliteStore(str(tmp_path / "s.db"))
    outbox = Outbox(store)
    consumer = ScriptedConsumer([], [])
    worker = Worker(topics=["t"], group_id="g", idempotency=store, outbox=outbox,
                    consumer=lambda g: consumer if g == "g" else _idle(g))
    worker.handler(lambda msg: None)
    hooks = [h for h in worker._run_hooks if isinstance(h, OutboxRelay)]
    assert worker.outbox is outbox and len(hooks) == 1
    sent: list[str] = []
    sender = Closing()  # the broker's part: acknowledges at once
    hooks[0].make_sender = lambda cfg: sender
    again = worker.with_config(dataclasses.replace(worker.config, concurrency=3))
    assert again.outbox is outbox and [h for h in again._run_hooks if h is hooks[0]]
    with store.atomic() as conn:
        outbox.enqueue(conn, "out", b"k", b"v")

    hook = hooks[0]
    thread = threading.Thread(target=again.run, args=(False,), daemon=True)
    thread.start()
    consumer.go.set()
    for _ in range(3000):  # the hook's relay runs once the worker does
        if hook.relay is not None:
            break
        threading.Event().wait(0.01)
    relay = hook.relay
    assert relay is not None and relay.alive() and relay.name == "kworkers-outbox-relay"
    for _ in range(3000):
        if outbox.pending() == []:
            break
        threading.Event().wait(0.01)
    sent = [topic for topic, _v in sender.sent]
    again.stop()
    thread.join(30)
    assert not thread.is_alive() and not relay.alive() and hook.relay is None
    assert outbox.pending() == [] and sent == ["out"] and sender.closed
    assert again.fault is None
    relayed = again.metrics.registry.get_sample_value("kworkers_outbox_relayed_total",
                                                      {"table": "kworkers_outbox"})
    assert relayed == 1
    other = SqliteStore(str(tmp_path / "other.db"))
    with pytest.raises(ConfigError, match="the worker's idempotency store"):
        Worker(topics=["t"], group_id="g", idempotency=other, outbox=outbox)
