"""The redrive history: what ``<dlq>.redriven`` (the redrive's ledger) says was replayed.

Every replay a redrive committed has a marker there, keyed ``<dlq>/<partition>/<offset>``,
whose value says where it went and when (``kworkers.dlq.redrive``). The ledger only grows, so
the console reads its tail: the newest ``limit`` markers, and says how many there are in all.
A marker that does not parse is shown as such, never dropped (``kworkers.dlq.ledger``
parses them, for the CLI too).
"""

from __future__ import annotations

from dataclasses import dataclass

from kworkers.dlq.ledger import Replayed, parse_marker
from kworkers.kafka import clients
from kworkers.kafka.offsets import topic_watermarks
from kworkers.kafka.reader import scan
from kworkers.kafka.settings import ClientSettings
from kworkers.topic_names import ledger_topic

#: The history page shows at most this many of the newest markers.
HISTORY_LIMIT = 200


@dataclass(frozen=True)
class History:
    ledger: str
    exists: bool
    entries: list[Replayed]  # newest first
    #: offsets the ledger spans: its markers, plus one transaction marker per committed batch
    span: int


def read_history(client: ClientSettings, dlq: str, limit: int = HISTORY_LIMIT) -> History:
    """The newest ``limit`` markers of ``dlq``'s ledger (an absent ledger: nothing replayed)."""
    ledger = ledger_topic(dlq)
    have = clients.list_topics(client)
    if ledger not in have:
        return History(ledger, False, [], 0)
    marks = topic_watermarks(client, {ledger: have[ledger]})[ledger]
    starts = {p: max(lo, hi - limit) for p, (lo, hi) in enumerate(marks)}
    span = sum(hi - lo for lo, hi in marks)
    got = scan(client, ledger, start=starts, limit=limit)
    entries = sorted((parse_marker(m) for m in got.messages),
                     key=lambda r: (r.at or 0.0, r.ledger_offset), reverse=True)
    return History(ledger, True, entries[:limit], span)


def replayed_lookup(history: History) -> dict[str, Replayed]:
    """Ledger key -> its marker, for the record page's "replayed since" line."""
    return {r.key: r for r in history.entries}
