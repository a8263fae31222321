"""How the adapter asks the client for records (``KafkaConsumerAdapter.poll_batch``).

confluent-kafka's ``consume(n, timeout)`` returns only once ``n`` records arrived or the whole
timeout passed (measured on the real broker: one record produced 0.3 s into a
``consume(500, 2.0)`` came back after 2.0 s). So the adapter takes what the client holds
without waiting, and only when that is nothing waits for the *first* record, then takes what
came with it. A scripted client stands in for the real one (whose wait is what is avoided)."""

from __future__ import annotations

from typing import Any

from kworkers.kafka.consumer import KafkaConsumerAdapter


class _Raw:
    """Just what ``poll_batch`` reads of a client message."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000 + self._offset)


class _Client:
    """Answers each ``consume`` from a script and records the calls."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.calls: list[tuple[int, float]] = []
        self.next = 0

    def consume(self, n: int, timeout: float) -> list[Any]:
        self.calls.append((n, timeout))
        k = min(n, self.answers.pop(0)) if self.answers else 0
        out = [_Raw(self.next + i) for i in range(k)]
        self.next += k
        return out


def _adapter(client: _Client) -> KafkaConsumerAdapter:
    a = KafkaConsumerAdapter({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"})
    a._c.close()
    a._c = client  # type: ignore[assignment]
    return a


def test_records_held_now_come_back_without_a_wait() -> None:
    client = _Client([120])
    got = _adapter(client).poll_batch(500, 0.1)
    assert [m.offset for m in got] == list(range(120))
    assert client.calls == [(500, 0)]


def test_an_idle_client_is_waited_on_for_the_first_record_only() -> None:
    client = _Client([0, 1, 7])
    got = _adapter(client).poll_batch(500, 0.1)
    assert [m.offset for m in got] == list(range(8))
    assert client.calls == [(500, 0), (1, 0.1), (499, 0)]


def test_nothing_within_the_timeout_is_an_empty_batch() -> None:
    client = _Client([0, 0])
    assert _adapter(client).poll_batch(500, 0.1) == []
    assert client.calls == [(500, 0), (1, 0.1)]


def test_no_timeout_never_waits() -> None:
    client = _Client([0])
    assert _adapter(client).poll_batch(500, 0.0) == []
    assert client.calls == [(500, 0)]



def test_client_headers_become_kworkers_pairs_null_values_empty() -> None:
    """``headers_of``: the client's list taken whole when every value is bytes (its fast path);
    a null value (None) becomes b"" and a str value its UTF-8, in order, repeats kept, both
    through the per-header path the fast path must agree with."""
    from kworkers.kafka.consumer import headers_of

    plain = [("kw-attempt", b"2"), ("a", b""), ("kw-attempt", b"3")]
    assert headers_of(plain) == (("kw-attempt", b"2"), ("a", b""), ("kw-attempt", b"3"))
    assert headers_of([("a", None), ("b", b"x")]) == (("a", b""), ("b", b"x"))
    assert headers_of([("b", b"x"), ("a", None)]) == (("b", b"x"), ("a", b""))
    assert headers_of([("a", "é")]) == (("a", "é".encode()),)
    assert headers_of({"a": None}) == (("a", b""),)
    assert headers_of([]) == ()


def test_a_record_as_another_attempt_keeps_every_other_field() -> None:
    """``with_attempt`` (the retry loop's, for every tier record) equals ``_replace``."""
    from kworkers.message import Message, with_attempt

    m = Message("t", 3, 7, b"k", b"v", (("h", b"1"),), 12, 1, b"rk", b"rv", True)
    got = with_attempt(m, 4)
    assert got == m._replace(attempt=4) and type(got) is Message and got.attempt == 4
    assert got.decoded is True and got.raw_value == b"rv" and m.attempt == 1


class _Rebalancing(_Client):
    """A client that hands out records it fetched under an earlier assignment (librdkafka
    2.16's restarted offset lookup on a revoked partition, issue #44) and answers
    ``committed`` with the group's position."""

    def __init__(self, stale: list[int], fresh: list[int], committed: int) -> None:
        super().__init__([])
        self.queue = [_Raw(o) for o in stale + fresh]
        self.committed_at = committed
        self.callbacks: dict[str, Any] = {}

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def incremental_assign(self, parts: list[Any]) -> None:
        pass

    def assign(self, parts: list[Any]) -> None:
        pass

    def committed(self, parts: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(p.topic, p.partition, self.committed_at) for p in parts]

    def consume(self, n: int, timeout: float) -> list[Any]:
        out, self.queue = self.queue[:n], self.queue[n:]
        return out


def _reassigned(client: _Rebalancing) -> KafkaConsumerAdapter:
    from confluent_kafka import TopicPartition

    a = _adapter(client)
    a.subscribe(["t"], lambda tps: None, lambda tps: None, lambda tps: None)
    client.callbacks["on_assign"](client, [TopicPartition("t", 0)])
    return a


def test_records_below_the_committed_position_at_an_assignment_are_dropped() -> None:
    """Offsets 0-43 fetched under an earlier assignment, the group committed 44 meanwhile (by
    another member, which ran them): only 44 on come back, and the floor ends at 44, so a
    later record below it (none should come) would not be filtered forever."""
    client = _Rebalancing(list(range(44)), list(range(44, 50)), committed=44)
    a = _reassigned(client)
    got = a.poll_batch(500, 0.0)
    assert [m.offset for m in got] == list(range(44, 50))
    assert a.dropped_stale == 44 and a._floors == {}


def test_a_partition_with_nothing_committed_has_no_floor() -> None:
    client = _Rebalancing([], list(range(5)), committed=-1001)
    a = _reassigned(client)
    assert [m.offset for m in a.poll_batch(500, 0.0)] == list(range(5))
    assert a._floors == {}


def test_canary_without_the_guard_the_stale_records_run_again(monkeypatch: Any) -> None:
    """The rule before: every record the client hands out is run, 0-43 a second time."""
    import kworkers.kafka.consumer as consumer_module

    monkeypatch.setattr(consumer_module, "STALE_GUARD", False)
    client = _Rebalancing(list(range(44)), list(range(44, 50)), committed=44)
    got = _reassigned(client).poll_batch(500, 0.0)
    assert [m.offset for m in got] == list(range(50))
