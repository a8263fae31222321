"""A handler under ``Worker(idempotency=store)`` that applies its effect with the store's
``apply_once`` (the transactional form) succeeds on the first attempt.

``apply_once`` marks the key done under a new fencing token, so the invoker's ``complete`` with
the lease's older token is refused; that refusal must not fail the record (it used to, sending
every record through a retry tier), while a genuinely stale lease still fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kworkers import activity
from kworkers.activity import ActivityInvoker
from kworkers.errors import FencedError
from kworkers.idempotency import SqliteStore
from kworkers.message import Message

MSG = Message("t", 0, 0, None, b"v", (("kw-workflow-id", b"wf"), ("kw-activity-id", b"a")))


def test_apply_once_inside_a_leased_attempt_succeeds(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    runs: list[bool] = []

    def handler(msg: Message) -> None:
        runs.append(store.apply_once(activity.idempotency_key(), lambda conn: None))

    invoker = ActivityInvoker(store)
    invoker(handler, MSG)  # no FencedError
    invoker(handler, MSG)  # a redelivery: the claim says DONE, the handler is not called
    assert runs == [True]
    assert store.is_done("wf/a")
    assert invoker.skipped == 1


def test_a_lease_lost_to_another_attempt_still_fails(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    invoker = ActivityInvoker(store, lease_s=30)

    def handler(msg: Message) -> None:
        # another owner takes the key over (our lease "expired") and holds it, not done
        store.claim("wf/a", "someone-else", 30, invoker.clock.now() + 3600)

    with pytest.raises(FencedError):
        invoker(handler, MSG)
