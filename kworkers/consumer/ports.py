"""The seams of the consumer core: what it needs from a consumer, and how a handler is called.

Kept apart from the parts that use them so a test double, the Kafka adapter and the processor
all import one small module, and so the vocabulary (``TP``, ``Outcome``, ``Completion``) is
defined once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kworkers.message import Message

if TYPE_CHECKING:
    from kworkers.consumer.partition import PartitionState

TP = tuple[str, int]
Handler = Callable[..., Any]
#: what a handler is called with: one record, or a batch of them (a batch handler)
Records = Message | list[Message]
#: what became of one record: handled, handed to a retry tier, or dead-lettered
Outcome = Literal["ok", "retry", "dlq"]
#: a runner's report to the poll thread: (partition state it was dispatched under, completed
#: offsets, of which retried, of which dead-lettered, handler seconds). A tuple, not a
#: dataclass: one is built per reported batch on the hot path.
Completion = tuple["PartitionState", list[int], int, int, float]
RebalanceCallback = Callable[[list[TP]], None]


class ConsumerPort(Protocol):
    """What the processor needs from a consumer (``KafkaConsumerAdapter`` in production)."""

    group: str

    def subscribe(self, topics: Iterable[str], on_assign: RebalanceCallback,
                  on_revoke: RebalanceCallback, on_lost: RebalanceCallback) -> None: ...
    def poll_batch(self, n: int, timeout: float) -> list[Message]: ...
    def commit(self, positions: dict[TP, int]) -> None: ...
    def pause(self, tps: list[TP]) -> None: ...
    def resume(self, tps: list[TP]) -> None: ...
    def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
        """(low, high) offsets; with ``timeout`` 0 only what the client has cached (raises
        when nothing is)."""
        ...
    def close(self) -> None: ...
    def is_retryable(self, exc: BaseException) -> bool: ...
    def is_rebalancing(self, exc: BaseException) -> bool:
        """A commit refused because the group is rebalancing (see ``commit``)."""
        ...


class Invoker(Protocol):
    """Runs a handler for one record, or a batch handler for a batch (the activity context
    wraps it; see ``kworkers.activity``)."""

    def __call__(self, handler: Handler, msg: Records) -> Any: ...


def plain_invoke(handler: Handler, msg: Records) -> Any:
    return handler(msg)
