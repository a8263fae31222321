"""``RateLimit``: how fast a worker (or its whole pool) may start records, as one value.

Why a bound of the form ``burst + per_second * T``: a provider's quota ("100 calls/s") is a
token bucket on their side, so the promise kworkers makes is the same shape: in every window of
``T`` seconds at most ``burst + per_second * T`` handler calls start, however many replicas run
and however their blocks of tokens fall. It is an upper bound only: a record never starts early
because others were slow, and nothing is dropped to keep it (records wait in their lanes).

Where the bound comes from (``kworkers.pace.pacer`` for the mechanics): tokens are granted by
one bucket (the pool's store, or the process itself for ``scope="replica"``) that holds at most
``capacity`` tokens and refills at ``per_second``, so any window of ``T`` seconds grants at most
``capacity + per_second * T``; a replica takes them in blocks and spends a token no later than
``lifetime`` seconds after the bucket granted it (an unspent token expires). A start in a window
``[a, a + T]`` therefore spends a token granted in ``[a - lifetime, a + T]``: at most
``capacity + per_second * (T + lifetime)``, which is ``burst + per_second * T`` because the
bucket keeps ``per_second * lifetime`` of the burst back (``capacity = burst - reserve``). The
last ``START_MARGIN_S`` of the lifetime is left for the time from the token to the handler's
first line (the idempotency claim, the thread switch): a start observed up to that much after
its token still keeps the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kworkers.errors import ConfigError

#: "all": one bucket for every record; "key": a bucket per record key
Per = Literal["all", "key"]
#: "pool": one bucket every replica shares through the pool's store (PostgreSQL or Redis);
#: "replica": each process its own bucket (a pool of N runs at N times the rate)
Scope = Literal["pool", "replica"]

#: the longest a granted token may wait for its record (longer: it expires unspent)
MAX_LIFETIME_S = 0.25
#: kept from the lifetime for the way from the token to the handler's first line
START_MARGIN_S = 0.05


@dataclass(frozen=True)
class RateLimit:
    """At most ``burst + per_second * T`` handler starts in any ``T`` seconds (see the module
    doc): for the whole pool (``scope="pool"``, the default) or per process."""

    #: the steady rate, handler starts per second
    per_second: float
    #: starts allowed at once after a quiet spell (None: one second's worth, at least 2)
    burst: int | None = None
    per: Per = "all"
    scope: Scope = "pool"
    #: the bucket's name in the store ("": the worker's group id); pools that call the same
    #: provider share a limit by giving the same name
    name: str = ""

    def __post_init__(self) -> None:
        r = self.per_second
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r) \
                or r <= 0:
            raise ConfigError(f"rate_limit.per_second: a positive number, got {r!r}")
        b = self.burst
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 2):
            raise ConfigError(
                f"rate_limit.burst: a whole number >= 2, got {b!r} (one token of the burst at "
                "least is kept back for the time between a token and its record's start)")
        if self.per not in ("all", "key"):
            raise ConfigError(f"rate_limit.per: 'all' or 'key', got {self.per!r}")
        if self.scope not in ("pool", "replica"):
            raise ConfigError(f"rate_limit.scope: 'pool' or 'replica', got {self.scope!r}")
        if not isinstance(self.name, str) or self.name != self.name.strip() \
                or any(c in self.name for c in "\n\r\x00"):
            raise ConfigError(f"rate_limit.name: plain text, got {self.name!r}")

    @property
    def allowed_burst(self) -> int:
        """The ``burst`` of the bound: as given, or one second's worth (at least 2)."""
        if self.burst is not None:
            return self.burst
        return max(2, math.ceil(self.per_second))

    @property
    def lifetime(self) -> float:
        """How long after its grant a token is good for (``spend_within`` of it to start a
        record, the rest the start margin): at most ``MAX_LIFETIME_S``, and at most what
        half the burst lasts at the rate."""
        return min(MAX_LIFETIME_S, (self.allowed_burst - 1) / (2 * self.per_second))

    @property
    def spend_within(self) -> float:
        """How long a replica may keep a granted token before starting a record with it."""
        life = self.lifetime
        return life - min(START_MARGIN_S, life / 2)

    @property
    def capacity(self) -> float:
        """What the bucket holds when full: the burst less the tokens granted but unspent a
        lifetime may hold (the module doc's proof). At least 1."""
        return self.allowed_burst - self.per_second * self.lifetime

    @property
    def max_block(self) -> int:
        """The most tokens a replica takes from the bucket at once: half the bucket, so one
        replica's block never empties it for the others."""
        return max(1, math.floor(self.capacity / 2))

    def bound(self, seconds: float) -> float:
        """The most starts any window of ``seconds`` may hold (the promise, for checks)."""
        return self.allowed_burst + self.per_second * seconds

    def bucket_name(self, group_id: str) -> str:
        return self.name or group_id
