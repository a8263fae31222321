"""Which dead letters a redrive replays: a pure predicate, so the tool's choice is testable.

An operator fixes a bug or waits out an outage, then redrives the dead letters it caused,
typically one error type over one time window; this filter is that selection.
"""

from __future__ import annotations

from dataclasses import dataclass

from kworkers.dlq.record import DeadLetter
from kworkers.errors import ConfigError


@dataclass(frozen=True)
class RedriveFilter:
    """Criteria that all must hold; an unset one matches everything.

    ``since``/``until`` are a half-open window ``[since, until)`` on ``dead_lettered_at``
    (when it died is what an incident timeline gives), so consecutive windows never
    redrive a record twice. ``min_offset``/``max_offset`` are inclusive bounds on the
    *DLQ* offset, the position the redrive tool reads and can resume from.
    ``error_type`` and ``key`` match exactly.
    """

    error_type: str | None = None
    key: bytes | None = None
    since: float | None = None
    until: float | None = None
    min_offset: int | None = None
    max_offset: int | None = None

    def __post_init__(self) -> None:
        # An impossible filter silently matching nothing looks like "nothing to redrive".
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError(f"empty time window: since={self.since} >= until={self.until}")
        if self.min_offset is not None and self.min_offset < 0:
            raise ConfigError(f"min_offset must be >= 0, got {self.min_offset}")
        if (
            self.min_offset is not None
            and self.max_offset is not None
            and self.min_offset > self.max_offset
        ):
            raise ConfigError(
                f"empty offset range: min_offset={self.min_offset} > max_offset={self.max_offset}"
            )

    def matches(self, d: DeadLetter) -> bool:
        return (
            (self.error_type is None or d.error_type == self.error_type)
            and (self.key is None or d.key == self.key)
            and (self.since is None or d.dead_lettered_at >= self.since)
            and (self.until is None or d.dead_lettered_at < self.until)
            and (self.min_offset is None or d.dlq_offset >= self.min_offset)
            and (self.max_offset is None or d.dlq_offset <= self.max_offset)
        )
