"""A worker for the supervision tests, run as ``kworkers run tests.apps.fault_worker:worker``
with ``KWORKERS_BOOTSTRAP_SERVERS``, ``KWORKERS_TOPICS`` and ``KWORKERS_GROUP_ID`` set.

Records steer it by value: ``slow`` sleeps 5 s (keeps the drain busy, so /healthz can be read
while the worker stops), ``crash`` raises a ``BaseException`` that no runner catches,
``kill-loop`` makes the retry loop's consumer raise, so that loop's thread dies.
"""

from __future__ import annotations

import os
import threading
import time
from typing import cast

from kworkers import Message, Worker
from kworkers.worker import ConsumerFactory
from tests.apps.adapters import KafkaConsumerAdapter, consumer_settings

BREAK_RETRY_LOOP = threading.Event()


class Crash(BaseException):
    """Escapes ``except Exception`` everywhere: a runner crash."""


class BreakableConsumer:
    """The real adapter; the retry group's poll raises once the test record asked for it."""

    def __init__(self, group: str) -> None:
        self.inner = KafkaConsumerAdapter(consumer_settings(
            os.environ["KWORKERS_BOOTSTRAP_SERVERS"], group))
        self.group = group

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        if BREAK_RETRY_LOOP.is_set() and self.group.endswith(".retry"):
            raise RuntimeError("injected: the retry loop's consumer broke")
        return self.inner.poll_batch(n, timeout)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


worker = Worker(topics=["placeholder"], group_id="placeholder", drain_timeout=20.0,
                consumer=cast(ConsumerFactory, BreakableConsumer))  # the rest by __getattr__


@worker.handler
def handle(msg: Message) -> None:
    if msg.value == b"slow":
        time.sleep(5)
    elif msg.value == b"crash":
        raise Crash("injected runner crash")
    elif msg.value == b"kill-loop":
        BREAK_RETRY_LOOP.set()
