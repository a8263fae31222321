"""Two attempts of one key in one process never both apply (``kworkers.idempotency.attempts``).

A store's lease is re-entrant for its owner and a process claims with one owner, so before the
guard two attempts of a key running at once in one process (a tier record beside the record it
came from, after a lost commit) both acquired and both applied: found by the Redis kill loop.
Effects are counted from an append-only list the handler writes, not from the invoker."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kworkers import activity
from kworkers.activity import ActivityInvoker
from kworkers.clock import FakeClock
from kworkers.errors import RetryableError
from kworkers.idempotency.attempts import LiveAttempts
from kworkers.idempotency.sqlite import SqliteStore
from kworkers.message import Message


def _record(offset: int) -> Message:
    return Message("t", 0, offset, None, b"v", activity.id_headers("order-1", "charge"))


def _two_at_once(invoker: ActivityInvoker) -> tuple[list[int], BaseException | None]:
    """Attempt 1 runs and waits; attempt 2 of the same key starts meanwhile, on another
    thread of the same process. The effects applied, and what attempt 2 raised."""
    effects: list[int] = []
    inside, go_on = threading.Event(), threading.Event()

    def handler(msg: Message) -> None:
        effects.append(msg.offset)  # the effect
        if msg.offset == 0:
            inside.set()
            go_on.wait(10)

    first = threading.Thread(target=invoker, args=(handler, _record(0)))
    first.start()
    assert inside.wait(10)
    raised: BaseException | None = None
    try:
        invoker(handler, _record(1))
    except RetryableError as exc:
        raised = exc
    go_on.set()
    first.join(10)
    invoker(handler, _record(2))  # after attempt 1 completed: absorbed (DONE)
    return effects, raised


def test_a_second_attempt_of_a_key_in_the_same_process_is_busy(tmp_path: Path) -> None:
    invoker = ActivityInvoker(SqliteStore(tmp_path / "s.db"), lease_s=30)
    effects, raised = _two_at_once(invoker)
    assert effects == [0]
    assert isinstance(raised, RetryableError) and "LeaseBusy" in repr(raised)
    assert len(invoker.live) == 0  # every attempt's entry ended


def test_canary_without_the_guard_both_attempts_apply(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The store alone lets its owner in twice: the check above has teeth."""
    monkeypatch.setattr(LiveAttempts, "begin", lambda self, key, now, lease_s: True)
    effects, raised = _two_at_once(ActivityInvoker(SqliteStore(tmp_path / "s.db"), lease_s=30))
    assert effects == [0, 1] and raised is None


def test_a_failed_attempt_lets_the_next_one_in_at_once(tmp_path: Path) -> None:
    invoker = ActivityInvoker(SqliteStore(tmp_path / "s.db"), lease_s=30)
    effects: list[int] = []

    def handler(msg: Message) -> None:
        effects.append(msg.offset)
        if msg.offset == 0:
            raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        invoker(handler, _record(0))
    invoker(handler, _record(1))
    assert effects == [0, 1] and len(invoker.live) == 0


def test_an_attempt_holds_its_key_no_longer_than_its_lease() -> None:
    """A complete that never comes (outputs refused for good) holds the key only as long as
    the store's lease would; and a late end of the attempt that ran out leaves its
    successor's entry."""
    clock = FakeClock(100.0)
    live = LiveAttempts()
    assert live.begin("k", clock.now(), 30)
    live.hold("k", 1, clock.now() + 30)
    assert not live.begin("k", clock.now() + 29, 30)
    assert live.begin("k", clock.now() + 31, 30)  # ran out: the next attempt may claim
    live.hold("k", 2, clock.now() + 61)
    live.end("k", 1)  # the first attempt ends late
    assert not live.begin("k", clock.now() + 40, 30)  # the second still holds it
    live.end("k", 2)
    assert len(live) == 0
