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
