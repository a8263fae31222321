"""The old name of the effects ledger, kept only until ``tests/integration/test_cli_run.py``
moves to ``kworkers.testing.ledger`` (use that module in new code).

It is honest now: ``apply_once`` appends a row every time (it used to ``INSERT OR IGNORE`` on a
unique key, which hid every duplicate), so a caller comparing ``effect_values()`` with what it
produced sees a second application.
"""

from __future__ import annotations

import os

from kworkers.message import Message
from kworkers.testing import ledger as _ledger


class Ledger:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._ledger = _ledger.Ledger(path)

    def delivered(self, value: str, topic: str, part: int, off: int, attempt: int) -> None:
        self._ledger.delivered(value, Message(topic, part, off, None, None, attempt=attempt))

    def apply_once(self, key: str, value: str) -> None:
        """Appends one application of ``key`` (the name is historical; nothing is ignored)."""
        del value
        self._ledger.apply(key)

    def counts(self) -> tuple[int, int]:
        return self._ledger.counts()

    def effect_values(self) -> list[str]:
        return self._ledger.effect_values()
