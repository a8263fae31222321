"""The worker the leave benchmark SIGTERMs: ``kworkers run benchmarks.leave_app:worker`` with
``KWORKERS_*`` naming bootstrap, topic and group; a sync handler of ``LEAVE_HANDLER_MS`` (10 ms
by default) and default settings otherwise."""

from __future__ import annotations

import os
import time

from kworkers import Message, Worker

HANDLER_S = float(os.environ.get("LEAVE_HANDLER_MS", "10")) / 1000
worker = Worker(topics=["placeholder"], group_id="placeholder")


@worker.handler
def handle(msg: Message) -> None:
    time.sleep(HANDLER_S)
