"""One DLQ record as the record page shows it: value views, headers, failure history, trace.

The value is bytes of unknown shape, so it is shown every way that applies: as text when it is
printable UTF-8, always as a hex dump (bounded), through the schema registry when the console
was given one (``--schema-registry``: schema id, type, subject, the value as JSON; decoded by
the caller with ``kworkers.kafka.schema_registry``), as a kworkers task envelope when it decodes as
one, and as Avro when the console was given a writer schema (``--avro-schema``; the Confluent
wire format and Avro single-object encoding are recognised by their prefix, anything else is
read as bare Avro). A value that does not decode says why; nothing is hidden.

The failure history is what the record's headers prove: the original record, the first and
last failed attempts, when it was dead-lettered and why, the dead letter it was a replay of
(``kw-redrive-of``: it had died before, was redriven and died again), and whether a redrive
replayed it since (the ledger, read by the caller).

Pure: formatting reuses ``kworkers.dlq.format``, the one way dead letters are printed.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kworkers.dlq.format import as_text, envelope_text, header_text, iso
from kworkers.dlq.record import DeadLetter
from kworkers.message import Message
from kworkers.retry_tiers.headers import (
    DEAD_LETTERED_AT,
    DUE_AT,
    FIRST_FAILURE_AT,
    LAST_FAILURE_AT,
    ORIGINAL_TIMESTAMP,
    REDRIVE_OF,
    failure_of,
    is_own,
    last_value,
)
from kworkers.tracing import trace_context_of

if TYPE_CHECKING:
    from kworkers.kafka.schema_registry import ValueView

#: The hex dump shows at most this many bytes of a value.
HEX_LIMIT = 4096
_CONFLUENT_MAGIC = b"\x00"
_SINGLE_OBJECT_MAGIC = b"\xc3\x01"
#: kworkers headers holding epoch milliseconds: shown with the time they mean.
_TIME_HEADERS = frozenset({FIRST_FAILURE_AT, LAST_FAILURE_AT, DEAD_LETTERED_AT,
                           ORIGINAL_TIMESTAMP, DUE_AT})


@dataclass(frozen=True)
class HeaderRow:
    name: str
    shown: str
    kind: str  # "kworkers", "spring" or "user"


@dataclass(frozen=True)
class Event:
    """One line of the failure history: when (epoch seconds or None), what, and a link."""

    at: float | None
    what: str
    link: tuple[str, int, int] | None = None  # a DLQ record: (topic, partition, offset)


@dataclass(frozen=True)
class RecordView:
    message: Message
    dead: DeadLetter | None
    problem: str | None
    text: str | None
    hex_lines: list[str]
    hex_truncated: bool
    envelope: list[str] | None
    avro: str | None
    avro_problem: str | None
    #: the value through the schema registry (schema id, type, subjects, JSON or why not)
    registry: ValueView | None
    headers: list[HeaderRow]
    history: list[Event]
    trace_id: str | None
    span_id: str | None


def hex_dump(raw: bytes, limit: int = HEX_LIMIT) -> tuple[list[str], bool]:
    """``offset  hex bytes  |ascii|`` lines, 16 bytes each, of the first ``limit`` bytes."""
    lines = []
    for i in range(0, min(len(raw), limit), 16):
        chunk = raw[i:i + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}  {hexes:<47}  |{ascii_}|")
    return lines, len(raw) > limit


def decode_avro(value: bytes, schema: Any) -> Any:
    """``value`` read with the writer ``schema`` (a parsed fastavro schema)."""
    from fastavro import schemaless_reader

    body = value
    if value.startswith(_CONFLUENT_MAGIC) and len(value) > 5:
        body = value[5:]  # magic byte + 4-byte schema id
    elif value.startswith(_SINGLE_OBJECT_MAGIC) and len(value) > 10:
        body = value[10:]  # marker + 8-byte schema fingerprint
    buf = io.BytesIO(body)
    decoded = schemaless_reader(buf, schema, None)
    if buf.tell() != len(body):
        raise ValueError(f"{len(body) - buf.tell()} bytes left over: not this schema")
    return decoded


def _shown(name: str, value: bytes) -> str:
    text = header_text(name, value)
    if name in _TIME_HEADERS and value.isdigit() and len(value) <= 15:
        text += f" ({iso(int(value) / 1000)})"
    return text


def _kind(name: str) -> str:
    if name.startswith("kafka_dlt-"):
        return "spring"
    return "kworkers" if is_own(name) or name.startswith("kw-") else "user"


def history_of(msg: Message, dead: DeadLetter | None,
               replayed: tuple[float | None, str] | None) -> list[Event]:
    """What happened to this record, oldest first. ``replayed``: (when, to where) from the
    redrive ledger when a redrive replayed it."""
    events: list[Event] = []
    redrive_of = last_value(msg.headers, REDRIVE_OF)
    if redrive_of is not None:
        text = redrive_of.decode("utf-8", "replace")
        topic, _, rest = text.rpartition("/")
        topic, _, part = topic.rpartition("/")
        link = (topic, int(part), int(rest)) if part.isdigit() and rest.isdigit() else None
        events.append(Event(None, f"a replay of dead letter {text}, redriven earlier", link))
    if dead is not None:
        info = failure_of(dead.headers)
        ts = None if info is None else info.original_timestamp_ms
        at = None if ts is None or ts < 0 else ts / 1000
        events += [
            Event(at, f"produced to {dead.original_topic}/{dead.original_partition}@"
                      f"{dead.original_offset}"),
            Event(dead.first_failure_at, "first failure (attempt 1)"),
            Event(dead.last_failure_at, f"last failure (attempt {dead.attempts}): "
                                        f"{dead.error_type}: {dead.error_message}"),
            Event(dead.dead_lettered_at, f"dead-lettered to {dead.dlq_topic}/"
                                         f"{dead.dlq_partition}@{dead.dlq_offset} "
                                         f"({dead.reason}) by group {dead.group}"),
        ]
    if replayed is not None:
        events.append(Event(replayed[0], f"replayed by a redrive to {replayed[1]}"))
    return events


def record_view(msg: Message, dead: DeadLetter | None, problem: str | None,
                avro_schema: Any = None,
                replayed: tuple[float | None, str] | None = None,
                registry: ValueView | None = None) -> RecordView:
    value = msg.value
    text = as_text(value) if value is not None else None
    hex_lines, hex_cut = hex_dump(value or b"")
    avro = avro_problem = None
    if avro_schema is not None and value is not None:
        try:
            avro = json.dumps(decode_avro(value, avro_schema), indent=2, default=str,
                              ensure_ascii=False)
        except Exception as exc:  # any decoding failure is shown, never fatal
            avro_problem = f"{type(exc).__name__}: {exc}"
    parent, _state = trace_context_of(msg)
    return RecordView(
        message=msg, dead=dead, problem=problem, text=text, hex_lines=hex_lines,
        hex_truncated=hex_cut, envelope=envelope_text(value), avro=avro,
        avro_problem=avro_problem, registry=registry,
        headers=[HeaderRow(k, _shown(k, v), _kind(k)) for k, v in msg.headers],
        history=history_of(msg, dead, replayed),
        trace_id=None if parent is None else parent.trace_id,
        span_id=None if parent is None else parent.span_id,
    )

