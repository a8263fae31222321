"""The redrive ledger ``<dlq>.redriven`` read back: which dead letters were replayed, where, when.

Every replay a redrive committed has a marker there, in the same transaction as the replay,
keyed ``<dlq>/<partition>/<offset>`` (``redrive_plan.ledger_key``), whose JSON value says where
it went and when (``replayer._produce_marker``). The redrive reads the keys to never replay a
dead letter twice (as one bit per DLQ offset: ``kworkers.dlq.replayed``); ``dlq list``,
``dlq show`` and the console read the markers to say a dead letter was redriven already. A
marker that does not parse is kept with the reason, never dropped (its key still counts as
replayed).
"""

from __future__ import annotations

import json
from collections.abc import Set
from dataclasses import dataclass

from kworkers.kafka import clients
from kworkers.kafka.reader import stream, watermarks
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message
from kworkers.topic_names import ledger_topic


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

    @property
    def where(self) -> str:
        """``orders/3`` (or ``orders`` when it went by key, ``?`` when unreadable)."""
        if self.target is None:
            return "?"
        return self.target + ("" if self.target_partition is None
                              else f"/{self.target_partition}")


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


def read_marks(client: ClientSettings | str, dlq: str,
               keys: Set[str] | None = None) -> dict[str, Replayed]:
    """The committed markers of ``dlq``'s ledger by ledger key (the latest wins), only those of
    ``keys`` when given (what a listing shows: memory in proportion to it, not to the ledger);
    empty without a ledger. The ledger is compacted: one marker per dead letter ever
    replayed. Read chunk by chunk (``reader.stream``: each partition in offset order)."""
    name = ledger_topic(dlq)
    if name not in clients.list_topics(client) or (keys is not None and not keys):
        return {}
    out: dict[str, Replayed] = {}
    for chunk in stream(client, name, watermarks(client, name)):
        for m in chunk:
            if keys is not None and (m.key or b"").decode("utf-8", "replace") not in keys:
                continue
            r = parse_marker(m)
            held = out.get(r.key)
            if held is None or held.ledger_offset < r.ledger_offset:
                out[r.key] = r
    return out
