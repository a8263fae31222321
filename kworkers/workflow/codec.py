"""Bytes in and out: step results and inputs as bounded JSON, activity records on Kafka.

Why JSON: results are read back by later steps, by ``kworkers workflow show`` and by people
debugging a run, on any worker version; JSON needs no schema registry and is readable in the
store. Why a size limit: every step reads its run's earlier results, and each result is a row
in the store; a step that returns a whole document makes every later step and the store pay
for it. Large data belongs elsewhere (a blob store, a table), and the result holds a reference.

An activity record is only a wake-up call: "run activity A of run W". The run's state in the
store is the truth, so the record carries ids and the definition it was dispatched under, and
nothing a worker must trust.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kworkers.envelope.envelope import ids_from_headers, ids_to_headers
from kworkers.errors import DecodeError
from kworkers.message import Headers, Message
from kworkers.tracing import TRACEPARENT
from kworkers.workflow.errors import ResultError

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "ActivityRecord", "decode_json", "encode_json"]

DEFAULT_MAX_RESULT_BYTES = 256 * 1024
RECORD_VERSION = 1


def encode_json(value: Any, what: str, limit: int) -> str:
    """``value`` as compact JSON text; ``ResultError`` when it is not JSON or over ``limit``
    bytes (UTF-8). NaN and infinities are refused: they are not JSON, and another reader
    would choke on them."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                          sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ResultError("ResultNotSerializable",
                          f"{what} is not JSON: {exc} (return dicts, lists, strings, numbers, "
                          "booleans or None)") from None
    size = len(text.encode("utf-8"))
    if size > limit:
        raise ResultError("ResultTooLarge",
                          f"{what} is {size:,} bytes of JSON, over the {limit:,}-byte limit "
                          "(Engine(max_result_bytes=...)); store large data elsewhere and "
                          "return a reference to it")
    return text


def decode_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"{what} in the store is not valid JSON ({exc}): the row was "
                          "changed outside kworkers", type="CorruptResult") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class ActivityRecord:
    """What a record on the activities topic asks for."""

    workflow_id: str
    activity_id: str
    workflow: str
    version: str

    @property
    def key(self) -> str:
        return f"{self.workflow_id}/{self.activity_id}"

    def encode(self, traceparent: str | None) -> tuple[bytes, bytes, Headers]:
        """(key, value, headers) to produce."""
        value = json.dumps({"v": RECORD_VERSION, "workflow": self.workflow,
                            "version": self.version}, separators=(",", ":")).encode("utf-8")
        headers = ids_to_headers(self.workflow_id, self.activity_id)
        if traceparent:
            headers = (*headers, (TRACEPARENT, traceparent.encode("ascii")))
        return self.key.encode("utf-8"), value, headers

    @classmethod
    def decode(cls, msg: Message) -> ActivityRecord:
        """The record in ``msg``; ``DecodeError`` (to the DLQ, with this reason) otherwise."""
        ids = ids_from_headers(msg.headers)
        if ids is None:
            raise DecodeError("not a workflow activity record: no kw-workflow-id / "
                              "kw-activity-id headers", type="NotAnActivity")
        try:
            body = json.loads(msg.value or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"activity record value is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise DecodeError("activity record value must be a JSON object")
        workflow, version = body.get("workflow"), body.get("version")
        if not isinstance(workflow, str) or not isinstance(version, str):
            raise DecodeError("activity record value needs string fields 'workflow' and "
                              f"'version', got {body!r}"[:300])
        if msg.key is not None and msg.key != f"{ids[0]}/{ids[1]}".encode():
            raise DecodeError(f"record key {msg.key[:200]!r} is not its ids "
                              f"'{ids[0]}/{ids[1]}'")
        return cls(ids[0], ids[1], workflow, version)
