"""The ``kw-scheduled-*`` headers: what a scheduled record carries on its way and on arrival.

On the rungs: ``kw-scheduled-id`` (the stable id), ``kw-scheduled-due-at`` (the due time,
epoch ms, rounded up), ``kw-scheduled-at`` (when it was scheduled) and ``kw-due-at`` (when the
rung's timer heap releases it: the retry tiers' header, read by the same gate). On arrival at
the destination: the id, the due time and ``kw-scheduled-delivered-at`` (when the scheduler's
handler released it, which is before its transaction wrote it: a reader sees the record when
that transaction commits, later by at least the commit interval and by much more after a fault;
the record's own timestamp, set when the transaction produced it, is the later of the two), with
the record's own key and headers. Values are UTF-8 text, as every kw-* header.
"""

from __future__ import annotations

from dataclasses import dataclass

from kworkers.message import Headers
from kworkers.retry_tiers.headers import (
    DUE_AT,
    MAX_TIME_MS,
    HeaderError,
    ms_up,
    text_of,
    time_of,
    user_headers,
)

SCHEDULED_PREFIX = "kw-scheduled-"
SCHEDULED_ID = "kw-scheduled-id"
SCHEDULED_DUE_AT = "kw-scheduled-due-at"
SCHEDULED_AT = "kw-scheduled-at"
DELIVERED_AT = "kw-scheduled-delivered-at"
#: an id is a store key and a header value: short printable text
MAX_ID = 200


@dataclass(frozen=True)
class ScheduledInfo:
    """What a rung record's ``kw-scheduled-*`` headers say, parsed and bounded."""

    id: str
    due_at: float
    scheduled_at: float
    #: the release time of the rung it was read from (``kw-due-at``)
    release_at: float


def check_id(sid: str) -> str:
    """``sid`` if it can be a scheduled id (1..200 printable characters), else ValueError."""
    if not isinstance(sid, str) or not 0 < len(sid) <= MAX_ID or not sid.isprintable():
        raise ValueError(f"a scheduled id is 1 to {MAX_ID} printable characters, got {sid!r:.80}")
    return sid


def _need(headers: Headers, name: str) -> float:
    t = time_of(headers, name)
    if t is None:
        raise HeaderError(name, "missing on a scheduled record")
    return t


def scheduled_of(headers: Headers) -> ScheduledInfo:
    """The schedule a rung record carries; ``HeaderError`` naming the header when a part is
    missing, unparsable or out of bounds."""
    sid = text_of(headers, SCHEDULED_ID)
    if sid is None:
        raise HeaderError(SCHEDULED_ID, "missing on a scheduled record")
    try:
        check_id(sid)
    except ValueError as e:
        raise HeaderError(SCHEDULED_ID, str(e)) from None
    return ScheduledInfo(sid, _need(headers, SCHEDULED_DUE_AT), _need(headers, SCHEDULED_AT),
                         _need(headers, DUE_AT))


def strip_schedule(headers: Headers) -> Headers:
    """The record's own headers: neither kworkers' failure headers nor ``kw-scheduled-*``."""
    return tuple((k, v) for k, v in user_headers(headers)
                 if not k.startswith(SCHEDULED_PREFIX))


def _ms(t: float) -> bytes:
    return str(min(ms_up(t), MAX_TIME_MS)).encode()


def rung_headers(own: Headers, sid: str, due_at: float, scheduled_at: float,
                 release_at: float) -> Headers:
    """The headers of a record waiting in a rung until ``release_at``."""
    return (*strip_schedule(own), (SCHEDULED_ID, sid.encode()), (SCHEDULED_DUE_AT, _ms(due_at)),
            (SCHEDULED_AT, _ms(scheduled_at)), (DUE_AT, _ms(release_at)))


def delivered_headers(own: Headers, info: ScheduledInfo, delivered_at: float) -> Headers:
    """The headers a scheduled record arrives with at its destination."""
    return (*strip_schedule(own), (SCHEDULED_ID, info.id.encode()),
            (SCHEDULED_DUE_AT, _ms(info.due_at)), (DELIVERED_AT, _ms(delivered_at)))
