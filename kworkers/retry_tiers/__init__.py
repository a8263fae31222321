"""Retry tiers: where a failed record goes next, when it is due, and what its headers say.

Pure logic only (no broker I/O): the consumer loop joins these decisions to a producer.

- ``policy``: ``RetryPolicy``, ``backoff`` and full ``jitter``.
- ``tiers``: the ``TierLadder`` of ``<topic>.retry.<label>`` topics and ``<topic>.dlq``.
- ``routing``: ``route``, the one decision after a handler raises.
- ``headers``: the kw-* failure headers (and Spring DLT aliases), written and validated.
- ``delay``: ``DelayBuffer``, the bounded timer heap of a tier consumer.
- ``tier_record``: what a record read from a tier must satisfy before it runs.
- ``router``: ``FailureRouter``, a failed attempt to its destination and headers.
- ``destinations``: ``Destination``, what the engine asks of where a hand-off goes (``RETRY``,
  ``DLQ``), and ``Route``, a destination the code adds (``Worker(routes=...)``).

Sending a hand-off and what its outcome means is the engine's (``kworkers.consumer.handoff``).
"""

from kworkers.retry_tiers.delay import DelayBuffer
from kworkers.retry_tiers.destinations import DLQ, RETRY, Destination, Route
from kworkers.retry_tiers.headers import (
    MAX_HEADER_VALUE,
    FailureInfo,
    HeaderError,
    attempt_of,
    check_due,
    dead_letter_headers,
    due_at_of,
    failure_of,
    redrive_headers,
    retry_headers,
)
from kworkers.retry_tiers.policy import (
    JitterSource,
    RetryPolicy,
    SeededJitter,
    backoff,
    jitter,
    no_jitter,
)
from kworkers.retry_tiers.routing import (
    MAX_ERROR_MESSAGE,
    DeadLetterDecision,
    RetryDecision,
    route,
)
from kworkers.retry_tiers.tiers import Tier, TierLadder
from kworkers.topic_names import source_topic_of

__all__ = [
    "DLQ",
    "MAX_ERROR_MESSAGE",
    "MAX_HEADER_VALUE",
    "RETRY",
    "DeadLetterDecision",
    "DelayBuffer",
    "Destination",
    "FailureInfo",
    "HeaderError",
    "JitterSource",
    "RetryDecision",
    "RetryPolicy",
    "Route",
    "SeededJitter",
    "Tier",
    "TierLadder",
    "attempt_of",
    "backoff",
    "check_due",
    "dead_letter_headers",
    "due_at_of",
    "failure_of",
    "jitter",
    "no_jitter",
    "redrive_headers",
    "retry_headers",
    "route",
    "source_topic_of",
]
