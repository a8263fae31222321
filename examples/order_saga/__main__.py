"""``python -m examples.order_saga demo``: four orders through the saga on a real broker.

    python -m examples.order_saga demo --bootstrap 127.0.0.1:9092 --store sqlite:///orders.db

One ships, one is declined (nothing to undo), one cannot be shipped (stock released, card
refunded), one cannot be shipped and cannot be refunded either (its refund is dead-lettered with
the workflow id and the run is ``failed``; ``kworkers dlq redrive`` retries it once fixed).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import click

from examples.order_saga.app import TOPIC, make_engine
from kworkers.idempotency import open_store
from kworkers.retry_tiers import RetryPolicy, TierLadder

ORDERS: dict[str, dict[str, Any]] = {
    "ships": {"card": "4242", "address": "1 Main St"},
    "declined": {"card": "declined", "address": "1 Main St"},
    "unshippable": {"card": "4242", "address": "nowhere"},
    "unrefundable": {"card": "no-refunds", "address": "nowhere"},
}
END = {"ships": "completed", "declined": "compensated", "unshippable": "compensated",
       "unrefundable": "failed"}


@click.group()
def cli() -> None:
    """The order saga on kworkers workflows."""


@cli.command()
@click.option("--bootstrap", "-b", default="127.0.0.1:9092", show_default=True)
@click.option("--store", "store_url", default="sqlite:///orders.db", show_default=True,
              envvar="KWORKERS_STORE_URL")
@click.option("--tables", default="kworkers_wf", show_default=True)
@click.option("--shop", default="shop", show_default=True)
@click.option("--topic", default=TOPIC, show_default=True)
@click.option("--group", default="orders", show_default=True)
@click.option("--timeout", default=120.0, show_default=True)
def demo(bootstrap: str, store_url: str, tables: str, shop: str, topic: str, group: str,
         timeout: float) -> None:
    """Four orders, four endings."""
    store: Any = open_store(store_url)
    engine = make_engine(store, topic=topic, tables=tables, shop=shop, relay_idle_s=0.2)
    from examples.order_saga.app import _shops

    _shops[shop].restock("book", 10)
    w = engine.worker(group, bootstrap, retry=RetryPolicy(initial=0.2, max_interval=0.5,
                                                          max_attempts=3),
                      tiers=TierLadder((0.25, 0.5)),
                      consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    engine.create_topics(w, partitions=3)
    t = threading.Thread(target=engine.run, args=(w,), kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    ids = {name: f"{tables}-{name}" for name in ORDERS}
    try:
        for name, o in ORDERS.items():
            engine.start("order", ids[name], {"sku": "book", "qty": 1, "cents": 1299,
                                              "shop": shop, **o})
        deadline = time.monotonic() + timeout
        while True:
            runs = {n: engine.tables.run(i) for n, i in ids.items()}
            if all(r is not None and r.status == END[n] for n, r in runs.items()):
                break
            if time.monotonic() > deadline:
                raise click.ClickException("orders not settled in time: " + ", ".join(
                    f"{n}={r.status if r else None}" for n, r in runs.items()))
            time.sleep(0.1)
    finally:
        w.stop()
        t.join(60)
    s = _shops[shop]
    for name, r in runs.items():
        assert r is not None
        why = r.state.error or r.state.cause or ""
        click.echo(f"{name}: {r.status}; payments {s.payments_of(ids[name])}"
                   + (f"; {why}" if why else ""))
    click.echo(f"stock of book (available, reserved): {s.stock('book')}")


if __name__ == "__main__":
    sys.exit(cli())
