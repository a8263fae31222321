"""The pool's buckets in Redis: one key per bucket, one Lua script per take.

Why Lua: read, decide and write must be one step on the server, and ``TIME`` inside the script
puts every replica's grants on the server's one clock. The script repeats
``kworkers.pace.bucket.decide`` in integer microseconds (rounded so a grant is never larger than
the arithmetic means); the contract suite holds it to the same answers. A bucket's key expires
once it is full again, so buckets per key cost nothing after their keys go quiet.

Redis's durability is enough here: a bucket forgotten in a server crash starts full, which is
one burst, the same as a pool that was idle.
"""

from __future__ import annotations

from typing import Any, cast

import redis as redis_lib

from kworkers.errors import ConfigError
from kworkers.pace.bucket import Grant

__all__ = ["RedisBuckets"]

_TAKE = """
local k, want, rate, cap = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', k) or now)
local base = math.max(tat, now)
local avail = math.floor((now - base) / 1000000 * rate + cap + 1e-9)
local g = math.max(0, math.min(want, avail))
if g == 0 then
  return {0, string.format('%.6f', (base - now) / 1000000 + (1 - cap) / rate)}
end
local new = math.ceil(base + g * 1000000 / rate)
redis.call('SET', k, string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1)
return {g, '0'}
"""


class RedisBuckets:
    """Buckets under ``prefix`` in the Redis at ``url``."""

    remote = True

    def __init__(self, url: str, *, prefix: str = "kworkers:rate:") -> None:
        if not prefix:
            raise ConfigError("RedisBuckets needs a non-empty key prefix")
        self.url = url
        self.prefix = prefix
        self._r = redis_lib.Redis.from_url(url, decode_responses=False, socket_timeout=5,
                                           socket_connect_timeout=5)
        self._take = self._r.register_script(_TAKE)

    def take(self, name: str, want: int, rate: float, capacity: float) -> Grant:
        reply = cast(list[Any], self._take(keys=[self.prefix + name],
                                           args=[int(want), repr(float(rate)),
                                                 repr(float(capacity))]))
        granted, after = int(reply[0]), float(reply[1])
        return Grant(granted, 0.0 if granted else max(0.0, after))

    def close(self) -> None:
        self._r.close()
