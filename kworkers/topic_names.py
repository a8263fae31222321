"""Every topic and group name kworkers derives, built and read back in this one module.

    <topic>.retry.<label>   a retry tier of source topic <topic> (label: 500ms, 1s, 2m, 1h)
    <topic>.dlq             its dead-letter topic
    <dlq>.redriven          the redrive ledger of a DLQ
    <dlq>.audit             who redrove it, when, what and with what result
    <group>.retry           the consumer group of a worker's retry tiers

Names derive from the source topic (or group) alone, so any worker, ``kworkers lag`` and the
redrive tool find them without shared state. A tier's label is its delay in the longest unit
that is exact, so it parses back (``1500ms``, not ``1.5s``).
"""

from __future__ import annotations

import re

from kworkers.errors import ConfigError

MAX_TOPIC = 249  # Kafka's limit on a topic name
TIER_INFIX = ".retry."
DLQ_SUFFIX = ".dlq"
LEDGER_SUFFIX = ".redriven"
AUDIT_SUFFIX = ".audit"
RETRY_GROUP_SUFFIX = ".retry"

_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
# (unit, milliseconds) from the longest: the label uses the longest unit that is exact.
_UNITS = (("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1))
_TIER_NAME = re.compile(r"^(?P<source>.+)\.retry\.(?P<n>[0-9]+)(?P<unit>ms|s|m|h)$")
_DLQ_NAME = re.compile(r"^(?P<source>.+)\.dlq$")


def whole_ms(delay: float) -> int | None:
    """``delay`` seconds in whole milliseconds, or None when it is not a whole number of them."""
    ms = round(delay * 1000)
    return ms if abs(delay * 1000 - ms) < 1e-6 else None


def tier_label(delay: float) -> str:
    """``0.5`` -> ``500ms``, ``120`` -> ``2m``: the delay in the longest exact unit."""
    ms = whole_ms(delay)
    if ms is None or ms <= 0:  # a ladder validates delays; this guards direct callers
        raise ConfigError(f"no exact label for a delay of {delay!r} s")
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise AssertionError("unreachable: every whole ms has a label")  # pragma: no cover


def tier_topic(source: str, label: str) -> str:
    return f"{source}{TIER_INFIX}{label}"


def dlq_topic(source: str) -> str:
    return f"{source}{DLQ_SUFFIX}"


def ledger_topic(dlq: str) -> str:
    """Where a redrive writes down what it replayed: ``<dlq>.redriven``."""
    return f"{dlq}{LEDGER_SUFFIX}"


def audit_topic(dlq: str) -> str:
    """Where every redrive of a DLQ writes who started it and how it ended: ``<dlq>.audit``."""
    return f"{dlq}{AUDIT_SUFFIX}"


def retry_group(group: str) -> str:
    """Tier topics have a group of their own, so waiting retries never count as main lag."""
    return f"{group}{RETRY_GROUP_SUFFIX}"


def is_derived(name: str) -> bool:
    """Whether ``name`` reads as a retry tier or a DLQ (so it cannot be a source topic)."""
    return TIER_INFIX in name or name.endswith(DLQ_SUFFIX)


def is_tier_topic(name: str) -> bool:
    return _TIER_NAME.match(name) is not None and not name.endswith(DLQ_SUFFIX)


def source_topic_of(name: str) -> str:
    """The source topic a tier or DLQ topic belongs to; any other name is its own source."""
    m = _DLQ_NAME.match(name)
    if m:
        name = m["source"]
    m = _TIER_NAME.match(name)
    return m["source"] if m else name


def topic_order(name: str) -> tuple[str, int, int, str]:
    """A sort key that shows a pipeline as it runs: each source, then its tiers from the
    shortest delay (``1s`` before ``10m``, which text order reverses), then its DLQ."""
    if name.endswith(DLQ_SUFFIX):
        return (source_topic_of(name), 2, 0, name)
    m = _TIER_NAME.match(name)
    if m is None:
        return (name, 0, 0, name)
    ms = int(m["n"]) * dict(_UNITS)[m["unit"]]
    return (m["source"], 1, ms, name)


def is_legal_topic(name: str) -> bool:
    return len(name) <= MAX_TOPIC and _LEGAL_TOPIC.fullmatch(name) is not None


def dlq_source(name: str) -> str | None:
    """The source topic whose DLQ ``name`` is (``<source>.dlq``); None for any other name.

    Strict where ``source_topic_of`` is lenient: the source must be a legal topic name that is
    not itself a tier or a DLQ, because it is where a redrive writes by default.
    """
    m = _DLQ_NAME.match(name)
    if m is None or not is_legal_topic(name):
        return None
    source = m["source"]
    return None if is_derived(source) else source


def check_dlq(name: str) -> str:
    """The source of DLQ ``name``; ``ConfigError`` (one line, naming the DLQ to use) for a
    topic that is not one.

    What the DLQ commands and the redrive accept: reading a retry tier or a source topic as
    dead letters shows nothing true, and a redrive of one would replay records that are not
    dead (and leave a ledger topic named after it behind).
    """
    if dlq_source(name) is not None:
        return name[: -len(DLQ_SUFFIX)]
    shown = name[:MAX_TOPIC]
    if is_tier_topic(name):
        source = source_topic_of(name)
        raise ConfigError(f"{shown!r} is a retry tier of {source!r}, not a DLQ; its DLQ is "
                          f"{dlq_topic(source)!r}")
    for suffix, what in ((LEDGER_SUFFIX, "a redrive ledger"), (AUDIT_SUFFIX, "a redrive audit")):
        if name.endswith(suffix) and dlq_source(name[: -len(suffix)]) is not None:
            raise ConfigError(f"{shown!r} is {what}, not a DLQ; its DLQ is "
                              f"{name[: -len(suffix)]!r}")
    if is_legal_topic(name) and not is_derived(name):
        raise ConfigError(f"{shown!r} is not a DLQ (a DLQ is named <source>.dlq); the DLQ of "
                          f"{shown!r} is {dlq_topic(name)!r}")
    raise ConfigError(f"{shown!r} is not a DLQ: a DLQ is named <source>.dlq, after a source "
                      "topic that is not itself a tier or a DLQ")


def check_source_topic(topic: str, longest_suffix: int) -> None:
    """A legal topic name whose derived names (``longest_suffix`` more characters) fit.

    Fails at configuration, not at the first failure in production when the produce is refused.
    """
    if not _LEGAL_TOPIC.fullmatch(topic):
        raise ConfigError(f"not a legal Kafka topic name: {topic[:MAX_TOPIC]!r}")
    if len(topic) + longest_suffix > MAX_TOPIC:
        raise ConfigError(
            f"topic {topic[:64]!r}... is too long: its retry topics would exceed {MAX_TOPIC} chars"
        )
