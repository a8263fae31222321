"""The trace context a workflow carries from step to step, so one trace shows the whole run.

Each activity record carries a W3C ``traceparent``. The next record's parent is the span that
ran this step when OpenTelemetry is installed and a span is current (the ``TracedInvoke``
around the handler opens one per attempt, as a child of the record's own ``traceparent``);
without OpenTelemetry it is the incoming context with a new span id, so the trace id still runs
through every step, retry and compensation and logs can be joined on it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kworkers.tracing import TraceParent, generate_traceparent

__all__ = ["current_span", "next_traceparent", "start_traceparent"]

_otel: Any = None
_looked = False


def current_span() -> TraceParent | None:
    """The current OpenTelemetry span's context, or None (not installed, or no live span)."""
    global _otel, _looked
    if not _looked:
        try:
            _otel = importlib.import_module("opentelemetry.trace")
        except ImportError:
            _otel = None
        _looked = True
    if _otel is None:
        return None
    ctx = _otel.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return TraceParent(format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"),
                       int(ctx.trace_flags))


SpanSource = Callable[[], TraceParent | None]


def start_traceparent(given: str | None, current: SpanSource = current_span) -> str:
    """The context a new run starts under: the caller's, the current span's, or a new trace."""
    if given:
        return given
    live = current()
    return (live or generate_traceparent()).header()


def next_traceparent(incoming: TraceParent | None, current: SpanSource = current_span) -> str:
    """The context of the record that hands a run to its next activity."""
    live = current()
    if live is not None:
        return live.header()
    if incoming is not None:
        return incoming.child().header()
    return generate_traceparent().header()
