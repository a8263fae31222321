"""The seams of the consumer core: what it needs from a consumer, and how a handler is called.

Kept apart from the parts that use them so a test double, the Kafka adapter and the processor
all import one small module, and so the vocabulary (``TP``, ``Outcome``, ``Completion``) is
defined once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from kworkers.message import Headers, Message

if TYPE_CHECKING:
    from kworkers.consumer.partition import Partition

TP = tuple[str, int]
Handler = Callable[..., Any]
#: what a handler is called with: one record, or a batch of them (a batch handler)
Records = Message | list[Message]
#: what became of one record: handled, handed to a retry tier, or dead-lettered
Outcome = Literal["ok", "retry", "dlq"]


class Completion(NamedTuple):
    """A runner's report to the poll thread. A ``NamedTuple`` (read by position where it is
    unpacked): one is built per reported batch, not per record, measured at 0.004-0.03 per
    record on a no-op handler (1 and 8 partitions), so its 0.36 us over a plain tuple is
    below noise."""

    #: the partition state it was dispatched under (a revoked one's report is fenced)
    part: Partition
    #: the offsets completed
    offsets: list[int]
    #: of which handed to a retry tier
    retried: int
    #: of which dead-lettered
    dead: int
    #: handler seconds
    seconds: float
    #: records whose handler ran in those seconds (failed ones included)
    calls: int
RebalanceCallback = Callable[[list[TP]], None]
#: one commit's outcome as the client reports it: the offsets it committed, and the error
#: (None: committed)
CommitReport = tuple[dict[TP, int], BaseException | None]


class ConsumerPort(Protocol):
    """What the processor needs from a consumer (``KafkaConsumerAdapter`` in production)."""

    group: str

    def subscribe(self, topics: Iterable[str], on_assign: RebalanceCallback,
                  on_revoke: RebalanceCallback, on_lost: RebalanceCallback) -> None:
        """``on_assign`` runs once the partitions are in the client's assignment, so that
        ``pause``/``resume`` inside it act on them."""
        ...
    def poll_batch(self, n: int, timeout: float) -> list[Message]: ...
    def commit_async(self, positions: dict[TP, int]) -> None:
        """Sends a commit; its outcome comes back through ``commit_results`` (served by a later
        poll), never by blocking here."""
        ...
    def commit_results(self) -> list[CommitReport]:
        """The commit outcomes reported since the last call: (offsets committed, error)."""
        ...
    def coordinator_contact(self) -> float | None:
        """When (monotonic) the group coordinator was last heard from; None: not yet."""
        ...
    def session_timeout(self) -> float | None:
        """The member's session timeout when the client decides it (the classic protocol);
        None when the broker does (KIP-848: ``group.consumer.session.timeout.ms``)."""
        ...
    def pause(self, tps: list[TP]) -> None: ...
    def resume(self, tps: list[TP]) -> None: ...
    def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
        """(low, high) offsets; with ``timeout`` 0 only what the client has cached (raises
        when nothing is)."""
        ...
    def caught_up(self, tp: TP) -> bool:
        """The client read to the end of ``tp``'s log and knows of nothing newer (from what it
        has cached: its end-of-partition events and watermarks); False when unsure. What a
        hold asks (``backpressure``): such a partition does not want the next poll."""
        ...
    def position(self, tps: list[TP]) -> dict[TP, int | None]:
        """The client's positions: one past the last record *or transaction marker* it read
        (None: nothing read yet); local, no broker round trip. Like every call here, for the
        poll thread only: confluent-kafka admits one thread into a consumer at a time."""
        ...
    def group_metadata(self) -> object:
        """The member's group metadata (generation, member id): what a transaction's offsets
        are committed under, so the coordinator refuses them from a member that lost its
        partitions (KIP-447)."""
        ...
    def close(self) -> None: ...
    def is_retryable(self, exc: BaseException) -> bool: ...
    def is_rebalancing(self, exc: BaseException) -> bool:
        """A commit refused because the group is rebalancing (see ``commit``)."""
        ...


#: how a ``Sender`` reports one record's fate: None once the broker acknowledged it, else why
#: not; called exactly once, on whichever thread serves the sender's delivery reports
Delivered = Callable[[BaseException | None], None]


class Sender(Protocol):
    """Produces one record for the hand-off step and reports its fate to ``done``
    (``kworkers.kafka.producer.KafkaSender`` in production).

    A callback rather than a ``Future``: a failure storm hands off every record, and a future
    (its condition variable, its callback list, the lock taken to resolve it) cost more than
    the rest of a delivery report's path together. ``settle`` makes a future of it for a
    caller that waits."""

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None: ...


def settle(fut: Future[None]) -> Delivered:
    """A ``done`` for ``Sender.send`` that resolves ``fut`` (for a caller that waits)."""

    def done(err: BaseException | None) -> None:
        if err is None:
            fut.set_result(None)
        else:
            fut.set_exception(err)

    return done


class TransactionPort(Protocol):
    """One transactional producer of a poll loop, as the exactly-once committer drives it
    (``kworkers.kafka.transactions.LoopTransactions`` in production), from one thread of its
    own. Calls raise ``TransactionAborted`` (abort, and nothing of it is visible) or
    ``TransactionFailed`` (the outcome is unknown until ``renew``)."""

    def init(self, timeout: float) -> None: ...
    def begin(self) -> None: ...
    def produce(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers,
                on_error: Callable[[BaseException], None]) -> None:
        """Adds a record to the open transaction; a refusal, now or in its delivery report,
        goes to ``on_error`` (and the transaction must then be aborted)."""
        ...
    def send_offsets(self, positions: dict[TP, int], group_metadata: object,
                     timeout: float) -> None: ...
    def commit(self, timeout: float) -> None: ...
    def abort(self, timeout: float) -> None: ...
    def renew(self, timeout: float) -> None:
        """A new producer under the same transactional id: it fences the old one and ends the
        transaction that one left open (committing what was committed, aborting the rest)."""
        ...
    def committed(self, group: str, tps: list[TP], timeout: float) -> dict[TP, int | None]:
        """The group's committed offsets, read once no transaction is pending on them."""
        ...
    def classify(self, exc: BaseException) -> SendErrorKind: ...
    def missing(self, topics: list[str], timeout: float) -> dict[str, str]:
        """Those of ``topics`` the broker says do not exist, each with the broker's reason."""
        ...
    def close(self) -> None: ...


#: what a refused send means to the hand-off step (``consumer.handoff``): retry in place, the
#: destination is missing (retried a few times, then the own DLQ), or refused for good
SendErrorKind = Literal["transient", "missing", "permanent"]


class Invoker(Protocol):
    """Runs a handler for one record, or a batch handler for a batch (the activity context
    wraps it; see ``kworkers.activity``)."""

    def __call__(self, handler: Handler, msg: Records) -> Any: ...


def plain_invoke(handler: Handler, msg: Records) -> Any:
    return handler(msg)
