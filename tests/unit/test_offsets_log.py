"""The ``__consumer_offsets`` decoder (``kworkers.testing.offsets_log``), on records built by hand
in Kafka's formats; the reader itself runs against a real broker in the kill loop's evidence."""

from __future__ import annotations

import struct

from kworkers.testing.offsets_log import (
    OffsetCommitRecord,
    coordinator_partition,
    decode_commit,
    render_history,
)


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _key(group: str, topic: str, partition: int, version: int = 1) -> bytes:
    return struct.pack(">h", version) + _s(group) + _s(topic) + struct.pack(">i", partition)


def test_a_commit_of_each_value_version_is_decoded() -> None:
    key = _key("g", "t", 3)
    v1 = struct.pack(">hq", 1, 50) + _s("") + struct.pack(">qq", 1000, -1)
    v3 = struct.pack(">hqi", 3, 50, 7) + _s("m") + struct.pack(">q", 1000)
    v4 = struct.pack(">hqi", 4, 50, 7) + bytes([2]) + b"m" + struct.pack(">q", 1000) + b"\0"
    assert decode_commit(key, v1) == ("g", "t", 3, 50, None, 1000)
    assert decode_commit(key, v3) == ("g", "t", 3, 50, 7, 1000)
    assert decode_commit(key, v4) == ("g", "t", 3, 50, 7, 1000)


def test_a_tombstone_is_a_commit_deleted_and_other_records_are_left_out() -> None:
    assert decode_commit(_key("g", "t", 0, version=0), None) == ("g", "t", 0, None, None, None)
    assert decode_commit(struct.pack(">h", 2) + _s("g"), b"\0\3") is None  # group metadata
    assert decode_commit(None, None) is None


def test_the_group_s_partition_is_kafka_s() -> None:
    # Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == MIN_VALUE,
    # which Kafka's Utils.abs maps to 0; a negative hash is Math.abs'd, not masked
    assert coordinator_partition("hello", 50) == 99162322 % 50
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert coordinator_partition("g-fc1e8608", 10) == 1952722051 % 10


def test_the_history_shows_each_change_and_a_commit_going_back() -> None:
    rs = [OffsetCommitRecord("g", "t", 0, pos, 1.0 + i, 1, i)
          for i, pos in enumerate([10, 10, 50, None, 3])]
    text = render_history(rs)
    assert "t[0] -> 10" in text and "1 more commits of 10" in text
    assert "-> tombstone BACKWARDS" in text
    assert "t[0] -> 3" in text
