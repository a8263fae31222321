"""Regression: the activity ids are the record's own headers and must survive every hop."""

from __future__ import annotations

from kworkers.envelope.envelope import ids_from_headers, ids_to_headers
from kworkers.message import Message
from kworkers.retry_tiers.headers import dead_letter_headers, redrive_headers, retry_headers
from kworkers.retry_tiers.policy import RetryPolicy, no_jitter
from kworkers.retry_tiers.routing import DeadLetterDecision, RetryDecision, route
from kworkers.retry_tiers.tiers import TierLadder


def test_ids_survive_retry_dlq_and_redrive() -> None:
    msg = Message("orders", 0, 7, b"k", b"v", (*ids_to_headers("wf-1", "charge"),
                                                 ("traceparent", b"00-abc")))
    decision = route(RetryPolicy(max_attempts=2), TierLadder(), "orders", 1,
                     RuntimeError("x"), 0.0, no_jitter)
    assert isinstance(decision, RetryDecision)
    hop = msg._replace(topic=decision.tier.topic,
                       headers=retry_headers(msg, "g", decision, 0.0), attempt=2)
    assert ids_from_headers(hop.headers) == ("wf-1", "charge")
    dead_decision = route(RetryPolicy(max_attempts=2), TierLadder(), "orders", 2,
                          RuntimeError("x"), 1.0, no_jitter)
    assert isinstance(dead_decision, DeadLetterDecision)
    dead = hop._replace(topic="orders.dlq",
                        headers=dead_letter_headers(hop, "g", dead_decision, 1.0))
    assert ids_from_headers(dead.headers) == ("wf-1", "charge")
    assert ids_from_headers(redrive_headers(dead)) == ("wf-1", "charge")
    assert dict(redrive_headers(dead))["traceparent"] == b"00-abc"
