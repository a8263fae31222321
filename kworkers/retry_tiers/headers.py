"""The failure headers kworkers writes on retry and DLQ records, and reads back.

Values are UTF-8 text (decimal integers; times as epoch milliseconds) so an operator can read
them with any console tool. Every header we read is validated: a record whose headers are
garbage fails with ``HeaderError``, which is a ``DecodeError`` and so goes to the DLQ at once
instead of being retried by a worker that can never understand it.

The first source record is the identity of a failure: ``kw-original-*`` and
``kw-first-failure-at`` are copied from hop to hop, never replaced by the tier record's own
coordinates. DLQ records also carry the headers Spring for Apache Kafka's
``DeadLetterPublishingRecoverer`` writes, byte for byte, so existing DLT tooling can read them.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from kworkers.errors import DecodeError
from kworkers.memory import HEADER_COST, header_bytes
from kworkers.message import Headers, Message
from kworkers.retry_tiers.routing import DeadLetterDecision, RetryDecision
from kworkers.topic_names import is_legal_topic, is_tier_topic, source_topic_of

ATTEMPT = "kw-attempt"
ORIGINAL_TOPIC = "kw-original-topic"
ORIGINAL_PARTITION = "kw-original-partition"
ORIGINAL_OFFSET = "kw-original-offset"
ORIGINAL_TIMESTAMP = "kw-original-timestamp"
ORIGINAL_TOPIC_ID = "kw-original-topic-id"
GROUP = "kw-group"
FIRST_FAILURE_AT = "kw-first-failure-at"
LAST_FAILURE_AT = "kw-last-failure-at"
ERROR_TYPE = "kw-error-type"
ERROR_MESSAGE = "kw-error-message"
DUE_AT = "kw-due-at"
DEAD_LETTERED_AT = "kw-dead-lettered-at"
DLQ_REASON = "kw-dlq-reason"
REDRIVE_OF = "kw-redrive-of"
#: the span of the attempt that failed (a W3C ``traceparent`` value), written by the hand-off to
#: a tier or the DLQ and kept by a redrive: the next attempt's span links to it
#: (``kworkers.tracing``). Ours, not the record's: the user's ``traceparent`` is never touched
TRACE_PREVIOUS = "kw-trace-previous"
#: the last heartbeat details of the attempt that failed, on a retry record (raw bytes, at
#: most ``MAX_HEADER_VALUE``): the next attempt resumes from them without a store too
CHECKPOINT = "kw-checkpoint"
#: a payload that could not be decoded: the schema id of its Confluent framing, when it has one
SCHEMA_ID = "kw-schema-id"
TRACEPARENT = "traceparent"

SPRING_ORIGINAL_TOPIC = "kafka_dlt-original-topic"
SPRING_ORIGINAL_PARTITION = "kafka_dlt-original-partition"
SPRING_ORIGINAL_OFFSET = "kafka_dlt-original-offset"
SPRING_ORIGINAL_TIMESTAMP = "kafka_dlt-original-timestamp"
SPRING_ORIGINAL_CONSUMER_GROUP = "kafka_dlt-original-consumer-group"
SPRING_EXCEPTION_FQCN = "kafka_dlt-exception-fqcn"
SPRING_EXCEPTION_MESSAGE = "kafka_dlt-exception-message"

#: The failure headers we own: stripped from a record before we write ours, so a record that
#: hops through tiers carries one current set, not a growing pile. Other ``kw-`` headers (the
#: activity ids ``kw-workflow-id`` / ``kw-activity-id``) belong to the record and travel with it.
OWN_HEADERS = frozenset({
    ATTEMPT, ORIGINAL_TOPIC, ORIGINAL_PARTITION, ORIGINAL_OFFSET, ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC_ID, GROUP,
    FIRST_FAILURE_AT, LAST_FAILURE_AT, ERROR_TYPE, ERROR_MESSAGE, DUE_AT, DEAD_LETTERED_AT,
    DLQ_REASON, REDRIVE_OF, CHECKPOINT, SCHEMA_ID, TRACE_PREVIOUS,
})
OWN_PREFIXES = ("kafka_dlt-",)


def is_own(name: str) -> bool:
    return name in OWN_HEADERS or name.startswith(OWN_PREFIXES)

#: Any single header value we write is cut to this many bytes (at a UTF-8 boundary), and one
#: we read that is longer is refused: none of ours ever is, so it was written by someone else.
MAX_HEADER_VALUE = 4096
#: Times we read are epoch milliseconds in [0, the last millisecond of year 9999]: beyond it no
#: calendar can print them, and before it no kworkers clock wrote them.
MAX_TIME_MS = 253_402_300_799_999

_SHOWN_VALUE = 64
_INT = re.compile(rb"-?[0-9]{1,19}")
#: a Kafka topic id as its clients print it: 16 bytes in URL-safe base64, unpadded
_TOPIC_ID = re.compile(r"[A-Za-z0-9_-]{22}")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_T = TypeVar("_T")

_NO_TIMESTAMP = -1  # what Kafka (and so Spring) reports for a record without a timestamp


class HeaderError(DecodeError):
    """A kworkers header is missing or cannot be parsed; the message names header and value."""

    def __init__(self, header: str, problem: str, value: bytes | None = None) -> None:
        shown = "" if value is None else f", got {_show(value)}"
        super().__init__(f"header {header!r}: {problem}{shown}", type="HeaderError")
        self.header = header
        self.value = value


@dataclass(frozen=True)
class FailureInfo:
    """What the kw-* headers of a retry or DLQ record say about its failure so far.

    ``attempt`` is the attempt the record will run as on a retry record, and the attempts
    made on a DLQ record. Times are seconds since the epoch.
    """

    original_topic: str
    original_partition: int
    original_offset: int
    original_timestamp_ms: int | None
    group: str
    attempt: int
    first_failure_at: float
    last_failure_at: float
    error_type: str
    error_message: str
    due_at: float | None
    #: the original topic's id when the record was first read (None: written before kworkers
    #: recorded it)
    original_topic_id: str | None = None


# --- reading -------------------------------------------------------------------------------


def _show(value: bytes) -> str:
    try:
        return repr(value.decode("utf-8")[:_SHOWN_VALUE])
    except UnicodeDecodeError:
        return repr(value[:_SHOWN_VALUE])


def last_value(headers: Headers, name: str) -> bytes | None:
    """The last value of ``name``: Kafka allows repeats; as in ``Message.header``, the last wins."""
    for k, v in reversed(headers):
        if k == name:
            return v
    return None


def _parse_int(name: str, raw: bytes, minimum: int | None = None,
               maximum: int | None = None) -> int:
    # A strict pattern, not int(): int() would accept " 2", "+2" and "1_0", which no writer of
    # ours produces; the int64 range is Kafka's own for offsets and timestamps, so a value
    # beyond it (9223372036854775808) is refused here instead of surfacing as a number later.
    if raw.isdigit() and len(raw) <= 18:  # what kworkers writes: ASCII digits, in range
        n = int(raw)
    else:
        if not _INT.fullmatch(raw):
            raise HeaderError(name, "expected a decimal integer", raw)
        n = int(raw)
        if not _INT64_MIN <= n <= _INT64_MAX:
            raise HeaderError(name, "beyond the 64-bit range", raw)
    if minimum is not None and n < minimum:
        raise HeaderError(name, f"expected an integer >= {minimum}", raw)
    if maximum is not None and n > maximum:
        raise HeaderError(name, f"expected an integer <= {maximum}", raw)
    return n


def _int(raw: bytes | None, name: str, *, minimum: int | None = None,
         maximum: int | None = None) -> int | None:
    return None if raw is None else _parse_int(name, raw, minimum, maximum)


def _text(raw: bytes | None, name: str) -> str | None:
    if raw is None:
        return None
    if len(raw) > MAX_HEADER_VALUE:
        raise HeaderError(name, f"longer than {MAX_HEADER_VALUE} bytes ({len(raw)})", raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderError(name, "expected UTF-8 text", raw) from None


def text_of(headers: Headers, name: str) -> str | None:
    """The last value of ``name`` as text; ``HeaderError`` when too long or not UTF-8."""
    return _text(last_value(headers, name), name)


def _time(raw: bytes | None, name: str) -> float | None:
    ms = _int(raw, name, minimum=0, maximum=MAX_TIME_MS)
    return None if ms is None else ms / 1000


def time_of(headers: Headers, name: str) -> float | None:
    """The last value of time header ``name`` (epoch ms) in seconds; None when absent,
    ``HeaderError`` when it is not a time kworkers could have written."""
    return _time(last_value(headers, name), name)


def _need(value: _T | None, name: str) -> _T:
    if value is None:
        raise HeaderError(name, "missing")
    return value


def attempt_of(headers: Headers) -> int:
    """The attempt a record runs as: 1 for a record that never failed."""
    raw = last_value(headers, ATTEMPT)
    if raw is None:
        return 1
    return _parse_int(ATTEMPT, raw, minimum=1)


def due_at_of(headers: Headers) -> float | None:
    """When a retry record is due, in seconds; None for a record with no due time."""
    return _time(last_value(headers, DUE_AT), DUE_AT)


def dead_lettered_at_of(headers: Headers) -> float | None:
    """When a DLQ record was dead-lettered, in seconds; None when absent."""
    return _time(last_value(headers, DEAD_LETTERED_AT), DEAD_LETTERED_AT)


def dlq_reason_of(headers: Headers) -> str | None:
    """Why a DLQ record was dead-lettered (``exhausted``, ``non_retryable``); None when absent."""
    return text_of(headers, DLQ_REASON)


def check_due(due_at: float, now: float, max_ahead: float) -> float:
    """``due_at`` if it is plausible; a past due time just means "due now" (a negative one
    never parses: see ``due_at_of``).

    A due time further ahead than any tier's delay (plus slack, the caller's ``max_ahead``)
    is a bug or a forged header: it would park the record in the timer heap for good, so it
    is refused as non-retryable instead.
    """
    if due_at - now > max_ahead:
        raise HeaderError(
            DUE_AT,
            f"due {due_at - now:.3f} s from now, more than the {max_ahead:g} s allowed",
            str(_ms_up(due_at)).encode(),
        )
    return due_at


def topic_id_of(headers: Headers) -> str | None:
    """``kw-original-topic-id``: None when absent, ``HeaderError`` when not a topic id."""
    return _topic_id(text_of(headers, ORIGINAL_TOPIC_ID))


def _topic_id(text: str | None) -> str | None:
    if text is not None and not _TOPIC_ID.fullmatch(text):
        raise HeaderError(ORIGINAL_TOPIC_ID, "expected a Kafka topic id (22 characters of "
                          "URL-safe base64)", text.encode())
    return text


def failure_of(headers: Headers) -> FailureInfo | None:
    """The failure a retry or DLQ record carries; None for a record that never failed.

    Read through a dict of the headers (the last value of a name wins, as in ``last_value``):
    a tier record carries a dozen, and a scan per field was most of a retry loop's check
    (14 scans of 13 headers, 10 us of a 15 us check)."""
    last = dict(headers)
    topic = _text(last.get(ORIGINAL_TOPIC), ORIGINAL_TOPIC)
    if topic is None:
        return None
    if not is_legal_topic(topic):  # we only ever write a topic we read from
        raise HeaderError(ORIGINAL_TOPIC, "not a legal topic name", topic.encode())
    attempt = _need(last.get(ATTEMPT), ATTEMPT)  # absent means 1 elsewhere, not here
    return FailureInfo(
        original_topic=topic,
        original_partition=_need(_int(last.get(ORIGINAL_PARTITION), ORIGINAL_PARTITION,
                                      minimum=0), ORIGINAL_PARTITION),
        original_offset=_need(_int(last.get(ORIGINAL_OFFSET), ORIGINAL_OFFSET, minimum=0),
                              ORIGINAL_OFFSET),
        original_timestamp_ms=_int(last.get(ORIGINAL_TIMESTAMP), ORIGINAL_TIMESTAMP, minimum=0),
        group=_need(_text(last.get(GROUP), GROUP), GROUP),
        attempt=_parse_int(ATTEMPT, attempt, minimum=1),
        first_failure_at=_need(_time(last.get(FIRST_FAILURE_AT), FIRST_FAILURE_AT),
                               FIRST_FAILURE_AT),
        last_failure_at=_need(_time(last.get(LAST_FAILURE_AT), LAST_FAILURE_AT),
                              LAST_FAILURE_AT),
        error_type=_need(_text(last.get(ERROR_TYPE), ERROR_TYPE), ERROR_TYPE),
        error_message=_need(_text(last.get(ERROR_MESSAGE), ERROR_MESSAGE), ERROR_MESSAGE),
        due_at=_time(last.get(DUE_AT), DUE_AT),
        original_topic_id=_topic_id(_text(last.get(ORIGINAL_TOPIC_ID), ORIGINAL_TOPIC_ID)),
    )


# --- writing -------------------------------------------------------------------------------


def _enc(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) <= MAX_HEADER_VALUE:
        return raw
    # Cut at a character boundary: a consumer decoding strictly must not choke on our header.
    return raw[:MAX_HEADER_VALUE].decode("utf-8", "ignore").encode("utf-8")


def _ms(t: float) -> int:
    return round(t * 1000)


def _ms_up(t: float) -> int:
    # Rounded up so a due time read back is never early; the epsilon keeps float noise
    # (0.1 * 3 * 1000 == 300.00000000000006) from costing a whole millisecond.
    return math.ceil(t * 1000 - 1e-6)


def ms_up(t: float) -> int:
    """``t`` in epoch milliseconds, rounded up: a due time written this way is never early."""
    return _ms_up(t)


def user_headers(headers: Headers) -> Headers:
    """The headers that are not ours (including ``traceparent``), in their original order."""
    if not headers:
        return ()
    return tuple((k, v) for k, v in headers if not is_own(k))


class Origin(NamedTuple):
    """The record a piece of work began as: where it was first read (the ``kw-original-*``
    headers every hop carries), and so what its idempotency key is when it has no ids
    (``kworkers.record_key``). ``topic_id`` tells a recreated topic's records from the old
    ones at the same offsets; None where it is not known. (A ``NamedTuple``: one is built per
    failed record, see ``routing.RetryDecision``.)"""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    first_failure_at: float | None
    topic_id: str | None = None


def origin_of(msg: Message) -> Origin:
    """Where the work began: the record itself, unless it was read from a retry tier whose
    headers name that tier's own source (then the first record's coordinates carry over).

    Headers never name an origin outside the topic the record was consumed from: a source
    record's kw-* headers are ignored (anyone who can write to a topic can write them), and a
    tier record whose headers do not parse or name another topic describes itself. (A
    redriven record's origin is the dead letter's, checked against the DLQ itself: see
    ``kworkers.record_key``; this pure function knows only the record.)
    """
    info = None
    if is_tier_topic(msg.topic):
        try:
            info = failure_of(msg.headers)
        except HeaderError:
            # The record is on its way to the DLQ because of these very headers (HeaderError
            # is non-retryable); refusing to write its DLQ headers would wedge the partition.
            info = None
        if info is not None and info.original_topic != source_topic_of(msg.topic):
            info = None
    if info is None:
        return Origin(msg.topic, msg.partition, msg.offset, msg.timestamp_ms, None)
    return Origin(
        info.original_topic,
        info.original_partition,
        info.original_offset,
        info.original_timestamp_ms,
        info.first_failure_at,
        info.original_topic_id,
    )


#: Header pairs that repeat from record to record, made once: a topic's (a worker reads few;
#: bounded all the same) and the current millisecond's failure times (a storm fails thousands
#: of records in one). Shared by every router of the process: each is a pure function of its
#: key, so two threads racing only make one twice.
_PAIRS_LIMIT = 1024
_TOPIC_PAIRS: dict[str, tuple[tuple[str, bytes], int]] = {}
_NOW_PAIRS: list[tuple[int, tuple[str, bytes], int, tuple[str, bytes], int]] = [
    (-1, (FIRST_FAILURE_AT, b""), 0, (LAST_FAILURE_AT, b""), 0)]
#: what each per-record header costs the byte bound beyond its value (``memory.header_bytes``:
#: its name and ``HEADER_COST``), so a retry's headers are sized as they are built, not walked
#: again (``FailureHeaders.retry``)
_PARTITION_COST = HEADER_COST + len(ORIGINAL_PARTITION)
_OFFSET_COST = HEADER_COST + len(ORIGINAL_OFFSET)
_TIMESTAMP_COST = HEADER_COST + len(ORIGINAL_TIMESTAMP)
_TOPIC_ID_COST = HEADER_COST + len(ORIGINAL_TOPIC_ID)
_FIRST_COST = HEADER_COST + len(FIRST_FAILURE_AT)
_REDRIVE_COST = HEADER_COST + len(REDRIVE_OF)
_DUE_COST = HEADER_COST + len(DUE_AT)
_CHECKPOINT_COST = HEADER_COST + len(CHECKPOINT)


class FailureHeaders:
    """The failure headers of one (group, attempt, error type, error message), encoded once.

    In a failure storm thousands of records fail alike; what differs between them is where
    each began, when, and its due time. This holds the rest as bytes, so a router that keeps
    one per distinct failure (``FailureRouter``) encodes per record only what is the record's
    own. ``retry_headers`` and ``dead_letter_headers`` are the same thing built for one record.
    """

    __slots__ = ("_attempt", "_dead", "_error", "_fixed", "_group")

    def __init__(self, group: str, attempt: int, error_type: str, error_message: str) -> None:
        self._attempt = (ATTEMPT, str(attempt).encode())
        self._group = (GROUP, _enc(group))
        etype, emsg = _enc(error_type), _enc(error_message)
        self._error = ((ERROR_TYPE, etype), (ERROR_MESSAGE, emsg))
        self._dead = ((SPRING_ORIGINAL_CONSUMER_GROUP, self._group[1]),
                      (SPRING_EXCEPTION_FQCN, etype), (SPRING_EXCEPTION_MESSAGE, emsg))
        #: the bytes of the headers every record of this failure gets alike
        self._fixed = header_bytes((self._attempt, self._group, *self._error))

    def _own(self, msg: Message, now: float, origin: Origin | None
             ) -> tuple[Origin, list[tuple[str, bytes]], int]:
        """Where the work began, the failure headers a retry and a dead letter share, and
        their bytes as ``memory.header_bytes`` counts them."""
        o = origin_of(msg) if origin is None else origin
        got = _TOPIC_PAIRS.get(o.topic)
        if got is None:
            if len(_TOPIC_PAIRS) >= _PAIRS_LIMIT:
                _TOPIC_PAIRS.clear()
            pair = (ORIGINAL_TOPIC, _enc(o.topic))
            got = _TOPIC_PAIRS[o.topic] = (pair, header_bytes((pair,)))
        partition, offset = b"%d" % o.partition, b"%d" % o.offset
        out: list[tuple[str, bytes]] = [
            self._attempt, got[0], (ORIGINAL_PARTITION, partition), (ORIGINAL_OFFSET, offset),
        ]
        size = (self._fixed + got[1] + _PARTITION_COST + len(partition) + _OFFSET_COST
                + len(offset))
        if o.timestamp_ms is not None:
            ts = b"%d" % o.timestamp_ms
            out.append((ORIGINAL_TIMESTAMP, ts))
            size += _TIMESTAMP_COST + len(ts)
        if o.topic_id is not None:
            topic_id = o.topic_id.encode()
            out.append((ORIGINAL_TOPIC_ID, topic_id))
            size += _TOPIC_ID_COST + len(topic_id)
        out.append(self._group)
        ms = round(now * 1000)
        at = _NOW_PAIRS[0]
        if at[0] != ms:
            last = b"%d" % ms
            first_pair, last_pair = (FIRST_FAILURE_AT, last), (LAST_FAILURE_AT, last)
            at = _NOW_PAIRS[0] = (ms, first_pair, header_bytes((first_pair,)),
                                  last_pair, header_bytes((last_pair,)))
        if o.first_failure_at is None:
            out += (at[1], at[3], *self._error)
            size += at[2] + at[4]
        else:
            first = b"%d" % _ms(o.first_failure_at)
            out += ((FIRST_FAILURE_AT, first), at[3], *self._error)
            size += _FIRST_COST + len(first) + at[4]
        # A redriven record keeps naming the dead letter it came from until it is redriven
        # again.
        redrive_of = last_value(msg.headers, REDRIVE_OF) if msg.headers else None
        if redrive_of is not None:
            redrive_of = redrive_of[:MAX_HEADER_VALUE]
            out.append((REDRIVE_OF, redrive_of))
            size += _REDRIVE_COST + len(redrive_of)
        return o, out, size

    def retry(self, msg: Message, now: float, due_at: float,
              origin: Origin | None = None, checkpoint: bytes | None = None
              ) -> tuple[Headers, int]:
        """User headers, then the failure so far and the due time (see ``retry_headers``);
        the failed attempt's last heartbeat details when there are any (too large for a header:
        left out, the store keeps them if there is one). With their bytes as
        ``memory.header_bytes`` counts them: sized as they are built, since a storm hands off
        every record and walking them again cost a tenth of a failed record's CPU."""
        _, own, size = self._own(msg, now, origin)
        due = b"%d" % _ms_up(due_at)
        own.append((DUE_AT, due))
        size += _DUE_COST + len(due)
        if checkpoint is not None and len(checkpoint) <= MAX_HEADER_VALUE:
            own.append((CHECKPOINT, checkpoint))
            size += _CHECKPOINT_COST + len(checkpoint)
        if not msg.headers:
            return tuple(own), size
        user = user_headers(msg.headers)
        return (*user, *own), size + header_bytes(user)

    def dead(self, msg: Message, now: float, reason: str,
             origin: Origin | None = None) -> Headers:
        """User headers, the failure, then Spring's DLT aliases (see ``dead_letter_headers``)."""
        o, own, _ = self._own(msg, now, origin)
        own += [
            (DEAD_LETTERED_AT, b"%d" % _ms(now)),
            (DLQ_REASON, reason.encode()),
            (SPRING_ORIGINAL_TOPIC, _enc(o.topic)),
            (SPRING_ORIGINAL_PARTITION, struct.pack(">i", o.partition)),
            (SPRING_ORIGINAL_OFFSET, struct.pack(">q", o.offset)),
            (
                SPRING_ORIGINAL_TIMESTAMP,
                struct.pack(">q", _NO_TIMESTAMP if o.timestamp_ms is None else o.timestamp_ms),
            ),
            *self._dead,
        ]
        return (*user_headers(msg.headers), *own)


def retry_headers(msg: Message, group: str, decision: RetryDecision, now: float,
                  origin: Origin | None = None) -> Headers:
    """Headers for ``msg`` handed to a retry tier: user headers, then the failure so far.
    ``origin``: where the work began, when the caller knows more than ``origin_of(msg)``
    (the topic id, a redriven record's dead letter)."""
    return FailureHeaders(group, decision.next_attempt, decision.error_type,
                          decision.error_message).retry(msg, now, decision.due_at, origin)[0]


def dead_letter_headers(
    msg: Message, group: str, decision: DeadLetterDecision, now: float,
    origin: Origin | None = None,
) -> Headers:
    """Headers for ``msg`` handed to the DLQ: the failure, then Spring's DLT aliases."""
    return FailureHeaders(group, decision.attempts, decision.error_type,
                          decision.error_message).dead(msg, now, decision.reason, origin)


def redrive_headers(dead: Message) -> Headers:
    """Headers to replay a dead letter from scratch: attempt 1, with a link to the dead letter.

    The failure headers go, so the replay gets a fresh retry budget and, if it fails again,
    its own first failure; user headers (and the trace context) stay so the trace continues.
    ``kw-trace-previous`` (the span of the attempt that dead-lettered it) is kept on purpose,
    although it is ours: the replay's span links to that attempt, so a redrive days later
    still shows the attempts it follows (``kworkers.tracing``).
    """
    out: tuple[tuple[str, bytes], ...] = (
        *user_headers(dead.headers),
        (ATTEMPT, b"1"),
        (REDRIVE_OF, _enc(f"{dead.topic}/{dead.partition}/{dead.offset}")),
    )
    previous = last_value(dead.headers, TRACE_PREVIOUS) if dead.headers else None
    if previous is not None and len(previous) <= MAX_HEADER_VALUE:
        out = (*out, (TRACE_PREVIOUS, previous))
    return out
