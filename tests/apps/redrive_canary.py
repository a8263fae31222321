"""``kworkers`` with a deliberately broken redrive, for the fault test's canary:
``python -m tests.apps.redrive_canary dlq redrive ...`` is ``kworkers dlq redrive ...`` whose
redrive does not consult its ledger ``<dlq>.redriven`` when it starts (every dead letter looks
unreplayed), as a redrive that kept no ledger, or lost it, would. Its replays and markers are
still transactional: only the rerun after a crash goes wrong, replaying what the killed run had
committed. ``tests/faults/test_redrive_scale.py`` shows its exactly-once check failing on it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from kworkers.cli import run_cli
from kworkers.dlq import redrive
from kworkers.dlq.replayed import ReplayedOffsets
from kworkers.kafka.settings import ClientSettings


def _nothing_replayed(client: ClientSettings | str, dlq: str,
                      spans: Mapping[int, tuple[int, int]]) -> ReplayedOffsets:
    del client, dlq  # the ledger is not read
    return ReplayedOffsets(spans)


redrive.read_replayed = _nothing_replayed  # type: ignore[attr-defined]  # its seam

if __name__ == "__main__":
    sys.exit(run_cli(sys.argv[1:]))
