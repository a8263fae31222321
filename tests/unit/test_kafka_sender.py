"""``KafkaSender`` against a scripted client: every ``SERVE_EVERY``-th send serves the delivery
reports ready then (the dedicated thread alone let them wait ~300 ms in a storm), and a
report's callback that raises there is not blamed on the send that served it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kworkers.kafka import producer as producer_mod
from kworkers.kafka.producer import KafkaSender


class _Client:
    """Reports are 'ready' once acknowledged by the test; ``poll`` serves the ready ones on the
    calling thread and records which thread served them."""

    def __init__(self, _conf: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.pending: list[Any] = []
        self.ready: list[Any] = []
        self.served_on: list[str] = []

    def produce(self, topic: str, **kw: Any) -> None:
        with self.lock:
            self.pending.append(kw["on_delivery"])

    def acknowledge_all(self) -> None:
        with self.lock:
            self.ready += self.pending
            self.pending.clear()

    def poll(self, timeout: float) -> int:
        with self.lock:
            ready, self.ready = self.ready, []
        for cb in ready:
            self.served_on.append(threading.current_thread().name)
            cb(None, None)
        if not ready and timeout:
            threading.Event().wait(min(timeout, 0.01))
        return len(ready)

    def flush(self, _timeout: float) -> int:
        return 0


@pytest.fixture
def sender(monkeypatch: pytest.MonkeyPatch) -> Iterator[KafkaSender]:
    monkeypatch.setattr(producer_mod, "Producer", _Client)
    s = KafkaSender({})
    yield s
    s.close(1)


def test_a_send_serves_the_reports_ready_on_its_own_thread(sender: KafkaSender) -> None:
    """With the serving thread stopped, an earlier record's report that is ready is served by
    the next send, on the sending thread (without ``_serve_ready`` it would wait)."""
    client: Any = sender._p
    sender._closed.set()
    sender._thread.join(5)
    got: list[BaseException | None] = []
    sender.send("t", None, b"first", (), got.append)
    client.acknowledge_all()
    assert got == []  # ready, not yet served
    def more() -> None:  # the sends up to the next one that serves (every SERVE_EVERY-th)
        for _ in range(producer_mod.SERVE_EVERY - 1):
            sender.send("t", None, b"more", (), got.append)

    t = threading.Thread(target=more, name="a-handler")
    t.start()
    t.join(5)
    assert got == [None] and client.served_on == ["a-handler"]
    assert sender.alive()


def test_a_failing_report_callback_is_not_the_sending_records_failure(
        sender: KafkaSender) -> None:
    client: Any = sender._p
    sender._closed.set()  # the serving thread stops: only sends serve reports now
    sender._thread.join(5)

    def broken(_e: Any, _m: Any) -> None:
        raise RuntimeError("a bug in a report's callback")

    with client.lock:
        client.ready.append(broken)
    outcome: list[BaseException | None] = []
    for _ in range(producer_mod.SERVE_EVERY):
        sender.send("t", None, b"v", (), outcome.append)
    assert outcome == []  # the sends themselves succeeded: their reports are still to come
    assert not sender.alive()  # ... and the sender says it is broken
    client.acknowledge_all()
    client.poll(0)
    assert outcome == [None] * producer_mod.SERVE_EVERY
