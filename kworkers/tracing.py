"""W3C trace context on Kafka records, and a handler invoker that opens one span per attempt.

Which span is whose parent, and which are links (OpenTelemetry messaging conventions,
``docs/messaging/messaging-spans.md``: a "process" span SHOULD link to each message's creation
context and MAY take it as its parent for a single message, documented):

- **Parent**: the record's own ``traceparent`` (its creation context: the producer's span), read
  and never changed. Every attempt of one record (the first, each retry tier hop, a run after a
  redrive days later) is a child of that one span, so a record's whole life is one trace under
  the span that produced it, and a workflow step's record (whose ``traceparent`` is the span of
  the step before, ``kworkers.workflow.trace``) continues it. A batch's span takes its first
  record's. A record with no valid ``traceparent`` has no creation context: its first attempt
  starts a trace, and each later attempt is a child of the attempt before (see the link below),
  so kworkers keeps one trace without ever writing a ``traceparent`` of its own.
- **Links**: to the creation context of every record the span processes (the spec's SHOULD; for
  a single record the same span as the parent, which marks the edge as a message hand-over for
  tools that read links, as the spec's own "parent and link" example does; for a batch, the
  only tie to its other records' producers), attribute ``kworkers.link`` = ``creation``; and to
  **the attempt before**, for a retry or a redriven record, ``kworkers.link`` =
  ``previous_attempt`` (and ``kworkers.link.via``: the retry tier or the dead letter in
  between). A link, not a parent: the earlier attempt did not cause this one, the
  record did; a retry an hour later is a sibling that points back.
- **The attempt before** travels in kworkers' own header ``kw-trace-previous`` (a
  ``traceparent``-formatted value): when a handler raises, its span's context rides on the
  exception (``failure_headers``, as a schema id does) into the hand-off, which writes it on
  the tier or DLQ record; each hop replaces it (it is one of ``OWN_HEADERS``), and a redrive
  keeps it (``redrive_headers``), so a redriven run links to the attempt that dead-lettered
  the record. The user's ``traceparent`` and ``tracestate`` travel untouched as user headers.

Names and attributes follow the conventions' transition rule: by default the span is what
kworkers always emitted (``"{topic} process"``, the same attribute names), and only
``OTEL_SEMCONV_STABILITY_OPT_IN`` changes them: ``messaging`` emits the current conventions
(``"process {topic}"``, ``messaging.operation.name``, ``messaging.consumer.group.name``,
``error.type`` on failure, the offset only on a single record's span), ``messaging/dup`` both
(the new span name, as the spec asks for single-valued things). Links and the ``kworkers.*``
attributes (``kworkers.attempt``, ``kworkers.redrive_of``) are kworkers' own and are emitted in
every mode. The record key is not recorded (it may be personal data, and a binary key has no
canonical text).

OpenTelemetry is an optional extra (``pip install kworkers[otel]``). Without it ``traced_invoke``
just calls the handler: the same worker code runs with and without tracing installed.

Parsing follows W3C Trace Context level 1: ``version-traceid-parentid-flags`` in lowercase hex;
version ``ff``, an all-zero trace id or parent id, uppercase hex or a wrong length make the
header invalid; a version above ``00`` may carry more fields after a ``-``, which are ignored.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import secrets
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kworkers.activity import ActivityInvoker
from kworkers.consumer.ports import Handler, Invoker, Records
from kworkers.errors import BatchError, failure_type
from kworkers.message import Message
from kworkers.retry_tiers.headers import REDRIVE_OF, TRACE_PREVIOUS, last_value
from kworkers.topic_names import is_tier_topic

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace_id>[0-9a-f]{32})-(?P<span_id>[0-9a-f]{16})-"
    r"(?P<flags>[0-9a-f]{2})(?P<rest>.*)", re.DOTALL)
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
SAMPLED = 0x01


@dataclass(frozen=True)
class TraceParent:
    """A parsed ``traceparent``: which trace a record belongs to and the span that sent it."""

    trace_id: str
    span_id: str
    flags: int = SAMPLED
    version: int = 0

    def __post_init__(self) -> None:
        if not (re.fullmatch(r"[0-9a-f]{32}", self.trace_id) and self.trace_id != _ZERO_TRACE):
            raise ValueError(f"trace_id: 32 lowercase hex digits, not all zero: "
                             f"{self.trace_id!r}")
        if not (re.fullmatch(r"[0-9a-f]{16}", self.span_id) and self.span_id != _ZERO_SPAN):
            raise ValueError(f"span_id: 16 lowercase hex digits, not all zero: {self.span_id!r}")
        if not 0 <= self.flags <= 0xFF or not 0 <= self.version < 0xFF:
            raise ValueError(f"flags/version out of range: {self.flags}, {self.version}")

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def header(self) -> str:
        """The header value; always written as version 00, the only version defined."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def child(self, span_id: str | None = None) -> TraceParent:
        """The context a span of this trace passes on: same trace, its own span id."""
        return TraceParent(self.trace_id, span_id or new_span_id(), self.flags)


def parse_traceparent(value: str | bytes | None) -> TraceParent | None:
    """The trace context in a ``traceparent`` value, or None when absent or invalid."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    m = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if m is None:
        return None
    version = int(m["version"], 16)
    rest = m["rest"]
    if version == 0xFF or (version == 0 and rest) or (rest and not rest.startswith("-")):
        return None
    if m["trace_id"] == _ZERO_TRACE or m["span_id"] == _ZERO_SPAN:
        return None
    return TraceParent(m["trace_id"], m["span_id"], int(m["flags"], 16), version)


def new_trace_id() -> str:
    while True:
        tid = secrets.token_hex(16)
        if tid != _ZERO_TRACE:
            return tid


def new_span_id() -> str:
    while True:
        sid = secrets.token_hex(8)
        if sid != _ZERO_SPAN:
            return sid


def generate_traceparent(sampled: bool = True) -> TraceParent:
    """A new trace (for a producer that starts one, like the demo)."""
    return TraceParent(new_trace_id(), new_span_id(), SAMPLED if sampled else 0)


def trace_context_of(msg: Message) -> tuple[TraceParent | None, str | None]:
    """The record's (traceparent, tracestate). Several ``traceparent`` headers that disagree
    are invalid (as repeated HTTP headers would be); ``tracestate`` is only read when the
    ``traceparent`` is valid, as the spec requires."""
    values = {v for k, v in msg.headers if k == TRACEPARENT}
    if len(values) != 1:
        return None, None
    parent = parse_traceparent(values.pop())
    if parent is None:
        return None, None
    state = msg.header_str(TRACESTATE)
    return parent, (state if state else None)


def previous_attempt_of(msg: Message) -> TraceParent | None:
    """The span of the attempt before this one (``kw-trace-previous``), or None: a first
    attempt, a record handed off before kworkers wrote it, or a value that does not parse."""
    return parse_traceparent(last_value(msg.headers, TRACE_PREVIOUS)) if msg.headers else None


# ---------------------------------------------------------------------- conventions

#: the environment variable the conventions' transition plan names
OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"


@dataclass(frozen=True)
class Conventions:
    """Which messaging conventions a span carries: ``old``, what kworkers emitted before
    (the default), ``new``, the current ones; both under ``messaging/dup``."""

    old: bool = True
    new: bool = False

    def __post_init__(self) -> None:
        if not (self.old or self.new):
            raise ValueError("a span carries the old conventions, the new ones or both")

    @classmethod
    def from_opt_in(cls, value: str | None) -> Conventions:
        """From ``OTEL_SEMCONV_STABILITY_OPT_IN``'s value: a comma-separated list in which
        ``messaging/dup`` wins over ``messaging``; other categories' values are not ours."""
        tokens = {t.strip() for t in (value or "").split(",")}
        if "messaging/dup" in tokens:
            return cls(old=True, new=True)
        if "messaging" in tokens:
            return cls(old=False, new=True)
        return cls()

    @classmethod
    def from_env(cls) -> Conventions:
        return cls.from_opt_in(os.environ.get(OPT_IN_ENV))

    def span_name(self, destination: str) -> str:
        """The new name whenever the new conventions are on (``messaging/dup`` too: the
        spec wants the new value of a single-valued thing there)."""
        return f"process {destination}" if self.new else f"{destination} process"


LinkKind = Literal["creation", "previous_attempt"]
#: the attribute on each link saying what it points to
LINK_KIND = "kworkers.link"


#: the attribute on a ``previous_attempt`` link saying which hop lies between: the retry tier
#: the record waited in, or the dead letter a redrive replayed (``dlq/partition/offset``)
LINK_VIA = "kworkers.link.via"


@dataclass(frozen=True)
class SpanLink:
    """A link of a process span: the record's creation context, or the attempt before
    (``via``: the hop in between, when the record tells it)."""

    context: TraceParent
    kind: LinkKind
    via: str | None = None

    def attributes(self) -> dict[str, str]:
        got: dict[str, str] = {LINK_KIND: self.kind}
        if self.via is not None:
            got[LINK_VIA] = self.via
        return got


@dataclass(frozen=True)
class SpanPlan:
    """Everything one attempt's span is opened with, decided from the records alone."""

    name: str
    parent: TraceParent | None
    tracestate: str | None
    attributes: Mapping[str, str | int]
    links: tuple[SpanLink, ...]


def span_attributes(msg: Message, conventions: Conventions = Conventions(),
                    group: str | None = None, batch: int | None = None
                    ) -> dict[str, str | int]:
    """The attributes of one attempt's span over ``msg`` (a batch's first record, with
    ``batch`` its size). Old: the names kworkers always emitted; new: the current
    conventions' (``kafka.md``'s process span); kworkers' own in both."""
    attrs: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": msg.topic,
        "messaging.destination.partition.id": str(msg.partition),
    }
    if conventions.old or batch is None:  # new: the offset of a single record's span only
        attrs["messaging.kafka.offset"] = msg.offset
    if batch is not None:
        attrs["messaging.batch.message_count"] = batch
    if conventions.new:
        attrs["messaging.operation.name"] = "process"
        if group:
            attrs["messaging.consumer.group.name"] = group
    attrs["kworkers.attempt"] = msg.attempt
    redrive_of = msg.header_str(REDRIVE_OF) if msg.headers else None
    if redrive_of:
        attrs["kworkers.redrive_of"] = redrive_of
    return attrs


def plan_span(msg: Records, conventions: Conventions = Conventions(),
              group: str | None = None) -> SpanPlan:
    """The span of one attempt over ``msg`` (a record or a batch): the parent and link rule
    of the module docstring, in one place."""
    records = msg if isinstance(msg, list) else [msg]
    first = records[0]
    parent, state = trace_context_of(first)
    if parent is None:  # no creation context: kworkers' own trace of this record goes on
        parent = previous_attempt_of(first)
    links: list[SpanLink] = []
    for r in records:
        created, _ = trace_context_of(r)
        for link in (None if created is None else SpanLink(created, "creation"),
                     _previous_link(r)):
            if link is not None and link not in links:
                links.append(link)
    attrs = span_attributes(first, conventions, group,
                            len(records) if isinstance(msg, list) else None)
    return SpanPlan(conventions.span_name(first.topic), parent, state, attrs, tuple(links))


def _previous_link(msg: Message) -> SpanLink | None:
    before = previous_attempt_of(msg)
    if before is None:
        return None
    redrive_of = msg.header_str(REDRIVE_OF)
    via = f"dead letter {redrive_of}" if redrive_of else (
        f"retry tier {msg.topic}" if is_tier_topic(msg.topic) else None)
    return SpanLink(before, "previous_attempt", via)


# ---------------------------------------------------------------------- spans


class OpenSpan(Protocol):
    """What the invoker needs of a span while it is open."""

    @property
    def context(self) -> TraceParent | None:
        """The span's own context, None when it is not recorded (nothing to link to)."""

    def set_attribute(self, key: str, value: str | int) -> None: ...


class SpanStarter(Protocol):
    """Opens a span: the one seam between kworkers and a tracing library (tests pass a fake)."""

    def __call__(self, name: str, parent: TraceParent | None, tracestate: str | None,
                 attributes: Mapping[str, str | int], links: Sequence[SpanLink] = ()
                 ) -> AbstractContextManager[OpenSpan]: ...


def otel_span_starter(tracer_provider: Any = None) -> SpanStarter | None:
    """A ``SpanStarter`` backed by the OpenTelemetry API, or None when it is not installed.

    ``tracer_provider``: the provider to use (default: the global one the application set).

    The parent comes from the record's headers through OpenTelemetry's own W3C propagator, so
    the span joins the producer's trace whatever tracer provider the application set up.
    """
    try:
        trace: Any = importlib.import_module("opentelemetry.trace")
        tc: Any = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
    except ImportError:
        return None
    # without a provider argument this is a proxy until the app sets the global one: fine
    tracer = trace.get_tracer("kworkers", tracer_provider=tracer_provider)
    propagator = tc.TraceContextTextMapPropagator()
    consumer_kind = trace.SpanKind.CONSUMER

    def start(name: str, parent: TraceParent | None, tracestate: str | None,
              attributes: Mapping[str, str | int], links: Sequence[SpanLink] = ()
              ) -> AbstractContextManager[OpenSpan]:
        carrier: dict[str, str] = {}
        if parent is not None:
            carrier[TRACEPARENT] = parent.header()
            if tracestate:
                carrier[TRACESTATE] = tracestate
        # an empty carrier yields an empty context: a new root span, never the poll thread's
        ctx = propagator.extract(carrier, context=_empty_context())
        otel_links = [trace.Link(trace.SpanContext(int(k.context.trace_id, 16),
                                                   int(k.context.span_id, 16), is_remote=True,
                                                   trace_flags=trace.TraceFlags(
                                                       k.context.flags)),
                                 k.attributes()) for k in links]
        return _opened(tracer.start_as_current_span(
            name, context=ctx, kind=consumer_kind, attributes=dict(attributes),
            links=otel_links))

    return start


class _OtelSpan:
    """An OpenTelemetry span as an ``OpenSpan``."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    @property
    def context(self) -> TraceParent | None:
        # not recording: no SDK (the API's span carries the parent's ids) or not sampled
        if not self._span.is_recording():
            return None
        ctx = self._span.get_span_context()
        return TraceParent(format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"),
                           int(ctx.trace_flags))

    def set_attribute(self, key: str, value: str | int) -> None:
        self._span.set_attribute(key, value)


@contextmanager
def _opened(cm: AbstractContextManager[Any]) -> Iterator[OpenSpan]:
    with cm as span:  # an exception thrown in here reaches OpenTelemetry, which records it
        yield _OtelSpan(span)


def _empty_context() -> Any:
    context: Any = importlib.import_module("opentelemetry.context")
    return context.Context()


def mark_failed_attempt(exc: BaseException, span: TraceParent) -> None:
    """Hands the failed attempt's span to the hand-off: as a ``failure_headers`` entry on the
    exception (``retry_tiers.router.failure_headers``), which the tier or DLQ record carries
    as ``kw-trace-previous``. An exception that takes no attributes just loses the link."""
    got = tuple(getattr(exc, "failure_headers", ()) or ())
    kept = tuple((k, v) for k, v in got if k != TRACE_PREVIOUS)
    with suppress(AttributeError, TypeError):
        exc.failure_headers = (  # type: ignore[attr-defined]
            *kept, (TRACE_PREVIOUS, span.header().encode()))


class TracedInvoke:
    """An ``Invoker`` (see ``kworkers.consumer.ports``) that runs each attempt in its own span.

    It wraps another invoker (``inner``; None: call the handler directly), so tracing composes
    with the activity context: ``traced_invoke`` wraps a store-less ``ActivityInvoker``, what a
    ``Worker`` uses by default; a worker with an idempotency store passes
    ``TracedInvoke(inner=ActivityInvoker(store, ...))``. The span encloses the inner invoker,
    so a claim on the store is part of the attempt it belongs to.

    Sync handlers run inside the span; for an async handler the invoker returns a coroutine
    that opens the span, awaits the inner invoker's coroutine and closes it, so the span
    measures the attempt and not the time it waited for a slot. An exception leaves the span
    marked as failed (OpenTelemetry records it; ``error.type`` under the new conventions),
    carries the span to the hand-off (``mark_failed_attempt``) and goes on to the loop, which
    routes the record to a tier or the DLQ as usual.

    ``conventions``: None reads ``OTEL_SEMCONV_STABILITY_OPT_IN`` on first use. ``group``: the
    consumer group, for ``messaging.consumer.group.name`` (the worker binds its own, see
    ``in_group``).
    """

    def __init__(self, start_span: SpanStarter | None = None, *, inner: Invoker | None = None,
                 auto: bool = True, conventions: Conventions | None = None,
                 group: str | None = None) -> None:
        self._start = start_span
        self._resolved = start_span is not None or not auto
        self._inner = inner
        self._conventions = conventions
        self.group = group

    def in_group(self, group: str) -> TracedInvoke:
        """This invoker for the consumers of ``group`` (the same starter and conventions)."""
        bound = TracedInvoke(self._starter(), inner=self._inner, auto=False,
                             conventions=self._conventions, group=group)
        return bound

    def _starter(self) -> SpanStarter | None:
        if not self._resolved:  # resolved on first use: importing kworkers stays cheap
            self._start = otel_span_starter()
            self._resolved = True
        return self._start

    @property
    def conventions(self) -> Conventions:
        if self._conventions is None:
            self._conventions = Conventions.from_env()
        return self._conventions

    def _call(self, handler: Handler, msg: Records) -> Any:
        return handler(msg) if self._inner is None else self._inner(handler, msg)

    def __call__(self, handler: Handler, msg: Records) -> Any:
        start = self._starter()
        if start is None:
            return self._call(handler, msg)
        if inspect.iscoroutinefunction(handler):  # the loop's own test for an async handler
            return self._run_async(start, handler, msg)
        with self._span(start, msg) as span:
            try:
                return self._call(handler, msg)
            except BaseException as exc:
                self._failed(span, exc)
                raise

    async def _run_async(self, start: SpanStarter, handler: Handler, msg: Records) -> Any:
        with self._span(start, msg) as span:
            try:
                pending: Awaitable[Any] = self._call(handler, msg)
                return await pending
            except BaseException as exc:
                self._failed(span, exc)
                raise

    def _failed(self, span: OpenSpan, exc: BaseException) -> None:
        if self.conventions.new:
            span.set_attribute("error.type", failure_type(exc))
        own = span.context
        if own is not None:
            mark_failed_attempt(exc, own)
            if isinstance(exc, BatchError):  # its records are handed off with their own
                for each in exc.failures.values():
                    mark_failed_attempt(each, own)

    def _span(self, start: SpanStarter, msg: Records) -> AbstractContextManager[OpenSpan]:
        """One span per attempt (``plan_span``); a batch's span continues its first record's
        trace and links to every record's."""
        plan = plan_span(msg, self.conventions, self.group)
        return start(plan.name, plan.parent, plan.tracestate, plan.attributes, plan.links)


#: the invoker to pass as ``Worker(invoke=...)``: the Worker's default activity context, inside
#: an OpenTelemetry span per attempt when OpenTelemetry is installed (else no span at all)
traced_invoke = TracedInvoke(inner=ActivityInvoker())
