"""The order saga and the two things it touches.

* The card is charged through a *payment provider*, an outside service: the call may repeat
  (a worker can die after it and before the checkpoint), so it carries the activity's
  idempotency key and the provider keeps one charge per key, as Stripe does with its
  ``Idempotency-Key`` header. Here the provider is a table in its own transaction.
* Stock lives in the store's database, so reserving and releasing it are written with
  ``ctx.apply_once``, in the step's checkpoint transaction: exactly once.

Input: ``{"sku": "book", "qty": 1, "cents": 1299, "card": "4242", "address": "..."}``. The card
``"declined"`` is refused (nothing to undo); the address ``"nowhere"`` makes every shipping
attempt fail, so the saga unwinds; the card ``"no-refunds"`` makes the refund fail for good
(the dead letter an operator redrives once the provider is fixed).
"""

from __future__ import annotations

import os
from typing import Any

from kworkers.errors import NonRetryableError, RetryableError
from kworkers.idempotency import open_store
from kworkers.idempotency.store import SqlConnection, TransactionalStore, check_identifier
from kworkers.workflow import Engine, StepContext, Workflow

TOPIC = "orders.activities"

order = Workflow("order")


def _sql(conn: SqlConnection, sql: str) -> str:
    return sql if type(conn).__module__.startswith("sqlite3") else sql.replace("?", "%s")


class PaymentProvider:
    """Stand-in for an outside payment API that honours idempotency keys: it logs every call
    (``<table>_calls``, append-only) and applies one payment per key (``<table>``)."""

    def __init__(self, store: TransactionalStore[Any], table: str) -> None:
        self.store = store
        self.table = check_identifier(table)

    def _once(self, key: str, order_id: str, kind: str, cents: int) -> None:
        with self.store.atomic() as conn:
            conn.execute(_sql(conn, f"INSERT INTO {self.table}_calls (idempotency_key, kind) "
                                    "VALUES (?, ?)"), (key, kind))
            conn.execute(_sql(conn, f"INSERT INTO {self.table} (idempotency_key, order_id, kind, "
                                    "cents) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"),
                         (key, order_id, kind, cents))

    def calls(self, kind: str) -> dict[str, int]:
        """Calls per idempotency key (a repeat is a call the provider absorbed)."""
        with self.store.atomic() as conn:
            rows = conn.execute(_sql(conn, f"SELECT idempotency_key, COUNT(*) FROM "
                                           f"{self.table}_calls WHERE kind = ? GROUP BY "
                                           "idempotency_key"), (kind,)).fetchall()
        return {str(k): int(n) for k, n in rows}

    def charge(self, key: str, order_id: str, cents: int, card: str) -> str:
        if card == "declined":
            raise NonRetryableError("CardDeclined", f"card refused for order {order_id}")
        self._once(key, order_id, "charge", cents)
        return key

    def refund(self, key: str, order_id: str, cents: int, card: str) -> None:
        if card == "no-refunds":
            raise NonRetryableError("RefundRejected", f"the provider refused to refund {order_id}")
        self._once(key, order_id, "refund", -cents)


class Shop:
    """The tables of one shop: stock, shipments and the provider's payments."""

    def __init__(self, store: TransactionalStore[Any], prefix: str = "shop") -> None:
        self.store = store
        self.prefix = check_identifier(prefix)
        self.payments = PaymentProvider(store, f"{prefix}_payments")
        with store.atomic() as conn:
            for stmt in (
                f"CREATE TABLE IF NOT EXISTS {prefix}_stock (sku TEXT PRIMARY KEY, "
                "available INTEGER NOT NULL, reserved INTEGER NOT NULL)",
                f"CREATE TABLE IF NOT EXISTS {prefix}_shipments (order_id TEXT PRIMARY KEY, "
                "address TEXT NOT NULL)",
                f"CREATE TABLE IF NOT EXISTS {prefix}_payments (idempotency_key TEXT PRIMARY "
                "KEY, order_id TEXT NOT NULL, kind TEXT NOT NULL, cents INTEGER NOT NULL)",
                f"CREATE TABLE IF NOT EXISTS {prefix}_payments_calls (idempotency_key TEXT NOT "
                "NULL, kind TEXT NOT NULL)",
            ):
                conn.execute(stmt, ())

    def restock(self, sku: str, available: int) -> None:
        with self.store.atomic() as conn:
            conn.execute(_sql(conn, f"INSERT INTO {self.prefix}_stock VALUES (?, ?, 0) ON "
                                    "CONFLICT (sku) DO UPDATE SET available = excluded.available,"
                                    " reserved = 0"), (sku, available))

    def stock(self, sku: str) -> tuple[int, int]:
        with self.store.atomic() as conn:
            row = conn.execute(_sql(conn, f"SELECT available, reserved FROM {self.prefix}_stock "
                                          "WHERE sku = ?"), (sku,)).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def payments_of(self, order_id: str) -> list[tuple[str, int]]:
        with self.store.atomic() as conn:
            rows = conn.execute(_sql(conn, f"SELECT kind, cents FROM {self.prefix}_payments "
                                           "WHERE order_id = ? ORDER BY kind"),
                                (order_id,)).fetchall()
        return [(str(k), int(c)) for k, c in rows]


_shops: dict[str, Shop] = {}


def shop_of(ctx: StepContext) -> Shop:
    """The shop a run belongs to (registered by ``make_engine``; the input names it)."""
    return _shops[str(ctx.input.get("shop", "shop"))]


def refund_card(ctx: StepContext) -> dict[str, Any]:
    shop, inp = shop_of(ctx), ctx.input
    charge = ctx.result("charge_card")
    shop.payments.refund(ctx.idempotency_key, ctx.workflow_id, charge["cents"], inp["card"])
    return {"refunded": charge["cents"]}


def release_stock(ctx: StepContext) -> None:
    shop, inp = shop_of(ctx), ctx.input
    ctx.apply_once(lambda conn: conn.execute(_sql(
        conn, f"UPDATE {shop.prefix}_stock SET available = available + ?, reserved = reserved - ? "
              "WHERE sku = ?"), (inp["qty"], inp["qty"], inp["sku"])))


@order.step(compensate=refund_card)
def charge_card(ctx: StepContext) -> dict[str, Any]:
    shop, inp = shop_of(ctx), ctx.input
    charge_id = shop.payments.charge(ctx.idempotency_key, ctx.workflow_id, inp["cents"],
                                     inp["card"])
    return {"charge_id": charge_id, "cents": inp["cents"]}


@order.step(compensate=release_stock)
def reserve_stock(ctx: StepContext) -> None:
    shop, inp = shop_of(ctx), ctx.input

    def reserve(conn: SqlConnection) -> None:
        cur = conn.execute(_sql(
            conn, f"UPDATE {shop.prefix}_stock SET available = available - ?, reserved = "
                  "reserved + ? WHERE sku = ? AND available >= ?"),
            (inp["qty"], inp["qty"], inp["sku"], inp["qty"]))
        if cur.rowcount != 1:
            raise NonRetryableError("OutOfStock", f"not {inp['qty']} of {inp['sku']!r} left")

    ctx.apply_once(reserve)


@order.step
def ship(ctx: StepContext) -> dict[str, Any]:
    shop, inp = shop_of(ctx), ctx.input
    if inp["address"] == "nowhere":
        raise RetryableError("CarrierUnavailable", "no carrier delivers to this address")
    ctx.apply_once(lambda conn: conn.execute(_sql(
        conn, f"INSERT INTO {shop.prefix}_shipments VALUES (?, ?)"),
        (ctx.workflow_id, inp["address"])))
    return {"carrier": "post", "address": inp["address"]}


def make_engine(store: TransactionalStore[Any], *, topic: str = TOPIC,
                tables: str = "kworkers_wf", shop: str = "shop", workflow: Workflow = order,
                **kw: Any) -> Engine:
    """The engine, with the shop ``shop`` its runs' input names (``{"shop": ...}``)."""
    _shops[shop] = Shop(store, shop)
    return Engine(store, [workflow], topic=topic, tables=tables, **kw)


def engine() -> Engine:
    store: Any = open_store(os.environ.get("KWORKERS_STORE_URL", "sqlite:///orders.db"))
    return make_engine(store)
