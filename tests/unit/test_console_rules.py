"""The console's pure rules: who may reach it, CSRF, the filter it shares with the redrive."""

from __future__ import annotations

import base64

import pytest

from kworkers.console import auth
from kworkers.console.dlq_filter import ConsoleFilter, parse_filter
from kworkers.console.settings import (
    UNNAMED,
    ConsoleSettings,
    check_exposure,
    is_loopback,
    parse_tokens,
)
from kworkers.dlq.record import DeadLetter
from kworkers.dlq.redrive_plan import RedriveFilter
from kworkers.errors import ConfigError
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message

TOKEN = "a-token-of-twenty-chars"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True), ("LOCALHOST", True),
    ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
    ("192.168.1.2", False), ("console.example", False), ("", False),
])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_off_loopback_needs_a_token() -> None:
    check_exposure("127.0.0.1", [])
    check_exposure("0.0.0.0", [TOKEN])
    for host in ("0.0.0.0", "10.213.1.1", "::", "console.example"):
        with pytest.raises(ConfigError, match="set a token"):
            check_exposure(host, [])
        with pytest.raises(ConfigError, match="set a token"):
            ConsoleSettings(ClientSettings(), host=host)
    with pytest.raises(ConfigError, match="at least 16 characters"):
        check_exposure("127.0.0.1", ["short"])


def test_the_token_never_shows_in_repr() -> None:
    s = ConsoleSettings(ClientSettings(), host="0.0.0.0", token=TOKEN)
    assert TOKEN not in repr(s) and "****" in repr(s)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_token_in_bearer_or_basic() -> None:
    one = {UNNAMED: TOKEN}
    assert auth.identify(f"Bearer {TOKEN}", one) == UNNAMED
    assert auth.identify(_basic("ops", TOKEN), one) == UNNAMED  # unnamed: any user name
    assert auth.identify(_basic("", TOKEN), one) == UNNAMED
    for bad in (None, "", f"Bearer {TOKEN}x", "Bearer", _basic(TOKEN, "x"), "Basic !!!",
                f"Token {TOKEN}", "Basic " + base64.b64encode(TOKEN.encode()).decode()):
        assert auth.identify(bad, one) is None, bad


OTHER = "another-operator-token-987654"


def test_named_tokens_say_who_and_basic_must_give_that_name() -> None:
    named = {"alice": TOKEN, "bob": OTHER}
    assert auth.identify(f"Bearer {OTHER}", named) == "bob"
    assert auth.identify(_basic("alice", TOKEN), named) == "alice"
    assert auth.identify(_basic("bob", TOKEN), named) is None  # bob may not use alice's
    assert auth.identify(_basic("mallory", OTHER), named) is None


def test_token_files_name_operators() -> None:
    assert parse_tokens(f"{TOKEN}\n", "f") == (TOKEN, {})
    assert parse_tokens(f"# ops\nalice:{TOKEN}\n\nbob: {OTHER}\n", "f") == (
        None, {"alice": TOKEN, "bob": OTHER})
    for text, why in (("", "the file is empty"), (f"alice:{TOKEN}\nalice:{OTHER}", "twice"),
                      (f"{TOKEN}\n{OTHER}\n", "expected NAME:TOKEN"),
                      (f"bad name:{TOKEN}", "expected NAME:TOKEN")):
        with pytest.raises(ConfigError, match=why) as e:
            parse_tokens(text, "f")
        assert TOKEN not in str(e.value) and OTHER not in str(e.value)
    with pytest.raises(ConfigError, match="share a token"):
        ConsoleSettings(ClientSettings(), host="0.0.0.0", tokens={"a": TOKEN, "b": TOKEN})
    s = ConsoleSettings(ClientSettings(), host="0.0.0.0", tokens={"alice": TOKEN})
    assert TOKEN not in repr(s) and s.credentials == {"alice": TOKEN}


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1:8080", True), ("localhost:8080", True), ("[::1]:8080", True),
    ("localhost", True), ("evil.example:8080", False), ("127.0.0.1.evil.example", False),
    ("10.0.0.1:8080", False), (None, False), ("", False),
])
def test_loopback_host_header(host: str | None, ok: bool) -> None:
    assert auth.loopback_host(host) is ok


def test_csrf_token_binds_the_session() -> None:
    secret = auth.new_secret()
    own = "http://127.0.0.1:8080"
    session = auth.new_session()
    good = auth.csrf_token(secret, session)
    assert auth.csrf_problem(secret, session, good, None, own) is None
    assert auth.csrf_problem(secret, session, good, own, own) is None
    assert "another site" in (auth.csrf_problem(secret, session, good,
                                                "http://127.0.0.1:9999", own) or "")
    assert "opaque" in (auth.csrf_problem(secret, session, good, "null", own) or "")
    assert "no CSRF token" in (auth.csrf_problem(secret, session, None, None, own) or "")
    assert "cookie" in (auth.csrf_problem(secret, None, good, None, own) or "")
    other = auth.csrf_token(secret, auth.new_session())
    assert "does not match" in (auth.csrf_problem(secret, session, other, None, own) or "")
    # a token from another console process (another secret) is refused too
    assert auth.csrf_problem(auth.new_secret(), session, good, None, own) is not None


def _dead(partition: int, offset: int, *, error_type: str = "Malformed", key: bytes = b"k1",
          value: bytes = b"hello world", origin: int = 2, at: float = 1000.0) -> DeadLetter:
    return DeadLetter("t.dlq", partition, offset, "t", origin, 7, key, value, 3, error_type,
                      "bad input: field x", at - 5, at - 1, at, "exhausted", "g", ())


def test_the_console_filter_is_a_redrive_filter() -> None:
    f = parse_filter({"error_type": ["Malformed"], "origin_partition": ["2"],
                      "q": ["WORLD"], "since": ["1970-01-01T00:16:00"],
                      "until": ["1970-01-01T00:17:00Z"], "key": [""]})
    assert isinstance(f, RedriveFilter)
    assert f.key is None  # a blank field is unset
    assert f.matches(_dead(0, 1))
    assert not f.matches(_dead(0, 1, error_type="Expired"))
    assert not f.matches(_dead(0, 1, origin=1))
    assert not f.matches(_dead(0, 1, value=b"other"))
    assert f.matches(_dead(0, 1, value=b"x", key=b"world-key"))  # text in the key
    assert not f.matches(_dead(0, 1, at=1020.0 + 60))  # after until
    assert parse_filter(dict(_q(f.query()))) == f  # the query string round-trips


def _q(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in pairs:
        out.setdefault(k, []).append(v)
    return out


def test_selection_and_pinned_end() -> None:
    f = parse_filter({"sel": ["0:5", "1:2"], "upto": ["0:6,1:2"]})
    assert f.records == frozenset({(0, 5), (1, 2)})
    assert f.matches(_dead(0, 5))
    assert not f.matches(_dead(1, 2))  # selected, but at or past the end the plan read
    assert not f.matches(_dead(0, 4))  # not selected
    g = ConsoleFilter(upto=((0, 10),))
    assert g.matches(_dead(0, 9)) and not g.matches(_dead(0, 10))
    assert not g.matches(_dead(1, 0))  # a partition the plan saw empty selects nothing
    assert parse_filter(_q(f.query())) == f


def test_unreadable_records_show_only_without_failure_criteria() -> None:
    msg = Message("t.dlq", 0, 3, b"k", b"raw bytes", ())
    assert ConsoleFilter().matches_unreadable(msg)
    assert ConsoleFilter(text="RAW").matches_unreadable(msg)
    assert not ConsoleFilter(text="nope").matches_unreadable(msg)
    assert not ConsoleFilter(error_type="Malformed").matches_unreadable(msg)
    assert not ConsoleFilter(origin_partition=0).matches_unreadable(msg)


@pytest.mark.parametrize(("query", "needle"), [
    ({"since": ["yesterday"]}, "since: expected a time"),
    ({"origin_partition": ["-1"]}, "origin_partition: expected a whole number"),
    ({"origin_partition": ["x"]}, "origin_partition: expected a whole number"),
    ({"sel": ["0-5"]}, "sel: expected PARTITION:OFFSET"),
    ({"upto": ["0:1,zz"]}, "upto: expected PARTITION:OFFSET"),
    ({"error_type": ["a", "b"]}, "error_type: given 2 times"),
    ({"since": ["2025-01-02"], "until": ["2025-01-01"]}, "empty time window"),
    ({"sel": [f"0:{i}" for i in range(1001)]}, "at most 1000 records"),
])
def test_bad_filters_are_one_clear_line(query: dict[str, list[str]], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_filter(query)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from kworkers.cli import run_cli

    code = run_cli(["console", *args])
    return code, capsys.readouterr().err


def test_the_command_refuses_to_expose_itself_without_a_token(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: object) -> None:
    from pathlib import Path

    monkeypatch.delenv("KWORKERS_CONSOLE_TOKEN", raising=False)
    code, err = _cli(capsys, "--host", "0.0.0.0")
    assert code == 2 and err.count("\n") == 1 and "set a token" in err
    short = Path(str(tmp_path)) / "short"
    short.write_text("abc\n")
    code, err = _cli(capsys, "--host", "0.0.0.0", "--token-file", str(short))
    assert code == 2 and "at least 16 characters" in err and "abc" not in err
    empty = Path(str(tmp_path)) / "empty"
    empty.write_text("\n")
    code, err = _cli(capsys, "--token-file", str(empty))
    assert code == 2 and "the file is empty" in err
    code, err = _cli(capsys, "--scan-bound", "10", "--page-size", "50")
    assert code == 2 and "scan bound (10) must be >= page size (50)" in err
    code, err = _cli(capsys, "--metrics-url", "worker:9100")
    assert code == 2 and "expected http(s)://" in err
    bad = Path(str(tmp_path)) / "bad.avsc"
    bad.write_text('{"type": "nope"}')
    code, err = _cli(capsys, "--avro-schema", str(bad))
    assert code == 2 and "bad.avsc" in err
