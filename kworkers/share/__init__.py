"""Share mode: the same handlers on a Kafka share group (KIP-932, "queues for Kafka").

    worker = Worker("orders", "orders-workers", mode="share")

A share group lends records one by one to any number of members, so a pool can grow beyond the
partition count; in exchange there is no order, and every record carries a delivery count. What
each outcome does, what the preview client cannot do yet, and how to scale it: see
docs/SHARE_GROUPS.md. Retry tiers and the DLQ stay as in partitioned mode (the tiers are read by
the worker's ordinary retry loop).
"""

from kworkers.share.partition import delivery_count
from kworkers.share.rules import DeliveryLimitReached

__all__ = ["DeliveryLimitReached", "delivery_count"]
