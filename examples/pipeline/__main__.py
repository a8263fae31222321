"""``python -m examples.pipeline demo|worker``: run the pipeline against a real broker.

    python -m examples.pipeline demo --bootstrap 127.0.0.1:9092 --store sqlite:///pipeline.db
    python -m examples.pipeline worker --bootstrap ... --store ...   # one replica; run several

``demo`` creates the topics, runs one worker in this process, starts one run per document in
``data/``, waits until every run is completed and prints the runs and a search over the index.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import click

from examples.pipeline.app import DATA_DIR, TOPIC, make_engine, search
from kworkers.idempotency import open_store
from kworkers.workflow import Engine

SETTINGS: dict[str, Any] = {
    "consumer_config": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
}


def build(store_url: str, tables: str, topic: str, index: str) -> Engine:
    store: Any = open_store(store_url)
    return make_engine(store, topic=topic, tables=tables, index=index, relay_idle_s=0.2)


@click.group()
def cli() -> None:
    """The download -> embed -> index pipeline on kworkers workflows."""


def _common(f: Any) -> Any:
    for opt in (
        click.option("--bootstrap", "-b", default="127.0.0.1:9092", show_default=True),
        click.option("--store", "store_url", default="sqlite:///pipeline.db", show_default=True,
                     envvar="KWORKERS_STORE_URL"),
        click.option("--tables", default="kworkers_wf", show_default=True),
        click.option("--topic", default=TOPIC, show_default=True),
        click.option("--index", default="pipeline_index", show_default=True),
        click.option("--group", default="pipeline", show_default=True),
    ):
        f = opt(f)
    return f


@cli.command()
@_common
def worker(bootstrap: str, store_url: str, tables: str, topic: str, index: str,
           group: str) -> None:
    """Run one worker replica until SIGTERM."""
    engine = build(store_url, tables, topic, index)
    w = engine.worker(group, bootstrap, **SETTINGS)
    engine.create_topics(w, partitions=6)
    engine.run(w)


@cli.command()
@_common
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for the runs.")
def demo(bootstrap: str, store_url: str, tables: str, topic: str, index: str, group: str,
         timeout: float) -> None:
    """Run every document through the pipeline with one in-process worker."""
    engine = build(store_url, tables, topic, index)
    w = engine.worker(group, bootstrap, **SETTINGS)
    engine.create_topics(w, partitions=6)
    t = threading.Thread(target=engine.run, args=(w,), kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    docs = sorted(p.name for p in DATA_DIR.glob("*.txt"))
    try:
        for doc in docs:
            engine.start("pipeline", f"{tables}-{doc}", {"doc": doc, "index_table": index})
        deadline = time.monotonic() + timeout
        while True:
            runs = [engine.tables.run(f"{tables}-{doc}") for doc in docs]
            if all(r is not None and r.status == "completed" for r in runs):
                break
            if time.monotonic() > deadline:
                raise click.ClickException("runs not completed in time: " + ", ".join(
                    f"{r.workflow_id}={r.status}" for r in runs if r is not None))
            time.sleep(0.1)
    finally:
        w.stop()
        t.join(60)
    for r in runs:
        assert r is not None
        click.echo(f"{r.workflow_id}: {r.status}")
    for query in ("refund the card and release the stock", "consumer groups and partitions"):
        best = search(engine.store, query, index=index)
        click.echo(f"search {query!r}: " + ", ".join(f"{d} ({s:.2f})" for d, s in best))


if __name__ == "__main__":
    sys.exit(cli())
