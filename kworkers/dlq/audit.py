"""The redrive audit: who replayed what, when, and with what result, durably (pure).

Why a topic of its own (``<dlq>.audit``, compacted, one partition): the ledger
``<dlq>.redriven`` is keyed per dead letter and its readers (the redrive's own skip set, the
console's history and record pages) take every key there for a dead letter; an audit entry
among them would be a key that is none. Here each redrive writes two entries, keyed
``<run>/start`` and ``<run>/end`` (unique keys: compaction never drops one), through the
redrive's own transactional producer:

- ``start`` before the first replay: who (``Actor``), through what (``cli``, ``console``,
  ``api``), when, the DLQ, the selection and the target;
- ``end`` after the last commit: the summary line, or the error that stopped it.

A run with a start and no end was cut off (a crash, a fence by a concurrent redrive): the
history says so rather than showing nothing. A dry run changes nothing and writes nothing.
The console's history page reads the whole topic (two small records per redrive), so what it
shows survives any restart of the console, which keeps its jobs in memory only.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kworkers.errors import ConfigError

SCHEMA = "kworkers.redrive-audit/1"


@dataclass(frozen=True)
class Actor:
    """Who started a redrive (a console operator's token name, an OS user) and through what."""

    who: str
    via: str

    def __post_init__(self) -> None:
        if not self.who.strip() or not self.via.strip():
            raise ConfigError("a redrive's actor needs a name and a way (cli, console, api)")

    @classmethod
    def of_process(cls, via: str) -> Actor:
        """This process's OS user on this host (what the CLI records)."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid {os.getuid()}"
        return cls(f"{user}@{socket.gethostname()}", via)


def new_run() -> str:
    return uuid.uuid4().hex


def describe_filter(flt: Any, target: str | None = None) -> str:
    """A redrive selection in words: every criterion that is set (``RedriveFilter`` and the
    console's subclass alike), and the target."""
    parts = []
    for f in fields(flt):
        value = getattr(flt, f.name)
        if value is None or f.name == "upto":
            continue
        if f.name == "records":
            parts.append(f"{len(value)} selected records")
        elif isinstance(value, bytes):
            parts.append(f"{f.name}={value.decode('utf-8', 'replace')}")
        else:
            parts.append(f"{f.name}={value}")
    if target:
        parts.append(f"to {target}")
    return ", ".join(parts) or "every dead letter"


def start_entry(run: str, actor: Actor, dlq: str, selection: str, target: str | None,
                at: float) -> tuple[bytes, bytes]:
    """The (key, value) written before the first replay."""
    body = {"schema": SCHEMA, "run": run, "phase": "start", "who": actor.who, "via": actor.via,
            "at_ms": round(at * 1000), "dlq": dlq, "selection": selection, "target": target}
    return f"{run}/start".encode(), json.dumps(body).encode()


def end_entry(run: str, actor: Actor, at: float, result: str | None,
              error: str | None = None) -> tuple[bytes, bytes]:
    """The (key, value) written after the last commit (``result``) or a failure (``error``)."""
    body = {"schema": SCHEMA, "run": run, "phase": "end", "who": actor.who, "via": actor.via,
            "at_ms": round(at * 1000), "result": result, "error": error}
    return f"{run}/end".encode(), json.dumps(body).encode()


@dataclass(frozen=True)
class AuditRun:
    """One redrive as the audit topic tells it (``ended`` None: it never finished)."""

    run: str
    who: str
    via: str
    started: float | None
    dlq: str | None
    selection: str | None
    target: str | None
    ended: float | None
    result: str | None
    error: str | None

    @property
    def outcome(self) -> str:
        if self.ended is None:
            return "did not finish (crashed, killed or fenced by another redrive)"
        return self.error if self.error else (self.result or "done")


def _body(value: bytes | None) -> dict[str, Any] | None:
    try:
        body = json.loads(value or b"")
    except ValueError:
        return None
    return body if isinstance(body, dict) and body.get("schema") == SCHEMA else None


def _seconds(body: Mapping[str, Any]) -> float | None:
    at = body.get("at_ms")
    return at / 1000 if isinstance(at, int | float) else None


def runs(entries: Iterable[tuple[bytes | None, bytes | None]]) -> list[AuditRun]:
    """The redrives the audit topic's (key, value) records describe, newest first; records
    that are not audit entries are skipped."""
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    for _key, value in entries:
        body = _body(value)
        if body is None or not isinstance(body.get("run"), str):
            continue
        (starts if body.get("phase") == "start" else ends)[body["run"]] = body
    out = []
    for run in {*starts, *ends}:
        s, e = starts.get(run, {}), ends.get(run)
        first = s or e or {}
        out.append(AuditRun(
            run, str(first.get("who", "?")), str(first.get("via", "?")), _seconds(s),
            s.get("dlq"), s.get("selection"), s.get("target"),
            None if e is None else _seconds(e), None if e is None else e.get("result"),
            None if e is None else e.get("error")))
    return sorted(out, key=lambda r: r.started or r.ended or 0.0, reverse=True)
