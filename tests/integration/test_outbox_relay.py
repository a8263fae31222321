"""The transactional form end to end: effect and outbox record commit together, then relay."""

from __future__ import annotations

from pathlib import Path

import pytest

from kworkers.idempotency import Outbox, SqliteStore
from kworkers.idempotency.outbox import blocking_send
from kworkers.kafka.producer import KafkaSender
from kworkers.kafka.settings import producer_settings
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, read_all, unique

pytestmark = pytest.mark.integration


def test_effect_and_event_commit_together_and_relay_once(kafka_broker: Broker,
                                                         tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("outbox"), 1)
    store = SqliteStore(str(tmp_path / "store.db"))
    outbox = Outbox(store)
    with store.atomic() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, cents INTEGER)")

    def effect(conn: object) -> None:
        conn.execute("INSERT INTO charges VALUES (?, ?)", ("wf-1/charge", 500))  # type: ignore[attr-defined]
        outbox.enqueue(conn, topic, b"wf-1", b"charged 500")  # type: ignore[arg-type]

    def crashing(conn: object) -> None:
        effect(conn)
        raise RuntimeError("crash after the effect, before commit")

    with pytest.raises(RuntimeError):
        store.apply_once("wf-1/charge", crashing)  # rolls back: no effect, no event
    assert outbox.pending() == []
    assert store.apply_once("wf-1/charge", effect)
    assert not store.apply_once("wf-1/charge", effect)  # a redelivery: nothing twice
    sender = KafkaSender(producer_settings(bs, {}))
    try:
        assert outbox.relay_once(blocking_send(sender)) == 1
        assert outbox.relay_once(blocking_send(sender)) == 0
    finally:
        sender.close()
    records = read_all(bs, topic, 5)
    assert [(k, v) for k, v, _h in records] == [(b"wf-1", b"charged 500")]
    with store.atomic() as conn:
        assert conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0] == 1
