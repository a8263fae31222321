"""The idempotent receiver: a lease per effect key, fenced by a token.

Why a lease and not a plain "seen" flag: claim-then-work with SETNX loses the effect for good
when the worker dies between the claim and the effect (the key says "seen", nothing was done).
A lease expires instead, and the next attempt takes the key over. Each (re)acquisition bumps a
*fencing token*; heartbeat, complete and the transactional mark check it, so a worker that was
paused past its lease (GC, a frozen VM) and wakes up cannot complete over its successor.

A key moves through three states::

            claim (new key / lease expired / released)
    ┌──────────────────────────────────────────────┐
    ▼                                              │
  leased ──release──▶ free ──claim──▶ leased       │
    │  ▲                                           │
    │  └── heartbeat (extends, stores details) ────┘
    └──complete──▶ done   (terminal: every later claim answers DONE)

A claim may also say where its delivery stands (a ``Turn``: the run of the work it belongs to and
its attempt in that run). The key keeps the latest turn that claimed it, and a delivery older
than that, in the same run, is ``STALE``: a record redelivered after its work was already handed
on to a later attempt (its source offset's commit lost with a crash between the hand-off and
the commit). Skipping it loses nothing, the later attempt's record carries the work; running it
would count attempts backwards and could run a key after it was dead-lettered (issue #43).

The backends store exactly these fields per key; the decisions live here, as pure functions over
a ``LeaseRow``, so the SQL backends cannot drift apart (their one table code is
``kworkers.idempotency.sql``; Redis repeats the decisions in Lua, and the one contract test
suite holds all three to the same behaviour).

Time is always passed in (``now``, seconds): the store never reads a clock, so tests drive
expiry by hand and every worker's view of "expired" is the one it was given.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeVar

from kworkers.errors import ConfigError, FencedError

# The SQL plumbing every SQL user shares lives below this folder (``kworkers.sqlbase``); these
# names stay importable from here, where the docs and older code take them.
from kworkers.sqlbase import DialectName, PerThread, SqlConnection, check_identifier

__all__ = [
    "UNTRACKED",
    "Claim",
    "ClaimState",
    "IdempotencyStore",
    "LeaseRow",
    "PerThread",
    "SqlConnection",
    "TransactionalStore",
    "Turn",
    "check_fence",
    "check_identifier",
    "decide_claim",
    "decide_complete",
    "decide_heartbeat",
    "decide_release",
]


class ClaimState(enum.Enum):
    """What ``claim`` found: the caller may work (ACQUIRED), skip (DONE: the effect is applied;
    STALE: a later attempt of the same run already claimed the key) or try later (BUSY)."""

    ACQUIRED = "acquired"
    DONE = "done"
    BUSY = "busy"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class Turn:
    """Where a delivery stands in its key's life: ``run`` names the run of the work (every hop
    of one run through the retry tiers gives the same; a redrive starts another) and
    ``attempt`` counts from 1 within it. ``attempt`` 0: not tracked (never stale)."""

    run: str
    attempt: int

    @property
    def tracked(self) -> bool:
        return self.attempt > 0


UNTRACKED = Turn("", 0)


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to ``claim``.

    ``token`` is the fencing token to pass to heartbeat/complete/release (for BUSY and DONE it is
    the current holder's, for information). ``details`` are the last heartbeat details, so a
    takeover resumes from the previous attempt's checkpoint instead of starting over.
    ``takeover`` is True when the key was held by *another* owner that neither completed it nor
    kept its lease alive: that owner may have applied part of the effect. ``expired`` is True
    when that owner's lease ran out unreleased (not given up after a failure): its attempt
    never finished, its worker died or hung holding the key, and it counts as a failed attempt
    (``errors.AttemptCrashed``).
    """

    state: ClaimState
    key: str
    token: int
    details: bytes | None
    lease_until: float
    takeover: bool
    expired: bool = False

    @property
    def acquired(self) -> bool:
        return self.state is ClaimState.ACQUIRED


LeaseStatus = Literal["leased", "free", "done"]


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """One key as every backend stores it."""

    owner: str | None
    token: int
    status: LeaseStatus
    lease_until: float
    details: bytes | None
    done_at: float | None = None
    #: the latest turn that claimed the key (``run`` "" and ``attempt`` 0: none tracked)
    run: str = ""
    attempt: int = 0


class IdempotencyStore(Protocol):
    """The lease protocol every backend implements (see the module docstring)."""

    def claim(self, key: str, owner: str, lease_s: float, now: float,
              turn: Turn = UNTRACKED) -> Claim:
        """New key or expired/released lease -> ACQUIRED (token+1); live lease of another
        owner -> BUSY; done -> DONE. The same owner re-claiming its live lease -> ACQUIRED with
        the same token (and the lease extended to at least ``now + lease_s``). A tracked
        ``turn`` older than the key's latest in the same run -> STALE (checked after DONE);
        an ACQUIRED claim records its turn."""
        ...

    def heartbeat(
        self, key: str, token: int, details: bytes | None, lease_s: float, now: float
    ) -> None:
        """Move the lease to ``now + lease_s`` and store ``details`` (``None`` keeps the last
        ones). FencedError when ``token`` is not current, the key was released or is done."""
        ...

    def complete(self, key: str, token: int, now: float) -> None:
        """Mark the key done. FencedError on a stale token; repeating it with the token that
        completed is a no-op (a retried call after a lost reply)."""
        ...

    def release(self, key: str, token: int) -> None:
        """Give the lease up without completing (the attempt failed), so the next attempt takes
        over at once instead of waiting out the lease. Keeps details. Stale token: no-op."""
        ...

    def details(self, key: str) -> bytes | None: ...

    def is_done(self, key: str) -> bool: ...

    def close(self) -> None: ...


ConnT_co = TypeVar("ConnT_co", covariant=True)


class TransactionalStore(IdempotencyStore, Protocol[ConnT_co]):
    """A store in a SQL database: the effect and the done-mark can share one transaction, which
    makes the effect exactly-once without relying on a lease (the outbox pattern)."""

    @property
    def dialect(self) -> DialectName:
        """Which SQL the outbox speaks to this store's database."""
        ...

    def transaction(
        self, key: str, token: int, now: float | None = None
    ) -> AbstractContextManager[ConnT_co]:
        """Run the caller's effect SQL on the yielded connection; on a clean exit the key is
        marked done in the same transaction. The lease row stays locked throughout, so nobody
        can take over mid-effect. FencedError (before the body runs) when ``token`` is stale or
        the key is already done; an exception in the body rolls everything back."""
        ...

    def apply_once(
        self, key: str, fn: Callable[[ConnT_co], object], now: float | None = None
    ) -> bool:
        """Run ``fn(conn)`` and mark the key done atomically, unless it is done already.
        Returns True when ``fn`` ran and committed. Needs no claim: the transaction is the
        lock. Do not mix it with the lease form on one key."""
        ...

    def atomic(self) -> AbstractContextManager[ConnT_co]:
        """A plain transaction on this thread's connection (commit on success, rollback on
        error); the outbox relay uses it."""
        ...


# ---------------------------------------------------------------------------------------------
# The decisions, shared by the SQL backends (and mirrored by the Redis Lua scripts).


def validate_claim_args(key: str, owner: str, lease_s: float) -> None:
    if not key:
        raise ConfigError("an idempotency key must not be empty")
    if not owner:
        raise ConfigError("a claim needs a non-empty owner (the worker's id)")
    if not lease_s > 0:
        raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")


def is_stale(row: LeaseRow, turn: Turn) -> bool:
    """True when ``turn`` is older than the key's latest, in the same run."""
    return turn.tracked and row.run == turn.run and turn.attempt < row.attempt


def _turned(row: LeaseRow, turn: Turn) -> LeaseRow:
    """``row`` recording ``turn`` as the latest (a later attempt, or another run's)."""
    if not turn.tracked or (row.run == turn.run and row.attempt >= turn.attempt):
        return row
    return replace(row, run=turn.run, attempt=turn.attempt)


def decide_claim(
    row: LeaseRow | None, key: str, owner: str, lease_s: float, now: float,
    turn: Turn = UNTRACKED,
) -> tuple[Claim, LeaseRow | None]:
    """The claim's answer and the row to write (``None``: leave the row as it is)."""
    if row is None:
        new = _turned(LeaseRow(owner, 1, "leased", now + lease_s, None), turn)
        return Claim(ClaimState.ACQUIRED, key, 1, None, new.lease_until, False), new
    if row.status == "done":
        return Claim(ClaimState.DONE, key, row.token, row.details, row.lease_until, False), None
    if is_stale(row, turn):
        return Claim(ClaimState.STALE, key, row.token, row.details, row.lease_until, False), None
    live = row.status == "leased" and row.lease_until > now
    if live and row.owner == owner:
        until = max(row.lease_until, now + lease_s)
        new = _turned(replace(row, lease_until=until), turn)
        return Claim(ClaimState.ACQUIRED, key, row.token, row.details, until, False), new
    if live:
        return Claim(ClaimState.BUSY, key, row.token, row.details, row.lease_until, False), None
    # Expired or released: take it over under a new token; the details are the checkpoint.
    token = row.token + 1
    new = _turned(LeaseRow(owner, token, "leased", now + lease_s, row.details,
                           run=row.run, attempt=row.attempt), turn)
    takeover = row.owner is not None and row.owner != owner
    return Claim(ClaimState.ACQUIRED, key, token, row.details, new.lease_until, takeover,
                 takeover and row.status == "leased"), new


def check_fence(row: LeaseRow | None, key: str, token: int, what: str) -> LeaseRow:
    """The row, when ``token`` still holds the lease on ``key``; FencedError otherwise."""
    if row is None:
        raise FencedError(f"{what} {key!r}: the key was never claimed")
    if row.status == "done":
        raise FencedError(f"{what} {key!r}: the key is already done (token {row.token})")
    if row.token != token:
        raise FencedError(f"{what} {key!r}: token {token} is stale, the lease is at {row.token}")
    if row.status == "free":
        raise FencedError(f"{what} {key!r}: token {token} released its lease")
    return row


def decide_heartbeat(
    row: LeaseRow | None, key: str, token: int, details: bytes | None, lease_s: float, now: float
) -> LeaseRow:
    if not lease_s > 0:
        raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")
    cur = check_fence(row, key, token, "heartbeat for")
    return replace(
        cur,
        lease_until=now + lease_s,
        details=cur.details if details is None else bytes(details),
    )


def decide_complete(row: LeaseRow | None, key: str, token: int, now: float) -> LeaseRow | None:
    """The done row to write, or ``None`` when this token already completed the key."""
    if row is not None and row.status == "done" and row.token == token:
        return None
    cur = check_fence(row, key, token, "complete")
    return replace(cur, status="done", done_at=now)


def decide_release(row: LeaseRow | None, token: int) -> LeaseRow | None:
    """The released row, or ``None`` (no-op) when ``token`` does not hold a lease."""
    if row is None or row.status != "leased" or row.token != token:
        return None
    return replace(row, status="free", lease_until=0.0)
