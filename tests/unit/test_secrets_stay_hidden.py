"""Secrets never leak through --help, and host name verification is never switched off by
kworkers itself (the broker tests prove the rest: tests/faults/test_security.py)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kworkers.cli.main import cli
from kworkers.kafka.settings import (
    ClientSettings,
    admin_settings,
    consumer_settings,
    producer_settings,
    reader_settings,
    transactional_producer_settings,
)

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-in-the-environment-0123"
SECRET_ENV = {"KWORKERS_SASL_PASSWORD": SECRET, "KWORKERS_SSL_KEY_PASSWORD": SECRET,
              "KWORKERS_SASL_OAUTHBEARER_CLIENT_SECRET": SECRET,
              "KWORKERS_CONSOLE_TOKEN": SECRET, "KWORKERS_CONFIG": f"/tmp/{SECRET}.properties"}


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*path, name))
        else:
            out.append((*path, name))
    return out


def _help_leaks(command: click.Command, args: list[str]) -> bool:
    out = CliRunner().invoke(command, [*args, "--help"], env=SECRET_ENV)
    assert out.exit_code == 0, out.output
    return SECRET in out.output


def test_no_help_shows_a_secret_from_the_environment() -> None:
    paths = _commands(cli)
    assert len(paths) > 10  # every group and command, not an empty walk
    leaking = [" ".join(p) for p in paths if _help_leaks(cli, list(p))]
    assert not leaking, leaking


def test_the_help_check_catches_a_default_read_from_the_environment_the_canary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("KWORKERS_SASL_PASSWORD", SECRET)

    @click.command()
    @click.option("--password", default=os.environ.get("KWORKERS_SASL_PASSWORD"),
                  show_default=True)
    def leaky(password: str | None) -> None:
        """A command that shows its environment default."""

    assert _help_leaks(leaky, [])


#: a setting of host name verification to "none", however it is spelt
NONE = re.compile(r"""identification[._]algorithm["']?\s*[:=,]\s*["']?none\b""", re.I)


def _offenders() -> list[str]:
    files = [*ROOT.joinpath("kworkers").rglob("*.py"), *ROOT.joinpath("deploy").rglob("*.yaml"),
             *ROOT.joinpath("kworkers").rglob("*.html"), ROOT / "docker-compose.yml"]
    return [f"{path.relative_to(ROOT)}:{n}" for path in files
            for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
            if NONE.search(line)]


def test_nothing_in_kworkers_switches_host_name_verification_off() -> None:
    assert _offenders() == []
    tls = ClientSettings.of("k:9093", {"security.protocol": "SSL", "ssl.ca.location": "/ca"})
    for conf in (consumer_settings(tls, "g"), producer_settings(tls), admin_settings(tls),
                 reader_settings(tls), transactional_producer_settings(tls, "t")):
        assert "ssl.endpoint.identification.algorithm" not in conf  # librdkafka's https stays


def test_the_scan_catches_a_setting_of_none_the_canary() -> None:
    for line in ('"ssl.endpoint.identification.algorithm": "none",',
                 "ssl.endpoint.identification.algorithm=none",
                 "KWORKERS_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM: none"):
        assert NONE.search(line), line
    assert not NONE.search('"KWORKERS_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": '
                           '"ssl.endpoint.identification.algorithm",')
