"""Where a failed record may go, as the engine's hand-off sees it: the port between the router
(which decides, ``router.FailureRouter``) and the step that sends (``consumer.handoff``).

A ``Destination`` says only what a send's outcome means: the metric label, whether the record
counts as retried or dead-lettered, and whether a refusal for good falls back to the record's
own DLQ or leaves nothing to fall back to (the worker turns unhealthy). The engine asks it and
never names a concrete destination. Two are built in: ``RETRY`` (a tier) and ``DLQ``.

A destination a user adds (a parking topic for one kind of failure, ...) is one class, a
``Route``, and one registration: ``FailureRouter(..., routes=[ParkingRoute()])``. The router
consults its routes, in order, before the retry policy; the first naming a topic takes the
failure, which goes there with the dead-letter headers (``kw-dlq-reason`` the destination's
label), so the DLQ tools read and redrive it like a dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kworkers.message import Message


@dataclass(frozen=True, slots=True)
class Destination:
    """A kind of destination, by what the engine needs of it (one per kind, not per record)."""

    #: the metric label (``kworkers_handoff_failures_total{destination}``, "retry" or "dlq")
    label: str
    #: counted as a retry (``kworkers_retries_total`` by tier, the storm counters), else as a
    #: dead letter (``kworkers_dead_letters_total`` by error type)
    retried: bool
    #: a send refused for good re-routes the record to its own DLQ; False: there is nowhere
    #: left to go, the worker turns unhealthy and the record stays uncommitted
    falls_back: bool


RETRY = Destination("retry", retried=True, falls_back=True)
DLQ = Destination("dlq", retried=False, falls_back=False)


class Route(Protocol):
    """A user-added destination: which failures it takes, and to which topic."""

    @property
    def destination(self) -> Destination: ...

    def topic_for(self, msg: Message, exc: BaseException, source: str) -> str | None:
        """The topic ``msg``'s failure goes to, or None to leave it to the retry policy.
        ``source``: the topic whose tiers and DLQ the record belongs to."""
        ...
