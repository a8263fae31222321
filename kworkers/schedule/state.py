"""A scheduled id's state: who may deliver it, and whether it was cancelled.

Kept in an idempotency store (SQLite, PostgreSQL or Redis: ``kworkers.idempotency``), one key
``schedule:<id>`` per id, with the store's one atomic step, ``claim`` (insert if absent):

- the delivery claims the key as the *place* of the last-rung record it delivers from
  (``topic/partition@offset``, the first read's place for a record that was retried), with a
  lease that never runs out. The first place wins: every other copy of the same id (scheduled
  twice, or again after delivery) finds the key BUSY and is dropped. The winner's own retry
  after a crash finds its own claim (same owner: ACQUIRED again) and delivers: its earlier
  attempt's output was aborted with its transaction, since the offset was not committed.
- a cancel claims the key as ``cancel`` and completes it (DONE): a later delivery finds it
  DONE and drops the record; a cancel that finds a delivery's claim is too late.

Ids are single-use: once delivered or cancelled, scheduling the same id again delivers nothing.
The rows stay (no expiry yet): one small row per id ever scheduled.
"""

from __future__ import annotations

import enum

from kworkers.idempotency.store import Claim, ClaimState, IdempotencyStore

#: a lease that outlives any schedule (100 years): a delivery claim is never taken over
FOREVER_S = 100 * 365 * 86_400.0
CANCEL_OWNER = "cancel"


class Verdict(enum.Enum):
    DELIVER = "deliver"
    DUPLICATE = "duplicate"
    CANCELLED = "cancelled"


def state_key(sid: str) -> str:
    return f"schedule:{sid}"


def delivery_verdict(claim: Claim) -> Verdict:
    """What the delivery of a record does given its claim on the id (pure)."""
    if claim.state is ClaimState.ACQUIRED:
        return Verdict.DELIVER
    if claim.state is ClaimState.DONE:
        return Verdict.CANCELLED
    return Verdict.DUPLICATE  # BUSY: another copy delivers it, or a cancel is under way


def cancel_verdict(claim: Claim) -> bool:
    """Whether a cancel holds, given its claim (pure): True when this cancel took the key or
    an earlier cancel did; False when a delivery had claimed it first."""
    return claim.state is not ClaimState.BUSY


class ScheduleState:
    """The store's answers, as the scheduler asks them."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store

    def claim_delivery(self, sid: str, place: str, now: float) -> Verdict:
        return delivery_verdict(self.store.claim(state_key(sid), place, FOREVER_S, now))

    def cancel(self, sid: str, now: float) -> bool:
        key = state_key(sid)
        claim = self.store.claim(key, CANCEL_OWNER, FOREVER_S, now)
        if claim.state is ClaimState.ACQUIRED:
            self.store.complete(key, claim.token, now)
        return cancel_verdict(claim)
