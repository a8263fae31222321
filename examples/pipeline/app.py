"""The pipeline workflow and its engine.

    download(doc)  read a document (a local file stands in for an HTTP fetch: external, so it
                   may run more than once; it has no effect to repeat)
    embed          a deterministic 64-dimension vector for the text (stand-in for a model)
    index          the vector into ``<tables>_index``, in the step's checkpoint transaction:
                   exactly once, whatever crashes

``engine()`` builds the engine from ``KWORKERS_STORE_URL`` (default ``sqlite:///pipeline.db``),
so ``kworkers workflow start examples.pipeline.app:engine pipeline --id d1 --input
'{"doc": "kafka.txt"}'`` works from the repository root.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from kworkers.errors import NonRetryableError
from kworkers.idempotency import open_store
from kworkers.idempotency.store import SqlConnection, TransactionalStore, check_identifier
from kworkers.workflow import Engine, StepContext, Workflow

DATA_DIR = Path(__file__).resolve().parent / "data"
DIMS = 64
TOPIC = "pipeline.activities"

pipeline = Workflow("pipeline")


def embed_text(text: str, dims: int = DIMS) -> list[float]:
    """A hashed bag of words, L2-normalised: texts that share words point the same way."""
    vec = [0.0] * dims
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        h = hashlib.sha256(word.encode()).digest()
        vec[h[0] % dims] += 1.0 if h[1] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [round(x / norm, 6) for x in vec]


def _sql(conn: SqlConnection, sql: str) -> str:
    """SQLite's ``?`` or psycopg's ``%s``, for the connection a step is given."""
    return sql if type(conn).__module__.startswith("sqlite3") else sql.replace("?", "%s")


def index_table(ctx: StepContext) -> str:
    """The table to index into (tests give each run of theirs a table of its own)."""
    return check_identifier(str(ctx.input.get("index_table", "pipeline_index")))


@pipeline.step
def download(ctx: StepContext) -> dict[str, Any]:
    name = str(ctx.input["doc"])
    path = (DATA_DIR / name).resolve()
    if path.parent != DATA_DIR or not path.is_file():
        raise NonRetryableError("NoSuchDocument", f"{name!r} is not a document in {DATA_DIR}")
    text = path.read_text("utf-8")
    return {"doc": name, "text": text, "sha256": hashlib.sha256(text.encode()).hexdigest()}


@pipeline.step
def embed(ctx: StepContext) -> dict[str, Any]:
    return {"vector": embed_text(ctx.result("download")["text"])}


@pipeline.step
def index(ctx: StepContext) -> dict[str, Any]:
    doc = ctx.result("download")["doc"]
    vector = json.dumps(ctx.result("embed")["vector"])
    table = index_table(ctx)

    def write(conn: SqlConnection) -> None:
        conn.execute(_sql(conn, f"INSERT INTO {table} (run, doc, vector) VALUES (?, ?, ?)"),
                     (ctx.workflow_id, doc, vector))

    ctx.apply_once(write)
    return {"indexed": doc}


def make_engine(store: TransactionalStore[Any], *, topic: str = TOPIC,
                tables: str = "kworkers_wf", index: str = "pipeline_index",
                workflow: Workflow = pipeline, **kw: Any) -> Engine:
    """The engine, and the index table its runs write (``start`` input names it)."""
    check_identifier(index)
    with store.atomic() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {index} (run TEXT PRIMARY KEY, doc TEXT NOT "
                     "NULL, vector TEXT NOT NULL)", ())
    return Engine(store, [workflow], topic=topic, tables=tables, **kw)


def engine() -> Engine:
    store: Any = open_store(os.environ.get("KWORKERS_STORE_URL", "sqlite:///pipeline.db"))
    return make_engine(store)


def search(store: TransactionalStore[Any], query: str, k: int = 3,
           index: str = "pipeline_index") -> list[tuple[str, float]]:
    """The ``k`` indexed documents closest to ``query`` (cosine), best first."""
    q = embed_text(query)
    with store.atomic() as conn:
        rows = conn.execute(f"SELECT doc, vector FROM {index}", ()).fetchall()
    scored = {str(doc): sum(a * b for a, b in zip(q, json.loads(vec), strict=True))
              for doc, vec in rows}
    return sorted(scored.items(), key=lambda kv: -kv[1])[:k]
