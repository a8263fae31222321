"""Well-formed retry-tier records for tests: the headers a worker of ``group`` would write.

Tier records are checked before they run (``kworkers.retry_tiers.tier_record``), so a test that
feeds a tier topic by hand builds its records here rather than from a loose pair of headers.
"""

from __future__ import annotations

import time

from kworkers.message import Headers, Message
from kworkers.retry_tiers.headers import retry_headers
from kworkers.retry_tiers.routing import RetryDecision
from kworkers.retry_tiers.tiers import Tier
from kworkers.topic_names import source_topic_of


def retry_record_headers(tier_topic: str, group: str, due_at: float, *, attempt: int = 2,
                         now: float | None = None, user: Headers = ()) -> Headers:
    """What a worker of ``group`` writes when it hands a record of ``tier_topic``'s source to
    that tier, to run as ``attempt`` at ``due_at``."""
    now = time.time() if now is None else now
    source = source_topic_of(tier_topic)
    first = Message(source, 0, 0, None, None, user, int(now * 1000), attempt - 1)
    decision = RetryDecision(attempt, max(0.0, due_at - now), due_at,
                             Tier("t", 1.0, tier_topic), "RuntimeError", "failed")
    return retry_headers(first, group, decision, now)


def retry_record(tier_topic: str, partition: int, offset: int, group: str, due_at: float, *,
                 attempt: int = 2, now: float | None = None, key: bytes | None = b"k",
                 value: bytes | None = b"v") -> Message:
    headers = retry_record_headers(tier_topic, group, due_at, attempt=attempt, now=now)
    return Message(tier_topic, partition, offset, key, value, headers)
