"""A worker whose handler never returns for one record, run as an operator runs it:
``kworkers run tests.apps.hung_worker:worker`` with ``KWORKERS_BOOTSTRAP_SERVERS``,
``KWORKERS_TOPICS``, ``KWORKERS_GROUP_ID`` (and the bounds: ``KWORKERS_STALL_TIMEOUT``,
``KWORKERS_DRAIN_TIMEOUT``) set, no ``message_timeout``: the defaults.

The record whose value is ``hang`` blocks its handler for good in a socket read with no timeout
(the issue's case); every other record is appended to ``HUNG_WORKER_LEDGER`` (the handler
starts, read back by the test). ``HUNG_WORKER_CANARY=old-bound``: the rule before issue #43
(no deadline, no bound on a call), the canary the test keeps beside the fixed worker.
"""

from __future__ import annotations

import os
import socket

from kworkers import Message, Worker
from kworkers.consumer import settings as loop_settings
from kworkers.testing.ledger import Ledger

if os.environ.get("HUNG_WORKER_CANARY") == "old-bound":
    loop_settings.BOUND_WITHOUT_DEADLINE = False

LEDGER = Ledger(os.environ["HUNG_WORKER_LEDGER"]) if "HUNG_WORKER_LEDGER" in os.environ else None
#: the read that never returns: nobody ever writes to the other end
_QUIET, _KEEP = socket.socketpair()

worker = Worker(topics=["placeholder"], group_id="placeholder")


@worker.handler
def handle(msg: Message) -> None:
    if LEDGER is not None:
        LEDGER.delivered(f"{msg.partition}/{msg.offset}", msg)
    if msg.value == b"hang":
        _QUIET.recv(1)  # a socket read with no timeout: never returns
