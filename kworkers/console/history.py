"""The redrive history: what ``<dlq>.redriven`` (the redrive's ledger) says was replayed.

Every replay a redrive committed has a marker there, keyed ``<dlq>/<partition>/<offset>``,
whose value says where it went and when (``kworkers.dlq.redrive``). The ledger only grows, so
the console reads its tail: the newest ``limit`` markers, and says how many there are in all.
A marker that does not parse is shown as such, never dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kworkers.console.watermarks import watermarks
from kworkers.kafka import clients
from kworkers.kafka.reader import scan
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message
from kworkers.topic_names import ledger_topic

#: The history page shows at most this many of the newest markers.
HISTORY_LIMIT = 200


@dataclass(frozen=True)
class Replayed:
    """One ledger marker: which dead letter, replayed where and when (None where unreadable)."""

    key: str
    dlq_partition: int | None
    dlq_offset: int | None
    target: str | None
    target_partition: int | None
    at: float | None
    original: str | None
    ledger_offset: int
    problem: str | None = None


@dataclass(frozen=True)
class History:
    ledger: str
    exists: bool
    entries: list[Replayed]  # newest first
    #: offsets the ledger spans: its markers, plus one transaction marker per committed batch
    span: int


def parse_marker(msg: Message) -> Replayed:
    key = (msg.key or b"").decode("utf-8", "replace")
    _dlq, _, rest = key.rpartition("/")
    _dlq, _, part = _dlq.rpartition("/")
    ok = part.isdigit() and rest.isdigit()
    partition, offset = (int(part), int(rest)) if ok else (None, None)
    try:
        body = json.loads(msg.value or b"")
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        at_ms = body.get("at_ms")
        tp = body.get("partition")
        return Replayed(key, partition, offset, target=str(body.get("target")),
                        target_partition=tp if isinstance(tp, int) else None,
                        at=at_ms / 1000 if isinstance(at_ms, int | float) else None,
                        original=str(body.get("original", "")) or None,
                        ledger_offset=msg.offset)
    except ValueError as exc:
        return Replayed(key, partition, offset, target=None, target_partition=None, at=None,
                        original=None, ledger_offset=msg.offset,
                        problem=f"unreadable marker: {exc}")


def read_history(client: ClientSettings, dlq: str, limit: int = HISTORY_LIMIT) -> History:
    """The newest ``limit`` markers of ``dlq``'s ledger (an absent ledger: nothing replayed)."""
    ledger = ledger_topic(dlq)
    have = clients.list_topics(client)
    if ledger not in have:
        return History(ledger, False, [], 0)
    marks = watermarks(client, {ledger: have[ledger]})[ledger]
    starts = {p: max(lo, hi - limit) for p, (lo, hi) in enumerate(marks)}
    span = sum(hi - lo for lo, hi in marks)
    got = scan(client, ledger, start=starts, limit=limit)
    entries = sorted((parse_marker(m) for m in got.messages),
                     key=lambda r: (r.at or 0.0, r.ledger_offset), reverse=True)
    return History(ledger, True, entries[:limit], span)


def replayed_lookup(history: History) -> dict[str, Replayed]:
    """Ledger key -> its marker, for the record page's "replayed since" line."""
    return {r.key: r for r in history.entries}
