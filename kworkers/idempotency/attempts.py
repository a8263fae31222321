"""The keys this process's attempts hold a lease on right now.

Why the invoker keeps them besides the store: a store lets an owner re-claim its own live lease
(the contract, ``IdempotencyStore.claim``), and a process claims with one owner. So two attempts
of one key in one process both got the lease and both applied the effect: a tier record
delivered beside the record it was handed off from, after a broker restart lost the commit
between them (2026-12-02, the Redis kill loop: one process ran a key's source record and its
tier record 1-2 ms apart, each applied), or a retry beside a call stuck past its deadline. Here
the second attempt is refused (``LeaseBusy``: its runner waits, no attempt spent) while the
first's lease is live:
it ends when the first completes or releases, or when its lease would have run out (a complete
that never comes, e.g. outputs refused for good, holds the key no longer than the store does).
"""

from __future__ import annotations

import threading


class LiveAttempts:
    """key -> (lease end, token): ``begin`` before the store's claim, ``hold`` once it was
    acquired (and at each heartbeat), ``end`` after its complete or release."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[float, int | None]] = {}
        self._lock = threading.Lock()

    def begin(self, key: str, now: float, lease_s: float) -> bool:
        """False when another attempt of this process holds ``key``'s lease."""
        with self._lock:
            held = self._live.get(key)
            if held is not None and held[0] > now:
                return False
            self._live[key] = (now + lease_s, None)
            return True

    def until(self, key: str) -> float | None:
        """When the lease of the attempt holding ``key`` in this process ends (None: none)."""
        with self._lock:
            held = self._live.get(key)
            return None if held is None else held[0]

    def hold(self, key: str, token: int, until: float) -> None:
        with self._lock:
            self._live[key] = (until, token)

    def end(self, key: str, token: int | None) -> None:
        """``token``: the attempt's (None for a claim that did not acquire). Another attempt's
        entry, which took over after this one's ran out, stays."""
        with self._lock:
            held = self._live.get(key)
            if held is not None and held[1] == token:
                del self._live[key]

    def __len__(self) -> int:
        return len(self._live)
