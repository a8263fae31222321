"""``Pacer``: a worker's runners take tokens before each record starts, in blocks per replica.

Why blocks: a store round trip per record would cost more than the records themselves far from
the limit. A replica takes a block of tokens from the bucket (``kworkers.pace.bucket``) and its
runners spend it locally; a runner asks for as many as the records it is about to run, and
spends them one by one as each starts (``Runner.steps``), so the local path costs a comparison
per record. A block's tokens are good for ``RateLimit.spend_within`` seconds from the moment
the request left (never later than the bucket granted them); the rest expires unspent, which is
what the bound needs (``kworkers.pace.limit``). The block's size adapts: doubled when a block
was spent in time, halved when tokens expired unspent, at most ``RateLimit.max_block``. Once
half a block is spent, the runner that would take the next token asks for the next block
first (a spare, with its own deadline: also once half its lifetime is gone, so a block that
expires unspent is followed by one already there) while the others keep spending, and no
runner takes
more than a quarter of a block of ``SHARED_BLOCK`` or more at once: far from the limit no
runner waits for the store's round trip.

Waiting: a record with no token waits where it is, in its lane: its runner sleeps (a thread) or
awaits (the event loop) until the bucket has one, never the poll thread; its lane does not
move, so the partition fills its share of ``max_in_flight`` and backpressure pauses it. A
revoke, a stop or a fenced member ends the wait (the record was not started: nothing to undo).
``waiting()`` names the partitions held this way (the stall detector's ``Hold.RATE_LIMIT``),
``asked()`` when each last asked for a token: a waiting record looks at its block at least
every ``CHECK_S`` and takes a token as soon as there is one, so a wait with tokens to take is a
waiter that stopped asking, and once that lasts the stall bound it is a stall, not a hold.

The store unreachable: nothing starts (the limit fails closed: a replica cannot know how many
others run, so any local guess could break the pool's quota); the records wait, uncommitted,
the store is asked again with a doubling backoff (0.1 s to 2 s), each failure counted and
logged at most every 10 s; work resumes when it answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

from kworkers.clock import Clock
from kworkers.consumer.ports import TP
from kworkers.message import Message
from kworkers.pace.bucket import BucketStore
from kworkers.pace.limit import RateLimit

log = logging.getLogger("kworkers.pace")

#: a runner whose bucket is being asked by another runner looks again this soon
PEEK_S = 0.002
#: a waiting runner checks for a revoke or a stop at least this often
CHECK_S = 0.05
#: the store unreachable: ask again after this, doubled per failure up to ``MAX_BACKOFF_S``
BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
#: bucket names longer than this are hashed (a record key may be long)
MAX_NAME = 96
#: blocks this large are taken a quarter at a time (smaller ones, near the limit, at once)
SHARED_BLOCK = 256
#: local blocks kept before the idle ones are forgotten
MAX_BLOCKS = 10_000


@dataclass(frozen=True, slots=True)
class Allotment:
    """Tokens a runner got: start at most ``count`` records with them before ``until``
    (monotonic)."""

    count: int
    until: float


class _Block:
    """A replica's tokens of one bucket (under the pacer's lock)."""

    __slots__ = ("emptied", "fails", "fetching", "left", "retry_at", "size", "spare",
                 "spare_until", "until")

    def __init__(self, size: int) -> None:
        self.left = 0
        self.until = 0.0
        #: the next block, asked for before this one ran out (spent once this one is)
        self.spare = 0
        self.spare_until = 0.0
        self.size = size
        #: the last block was spent before it expired: the next may be larger
        self.emptied = False
        #: a runner is asking the bucket for this block now
        self.fetching = False
        self.retry_at = float("-inf")
        self.fails = 0


#: what one look at a block says: tokens, ask the bucket (now, or ahead of need), or wait
#: this many seconds
_FETCH = "fetch"
_Step = Allotment | str | float


class Pacer:
    """The rate limit of one worker: its runners (both loops) share it."""

    def __init__(self, limit: RateLimit, store: BucketStore, group: str, clock: Clock, *,
                 name_of: Callable[[Message], str | None] | None = None,
                 on_wait: Callable[[float], None] | None = None,
                 on_waiting: Callable[[int], None] | None = None,
                 on_tokens: Callable[[int], None] | None = None,
                 on_store_error: Callable[[], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.limit = limit
        self.store = store
        self.clock = clock
        self.base = limit.bucket_name(group)
        self._name_of = name_of
        #: the one bucket every record takes from (None: a bucket per key or per name)
        self.fixed: str | None = (self.base if name_of is None and limit.per == "all"
                                  else None)
        self._rate = float(limit.per_second)
        self._capacity = limit.capacity
        self._spend = limit.spend_within
        self._max_block = limit.max_block
        #: a bucket's first block: an eighth of what a lifetime may spend (1 near small
        #: rates), so a fast worker does not start with twenty round trips of doubling
        self._first_block = max(1, min(self._max_block,
                                       int(limit.per_second * self._spend / 8)))
        self._on_wait = on_wait or (lambda _s: None)
        self._on_waiting = on_waiting or (lambda _n: None)
        self._on_tokens = on_tokens or (lambda _n: None)
        self._on_store_error = on_store_error or (lambda: None)
        self._sleep = sleep
        self._lock = threading.Lock()
        self._blocks: dict[str, _Block] = {}
        self._waiting: dict[TP, int] = {}
        #: when a record of each waiting partition last asked for a token (monotonic)
        self._asked: dict[TP, float] = {}
        self._logged_at = float("-inf")

    # ------------------------------------------------------------------ names

    def bucket_of(self, msg: Message) -> str | None:
        """The bucket ``msg`` takes its token from; None: it is not limited (a name function
        that answered None)."""
        if self.fixed is not None:
            return self.fixed
        if self._name_of is not None:
            name = self._name_of(msg)
            if name is None:
                return None
            return self._bounded(f"{self.base}/n:{name}")
        key = msg.key_bytes
        return self._bounded(f"{self.base}/k:" + ("-" if key is None else key.hex()))

    @staticmethod
    def _bounded(name: str) -> str:
        if len(name) <= MAX_NAME:
            return name
        return name[:40] + "#" + hashlib.sha256(name.encode()).hexdigest()

    # ------------------------------------------------------------------ taking

    @property
    def pool_wide(self) -> bool:
        """One bucket for every replica (``scope="pool"``): what it holds no replica more
        would drain (``consumer.drainable``)."""
        return self.limit.scope == "pool"

    def waiting(self) -> set[TP]:
        """The partitions whose next record waits for a token now."""
        with self._lock:
            return set(self._waiting)

    def asked(self) -> dict[TP, float]:
        """When a waiting record of each partition last asked for a token (monotonic): the
        end of the hold its wait claims (``stall.overdue``)."""
        with self._lock:
            return dict(self._asked)

    def acquire(self, tp: TP, name: str, want: int,
                halted: Callable[[], bool]) -> Allotment | None:
        """Tokens for up to ``want`` records of bucket ``name`` (at least one), waiting as long
        as the bucket has none; None when ``halted`` turned true meanwhile."""
        steps = self._steps(tp, name, want, halted)
        try:
            while True:
                pause = next(steps)
                if pause is None:
                    self._fetch(name)
                else:
                    self._sleep(pause)
        except StopIteration as done:
            result: Allotment | None = done.value
            return result

    async def aacquire(self, tp: TP, name: str, want: int,
                       halted: Callable[[], bool]) -> Allotment | None:
        """``acquire`` for the event loop: awaits, and asks a remote store off the loop."""
        steps = self._steps(tp, name, want, halted)
        try:
            while True:
                pause = next(steps)
                if pause is None and self.store.remote:
                    await asyncio.to_thread(self._fetch, name)
                elif pause is None:
                    self._fetch(name)
                else:
                    await asyncio.sleep(pause)
        except StopIteration as done:
            result: Allotment | None = done.value
            return result

    def _steps(self, tp: TP, name: str, want: int, halted: Callable[[], bool]
               ) -> Generator[float | None, None, Allotment | None]:
        """One wait for tokens, both ways: yields None to have the bucket asked, or seconds to
        pause; returns the tokens, or None once ``halted``."""
        since: float | None = None
        try:
            while True:
                step = self._look(name, want)
                if isinstance(step, Allotment):
                    return step
                if step == _FETCH:
                    yield None
                    continue
                if since is None:
                    since = self._begin_wait(tp)
                self._asked[tp] = self.clock.monotonic()  # one store, under the GIL
                if halted():
                    return None
                assert isinstance(step, float)
                yield min(step, CHECK_S)
        finally:
            if since is not None:
                self._end_wait(tp, since)

    def _look(self, name: str, want: int) -> _Step:
        with self._lock:
            b = self._blocks.get(name)
            if b is None:
                if len(self._blocks) >= MAX_BLOCKS:
                    self._forget_idle()
                b = self._blocks[name] = _Block(self._first_block)
            now = self.clock.monotonic()
            if b.left > 0 and now >= b.until:
                b.left = 0  # expired unspent: the next block is smaller
                b.emptied = False
                b.size = max(1, b.size // 2)
            if b.left == 0 and b.spare > 0:
                if now < b.spare_until:
                    b.left, b.until = b.spare, b.spare_until
                b.spare = 0
            if b.left > 0:
                if (not b.fetching and not b.spare and now >= b.retry_at
                        and (b.left * 2 <= b.size or b.until - now <= self._spend / 2)):
                    b.fetching = True
                    # half spent in less than half its time: the next block may be larger
                    b.emptied = b.until - now > self._spend / 2
                    return _FETCH  # the next block, asked for while others spend this one
                # a large block is taken a quarter at a time: one runner never empties it
                got = min(want, b.left, b.size // 4 if b.size >= SHARED_BLOCK else b.left)
                b.left -= got
                if not b.left:
                    b.emptied = True
                return Allotment(got, b.until)
            if b.fetching:
                return PEEK_S
            if now < b.retry_at:
                return b.retry_at - now
            b.fetching = True
            return _FETCH

    def _fetch(self, name: str) -> None:
        """Asks the bucket for the next block (one caller per bucket at a time: ``_look``
        marks it ``fetching``)."""
        with self._lock:
            b = self._blocks[name]
            if b.emptied:
                b.size = min(self._max_block, b.size * 2)
                b.emptied = False
            size = b.size
        sent = self.clock.monotonic()
        try:
            grant = self.store.take(name, size, self._rate, self._capacity)
        except Exception as exc:
            with self._lock:
                b.fetching = False
                b.fails += 1
                wait = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (b.fails - 1))
                b.retry_at = self.clock.monotonic() + wait
            self._on_store_error()
            now = self.clock.monotonic()
            if now - self._logged_at >= 10.0:
                self._logged_at = now
                log.warning("rate limit %s: the store did not answer (%s: %s); no record "
                            "starts until it does (asking again in %.1fs)", name,
                            type(exc).__name__, exc, wait)
            return
        with self._lock:
            b.fetching = False
            b.fails = 0
            if grant.granted:
                if b.left > 0 and self.clock.monotonic() < b.until:
                    b.spare, b.spare_until = grant.granted, sent + self._spend
                else:
                    b.left, b.until = grant.granted, sent + self._spend
            else:
                b.retry_at = self.clock.monotonic() + max(grant.retry_after, 0.0005)
        if grant.granted:
            self._on_tokens(grant.granted)

    def _forget_idle(self) -> None:
        now = self.clock.monotonic()
        for k in [k for k, b in self._blocks.items()
                  if not b.fetching and (b.left == 0 or now >= b.until)
                  and (b.spare == 0 or now >= b.spare_until) and now >= b.retry_at]:
            del self._blocks[k]

    def _begin_wait(self, tp: TP) -> float:
        with self._lock:
            self._waiting[tp] = self._waiting.get(tp, 0) + 1
            n = sum(self._waiting.values())
        self._on_waiting(n)
        return self.clock.monotonic()

    def _end_wait(self, tp: TP, since: float) -> None:
        with self._lock:
            left = self._waiting.get(tp, 1) - 1
            if left > 0:
                self._waiting[tp] = left
            else:
                self._waiting.pop(tp, None)
                self._asked.pop(tp, None)
            n = sum(self._waiting.values())
        self._on_waiting(n)
        self._on_wait(self.clock.monotonic() - since)

    def close(self) -> None:
        self.store.close()
