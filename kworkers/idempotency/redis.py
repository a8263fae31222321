"""Idempotency keys in Redis: one hash per key, one Lua script per operation.

Why Lua: read-decide-write must be atomic, and a script runs without interleaving on the
server, with no WATCH/retry loop on the client. The scripts mirror the decisions in
``store.py`` (decide_claim & co.); the contract test suite holds both to the same behaviour.

Times travel as the client's ``repr(float)`` strings and are stored verbatim, so a lease end is
never rounded by Lua's number formatting; comparisons convert with ``tonumber``.

Durability is Redis's: without AOF (``appendfsync always``) a server crash can forget a
done-mark, and the next claim would apply the effect again. Use the SQL stores when that
matters; there is no transactional form here because the effect cannot share a Redis
transaction with a database write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import redis as redis_lib

from kworkers.errors import ConfigError, FencedError
from kworkers.idempotency.store import (
    UNTRACKED,
    Claim,
    ClaimState,
    Turn,
    validate_claim_args,
)

if TYPE_CHECKING:
    from kworkers.pace.bucket import BucketStore

__all__ = ["RedisStore"]

# Hash fields: owner, token, status (leased|free|done), lease_until, details, done_at,
# turn_run, turn_attempt (the latest turn that claimed the key: ``store.Turn``).
# Fence failures come back as {"fenced", reason, current_token}.

_FENCE = """
local function fence(h, tok)
  if not h[2] then return {'fenced', 'the key was never claimed', 0} end
  local cur = tonumber(h[2])
  if h[3] == 'done' then return {'fenced', 'the key is already done', cur} end
  if cur ~= tok then return {'fenced', 'the token is stale', cur} end
  if h[3] == 'free' then return {'fenced', 'the token released its lease', cur} end
  return nil
end
"""

_CLAIM = """
local k, owner, until_new, now = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local run, attempt = ARGV[4], tonumber(ARGV[5])
local h = redis.call('HMGET', k, 'owner', 'token', 'status', 'lease_until', 'details',
                     'turn_run', 'turn_attempt')
local function turned()
  if attempt <= 0 then return end
  if (h[6] or '') == run and tonumber(h[7] or '0') >= attempt then return end
  redis.call('HSET', k, 'turn_run', run, 'turn_attempt', attempt)
end
if not h[2] then
  redis.call('HSET', k, 'owner', owner, 'token', 1, 'status', 'leased', 'lease_until', until_new)
  turned()
  return {'acquired', 1, until_new, 0, false}
end
local token = tonumber(h[2])
if h[3] == 'done' then return {'done', token, h[4], 0, h[5]} end
if attempt > 0 and (h[6] or '') == run and attempt < tonumber(h[7] or '0') then
  return {'stale', token, h[4], 0, h[5]}
end
local live = h[3] == 'leased' and tonumber(h[4]) > now
if live and h[1] == owner then
  local u = h[4]
  if tonumber(until_new) > tonumber(u) then u = until_new end
  redis.call('HSET', k, 'lease_until', u)
  turned()
  return {'acquired', token, u, 0, h[5]}
end
if live then return {'busy', token, h[4], 0, h[5]} end
token = token + 1
redis.call('HSET', k, 'owner', owner, 'token', token, 'status', 'leased', 'lease_until', until_new)
turned()
local takeover = 0
local expired = 0
if h[1] and h[1] ~= owner then
  takeover = 1
  if h[3] == 'leased' then expired = 1 end
end
return {'acquired', token, until_new, takeover, h[5], expired}
"""

_HEARTBEAT = (
    _FENCE
    + """
local k, tok, until_new, has_details = KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3]
local h = redis.call('HMGET', k, 'owner', 'token', 'status')
local bad = fence(h, tok)
if bad then return bad end
redis.call('HSET', k, 'lease_until', until_new)
if has_details == '1' then redis.call('HSET', k, 'details', ARGV[4]) end
return {'ok'}
"""
)

_COMPLETE = (
    _FENCE
    + """
local k, tok, now = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local h = redis.call('HMGET', k, 'owner', 'token', 'status')
if h[3] == 'done' and tonumber(h[2]) == tok then return {'ok'} end
local bad = fence(h, tok)
if bad then return bad end
redis.call('HSET', k, 'status', 'done', 'done_at', now)
return {'ok'}
"""
)

_RELEASE = """
local k, tok = KEYS[1], tonumber(ARGV[1])
local h = redis.call('HMGET', k, 'token', 'status')
if h[2] == 'leased' and tonumber(h[1]) == tok then
  redis.call('HSET', k, 'status', 'free', 'lease_until', '0')
end
return {'ok'}
"""


def _num(x: float) -> str:
    return repr(float(x))


def _text(b: Any) -> str:
    return b.decode() if isinstance(b, bytes) else str(b)


class RedisStore:
    """Idempotency keys under ``prefix`` in the Redis at ``url`` (``redis://host:port/db``)."""

    def __init__(self, url: str, *, prefix: str = "kworkers:idem:") -> None:
        if not prefix:
            raise ConfigError("a RedisStore needs a non-empty key prefix")
        self.url = url
        self.prefix = prefix
        self._r = redis_lib.Redis.from_url(url, decode_responses=False)
        self._claim = self._r.register_script(_CLAIM)
        self._heartbeat = self._r.register_script(_HEARTBEAT)
        self._complete = self._r.register_script(_COMPLETE)
        self._release = self._r.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """``redis://...``, ``rediss://...`` or ``unix://...`` (``open_store``)."""
        return cls(url)

    def _k(self, key: str) -> str:
        return self.prefix + key

    @staticmethod
    def _raise_if_fenced(reply: Any, what: str, key: str, token: int) -> None:
        parts = cast(list[Any], reply)
        if _text(parts[0]) == "fenced":
            raise FencedError(
                f"{what} {key!r} with token {token}: {_text(parts[1])} (current {int(parts[2])})"
            )

    def claim(self, key: str, owner: str, lease_s: float, now: float,
              turn: Turn = UNTRACKED) -> Claim:
        validate_claim_args(key, owner, lease_s)
        args = [owner, _num(now + lease_s), _num(now), turn.run, str(turn.attempt)]
        reply = cast(list[Any], self._claim(keys=[self._k(key)], args=args))
        state, token, until, takeover, details, *rest = reply
        return Claim(
            state=ClaimState(_text(state)),
            key=key,
            token=int(token),
            details=None if details is None else bytes(details),
            lease_until=float(_text(until)),
            takeover=bool(int(takeover)),
            expired=bool(int(rest[0])) if rest else False,
        )

    def heartbeat(
        self, key: str, token: int, details: bytes | None, lease_s: float, now: float
    ) -> None:
        if not lease_s > 0:
            raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")
        args: list[str | bytes] = [str(token), _num(now + lease_s)]
        args += ["0"] if details is None else ["1", bytes(details)]
        reply = self._heartbeat(keys=[self._k(key)], args=args)
        self._raise_if_fenced(reply, "heartbeat for", key, token)

    def complete(self, key: str, token: int, now: float) -> None:
        reply = self._complete(keys=[self._k(key)], args=[str(token), _num(now)])
        self._raise_if_fenced(reply, "complete", key, token)

    def release(self, key: str, token: int) -> None:
        self._release(keys=[self._k(key)], args=[str(token)])

    def details(self, key: str) -> bytes | None:
        raw = cast(bytes | None, self._r.hget(self._k(key), "details"))
        return None if raw is None else bytes(raw)

    def is_done(self, key: str) -> bool:
        raw = cast(bytes | None, self._r.hget(self._k(key), "status"))
        return raw == b"done"

    def rate_buckets(self) -> BucketStore:
        """The pool's shared rate buckets, in this Redis (``rate_limit.scope='pool'``)."""
        from kworkers.pace.redis import RedisBuckets

        return RedisBuckets(self.url)

    def close(self) -> None:
        self._r.close()
