"""The OpenTelemetry SDK set up to keep spans in memory, for tests that read them back."""

from __future__ import annotations

from typing import Any


def memory_tracing() -> tuple[Any, Any]:
    """(a tracer provider, its in-memory exporter); the calling test skips without the SDK
    (the ``otel`` extra). A provider of its own, never the global one: that can be set once."""
    import pytest

    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    return provider, exporter
