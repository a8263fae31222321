"""The pure lease decisions every backend shares, checked for their invariants at volume."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kworkers.idempotency as pkg
from kworkers.errors import FencedError
from kworkers.idempotency.store import (
    ClaimState,
    LeaseRow,
    decide_claim,
    decide_complete,
    decide_heartbeat,
    decide_release,
)

OWNERS = ["a", "b", "c"]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.sampled_from(OWNERS), st.sampled_from([0.5, 2.0, 5.0])),
        st.tuples(st.just("advance"), st.floats(0, 6, allow_nan=False)),
        st.tuples(st.just("heartbeat"), st.integers(-1, 1), st.sampled_from([None, b"d", b""])),
        st.tuples(st.just("complete"), st.integers(-1, 1)),
        st.tuples(st.just("release"), st.integers(-1, 1)),
    ),
    max_size=40,
)


@settings(max_examples=2000)
@given(ops=ops)
def test_lease_invariants(ops: list[Any]) -> None:
    """Tokens never go back; done is terminal; two owners never both hold a live lease; a
    takeover always carries the last details."""
    key, now = "w/a", 0.0
    row: LeaseRow | None = None
    holder: tuple[str, int, float] | None = None  # (owner, token, lease_until) of a live holder
    last_details: bytes | None = None
    for o in ops:
        before = row
        if o[0] == "advance":
            now += o[1]
            continue
        token = (row.token if row else 1) + (o[1] if o[0] != "claim" else 0)
        try:
            if o[0] == "claim":
                claim, new = decide_claim(row, key, o[1], o[2], now)
                row = new or row
                if claim.state is ClaimState.ACQUIRED:
                    if holder is not None and holder[0] != o[1] and holder[2] > now:
                        raise AssertionError(f"{o[1]} acquired while {holder} is live")
                    assert claim.details == last_details
                    assert claim.takeover == (
                        before is not None and before.owner not in (None, o[1])
                    )
                    assert claim.expired == (claim.takeover and before is not None
                                             and before.status == "leased")
                    holder = (o[1], claim.token, claim.lease_until)
                elif claim.state is ClaimState.BUSY:
                    assert holder is not None and holder[0] != o[1] and holder[2] > now
                else:
                    assert before is not None and before.status == "done"
            elif o[0] == "heartbeat":
                row = decide_heartbeat(row, key, token, o[2], 2.0, now)
                if o[2] is not None:
                    last_details = o[2]
                assert holder is not None and holder[1] == token
                holder = (holder[0], token, now + 2.0)
            elif o[0] == "complete":
                row = decide_complete(row, key, token, now) or row
                holder = None
            else:
                new_row = decide_release(row, token)
                if new_row is not None:
                    holder = None
                row = new_row or row
        except FencedError:
            assert row == before  # a fenced call changes nothing
        if before is not None and row is not None:
            assert row.token >= before.token
            if before.status == "done":
                assert row == before


def test_placeholder_row_claims_like_a_new_key() -> None:
    """The SQL stores insert (owner NULL, token 0, free) to lock a new key: it must decide
    exactly as no row at all."""
    placeholder = LeaseRow(None, 0, "free", 0.0, None)
    assert decide_claim(placeholder, "k", "w", 5, 10.0) == decide_claim(None, "k", "w", 5, 10.0)


@pytest.mark.parametrize("name", pkg.__all__)
def test_all_names_resolve(name: str) -> None:
    assert getattr(pkg, name) is not None


def test_all_is_complete() -> None:
    from kworkers.idempotency import outbox, postgres, redis, sqlite, store

    exported = set(pkg.__all__)
    for module in (outbox, postgres, redis, sqlite):
        for name in module.__all__:
            assert name in exported, f"{module.__name__}.{name} is not re-exported"
    for name in ("Claim", "ClaimState", "IdempotencyStore", "TransactionalStore"):
        assert name in exported and name in store.__all__
    assert inspect.isclass(pkg.PostgresStore) and inspect.isclass(pkg.RedisStore)
    with pytest.raises(AttributeError):
        _ = pkg.NoSuchStore
