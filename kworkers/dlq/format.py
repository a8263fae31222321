"""How dead letters are shown to an operator, by `kworkers dlq list|show` and the console (pure
formatting, no broker).

Keys and values are bytes: they are shown as text when they are printable UTF-8 and as hex
otherwise, so a binary key never garbles a terminal and a text key is never shown as hex.
Spring's ``kafka_dlt-original-partition|offset|timestamp`` headers are big-endian integers and
are decoded as such. A value is shown as the schema registry decodes it when one is given
(``kworkers.kafka.schema_registry``), as a kworkers task envelope (Avro single-object
encoding) when it decodes as one.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from kworkers.dlq.ledger import Replayed
from kworkers.dlq.record import DeadLetter
from kworkers.dlq.redrive_plan import Replay, ledger_key
from kworkers.message import Message

if TYPE_CHECKING:
    from kworkers.kafka.schema_registry import ValueView

_BINARY_INT_HEADERS = {
    "kafka_dlt-original-partition": (">i", "int32"),
    "kafka_dlt-original-offset": (">q", "int64"),
    "kafka_dlt-original-timestamp": (">q", "int64"),
}


def bytes_text(raw: bytes | None, limit: int | None = None) -> str:
    """Printable UTF-8 as text, anything else as ``0x`` hex; ``None`` as ``(null)``."""
    if raw is None:
        return "(null)"
    text = as_text(raw)
    shown = text if text is not None else "0x" + raw.hex()
    if limit is not None and len(shown) > limit:
        shown = shown[: max(1, limit - 1)] + "…"
    return shown


def as_text(raw: bytes) -> str | None:
    """``raw`` as text when it is printable UTF-8, else None."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if all(c.isprintable() or c in "\n\t" for c in text) else None


def header_text(name: str, value: bytes) -> str:
    known = _BINARY_INT_HEADERS.get(name)
    if known is not None and len(value) == struct.calcsize(known[0]):
        return f"{struct.unpack(known[0], value)[0]} (binary {known[1]})"
    return bytes_text(value)


def iso(t: float | None) -> str:
    """Epoch seconds as ISO-8601 UTC to the millisecond."""
    if t is None:
        return "-"
    stamp = dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def age_text(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``3d04h``: the two largest units."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def redriven_text(mark: Replayed | None) -> str:
    """``no``, or when and where a redrive replayed the dead letter (from the ledger)."""
    if mark is None:
        return "no"
    return f"{iso(mark.at) if mark.at is not None else 'yes'} to {mark.where}"


def list_table(dead: Sequence[DeadLetter], now: float, title: str | None = None,
               marks: Mapping[str, Replayed] | None = None) -> Table:
    """The dead letters; ``marks`` (the ledger's markers) adds the ``redriven`` column."""
    t = Table(title=title, show_lines=False, header_style="bold")
    cols = ["dlq p@offset", "original topic/partition@offset", "key", "attempts",
            "error type", "reason", "last failure", "age"]
    if marks is not None:
        cols.append("redriven")
    for col in cols:
        t.add_column(col, no_wrap=col not in ("key", "redriven"), overflow="fold")
    for d in dead:
        row = [f"{d.dlq_partition}@{d.dlq_offset}",
               f"{d.original_topic}/{d.original_partition}@{d.original_offset}",
               bytes_text(d.key, 40), str(d.attempts), d.error_type, d.reason,
               iso(d.last_failure_at), age_text(d.age(now))]
        if marks is not None:
            row.append(redriven_text(marks.get(ledger_key(d))))
        t.add_row(*row)
    return t


def replay_line(r: Replay, dry_run: bool) -> str:
    """One replay of a redrive: which dead letter, its key and error, where it goes."""
    d = r.dead
    where = r.topic if r.partition is None else f"{r.topic}/{r.partition}"
    return (f"{'would replay' if dry_run else 'replayed'} {d.dlq_topic}/{d.dlq_partition}@"
            f"{d.dlq_offset} key={bytes_text(d.key, 40)} error={d.error_type} -> {where}")


def as_json(d: DeadLetter, now: float, mark: Replayed | None = None) -> dict[str, Any]:
    """``redriven_at`` and ``redriven_to`` are null until a redrive replayed it; a null key is
    null (the table's ``(null)`` is for eyes, not scripts)."""
    return {
        "dlq_topic": d.dlq_topic, "dlq_partition": d.dlq_partition, "dlq_offset": d.dlq_offset,
        "original_topic": d.original_topic, "original_partition": d.original_partition,
        "original_offset": d.original_offset,
        "key": None if d.key is None else bytes_text(d.key),  # a null key is JSON null
        "attempts": d.attempts, "error_type": d.error_type, "error_message": d.error_message,
        "reason": d.reason, "group": d.group, "first_failure_at": iso(d.first_failure_at),
        "last_failure_at": iso(d.last_failure_at), "dead_lettered_at": iso(d.dead_lettered_at),
        "age_seconds": round(d.age(now), 3),
        "redriven_at": None if mark is None or mark.at is None else iso(mark.at),
        "redriven_to": None if mark is None else mark.where,
    }


def envelope_text(value: bytes | None) -> list[str] | None:
    """The value as a task envelope, one field per line; None when it is not one.

    The envelope module is optional here (a slimmed install may leave it out), and only the
    registry-free single-object encoding can be decoded without asking a schema registry.
    """
    try:
        from kworkers.envelope import SingleObjectCodec
    except ImportError:
        return None
    try:
        task = SingleObjectCodec().decode(value)
    except Exception:
        return None
    lines = [
        f"workflow_id: {task.workflow_id}",
        f"activity_id: {task.activity_id}",
        f"idempotency_key: {task.idempotency_key}",
        f"activity_type: {task.activity_type}",
        f"created_at: {iso(task.created_at_ms / 1000) if task.created_at_ms else '-'}",
        f"payload: {bytes_text(task.payload)}",
    ]
    lines += [f"header {k}: {v}" for k, v in task.headers.items()]
    return lines


def registry_lines(view: ValueView, size: int) -> list[str]:
    """A value as the schema registry decoded it; None-decoded says why (then text or hex)."""
    kind = view.schema_type or "unknown type"
    subjects = ", ".join(view.subjects) or "(none found)"
    if view.decoded is None:
        return [f"value: schema id {view.schema_id} ({kind}, subject {subjects}) not decoded "
                f"through the registry: {view.problem}"]
    return [f"value: {kind} through the schema registry (schema id {view.schema_id}, "
            f"subject {subjects}, {size} bytes)",
            *(f"  {line}" for line in view.decoded.splitlines())]


def show_lines(msg: Message, dead: DeadLetter | None, problem: str | None,
               now: float, registry: ValueView | None = None,
               marks: Mapping[str, Replayed] | None = None) -> list[str]:
    """Everything about one DLQ record, as plain lines (no markup: values are user data).
    ``registry``: the value seen through a schema registry, when one was given; ``marks``:
    the redrive ledger's markers (a ``redriven`` line)."""
    out = [f"record {msg.topic}/{msg.partition}@{msg.offset}"]
    if msg.timestamp_ms is not None:
        out.append(f"  timestamp: {iso(msg.timestamp_ms / 1000)}")
    if dead is not None:
        out += [
            f"  original: {dead.original_topic}/{dead.original_partition}@"
            f"{dead.original_offset}",
            f"  group: {dead.group}",
            f"  attempts: {dead.attempts}",
            f"  reason: {dead.reason}",
            f"  error: {dead.error_type}: {dead.error_message}",
            f"  first failure: {iso(dead.first_failure_at)}",
            f"  last failure: {iso(dead.last_failure_at)}",
            f"  dead-lettered: {iso(dead.dead_lettered_at)} ({age_text(dead.age(now))} ago)",
        ]
        if marks is not None:
            out.append(f"  redriven: {redriven_text(marks.get(ledger_key(dead)))}")
    else:
        out.append(f"  not a kworkers dead letter: {problem}")
    out.append("headers:")
    out += [f"  {k}: {header_text(k, v)}" for k, v in msg.headers] or ["  (none)"]
    out.append(f"key: {bytes_text(msg.key)}")
    if registry is not None:
        out += registry_lines(registry, len(msg.value or b""))
        if registry.decoded is not None:
            return out
    env = envelope_text(msg.value)
    if env is not None:
        out.append(f"value: task envelope (Avro single-object, {len(msg.value or b'')} bytes)")
        out += [f"  {line}" for line in env]
    elif msg.value is None:
        out.append("value: (null)")
    else:
        kind = "text" if as_text(msg.value) is not None else "hex"
        out.append(f"value ({kind}, {len(msg.value)} bytes): {bytes_text(msg.value)}")
    return out
