"""CLI argument errors that need no broker: one line on stderr, exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kworkers.cli import run_cli


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_cli(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [
    ["dlq", "list"],                                       # missing --dlq
    ["dlq", "show", "--dlq", "x.dlq", "--offset", "1"],    # missing --partition
    ["dlq", "show", "--dlq", "x.dlq", "-p", "-1", "-o", "1"],
    ["dlq", "redrive", "--dlq", "x.dlq", "--since", "yesterday"],
    ["dlq", "redrive", "--dlq", "x.dlq", "--since", "2025-01-02", "--until", "2025-01-01"],
    ["dlq", "redrive", "--dlq", "x.dlq", "--rate", "fast"],
    ["dlq", "redrive", "--dlq", "x.dlq", "--min-offset", "5", "--max-offset", "1"],
    ["topics", "plan", "--topic", "orders", "--tiers", "1s,1x"],
    ["topics", "plan", "--topic", "orders", "--tiers", "5s,1s"],
    ["topics", "create"],                                  # missing --topic
    ["lag"],                                               # missing --group
    ["lag", "--group", "g", "--offset-reset-policy", "newest"],
    ["run", "no_colon"],
    ["run", "no_such_module_kw:worker"],
    ["run", "kworkers.settings:nothing_here"],
    ["run", "kworkers.settings:ENV_PREFIX"],               # a str, not a Worker
    ["dlq", "list", "--dlq", "x.dlq", "-X", "no-equals-sign"],
    ["lag", "--group", "g", "-X", "sasl.username=only-half"],  # the password is missing
    ["topics", "plan", "--topic", "t", "--config", "/no/such/client.properties"],
    ["nosuchcommand"],
    ["demo", "flaky"],                                     # the demo is scripts/demo now
    ["produce", "v"],                                      # missing --topic
    ["produce", "-t", "t", "v", "--workflow-id", "w"],     # half the ids
    ["produce", "-t", "t", "a", "b", "--workflow-id", "w", "--activity-id", "x"],  # one key
    ["produce", "-t", "t", "v", "-H", "kw-attempt=3"],     # kworkers' own headers
    ["produce", "-t", "t", "v", "-H", "no-equals"],
])
def test_bad_arguments_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                               args: list[str]) -> None:
    code, out, err = _run(capsys, *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kworkers: error: ")
    assert "Traceback" not in err + out


def test_run_names_what_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = _run(capsys, "run", "no_such_module_kw:worker")
    assert "cannot import module 'no_such_module_kw'" in err
    _, _, err = _run(capsys, "run", "kworkers.settings:ENV_PREFIX")
    assert "is a str, not a kworkers.Worker" in err


@pytest.mark.parametrize("args", [
    [], ["run"], ["topics"], ["topics", "plan"], ["topics", "create"], ["dlq"], ["dlq", "list"],
    ["dlq", "show"], ["dlq", "redrive"], ["lag"], ["deploy"], ["deploy", "render"],
    ["produce"],
])
def test_help_everywhere(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, out, _ = _run(capsys, *args, "--help")
    assert code == 0
    assert out.startswith("Usage: kworkers")


@pytest.mark.parametrize("args", [[], ["topics"], ["dlq"], ["deploy"], ["workflow"]])
def test_a_group_alone_prints_its_help(capsys: pytest.CaptureFixture[str],
                                       args: list[str]) -> None:
    """`kworkers dlq` alone asks what there is: the help as --help prints it, on several
    lines of stdout, not flattened into one error line."""
    code, out, err = _run(capsys, *args)
    assert (code, err) == (0, "")
    assert out.startswith(f"Usage: kworkers {' '.join(args)}".rstrip() + " ")
    assert "\nCommands:\n" in out and len(out.splitlines()) > 5
    _, helped, _ = _run(capsys, *args, "--help")
    assert out == helped


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        code, out, err = _run(capsys, flag)
        assert (code, out, err) == (0, f"kworkers {version('kworkers')}\n", "")


def test_the_metrics_port_help_says_what_a_pool_serves(
        capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "run", "--help")
    text = " ".join(out.split())
    assert "PORT+i" not in text
    assert "With --processes N the parent serves the pool there" in text


def test_hidden_crash_option_is_not_advertised(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "dlq", "redrive", "--help")
    assert "--crash-after" not in out and "--dry-run" in out and "--rate" in out


OPERATOR_COMMANDS = [["run"], ["topics", "plan"], ["topics", "create"], ["dlq", "list"],
                     ["dlq", "show"], ["dlq", "redrive"], ["lag"], ["deploy", "render"],
                     ["produce"]]


@pytest.mark.parametrize("args", OPERATOR_COMMANDS)
def test_every_command_takes_client_settings(capsys: pytest.CaptureFixture[str],
                                             args: list[str]) -> None:
    _, out, _ = _run(capsys, *args, "--help")
    for option in ("--bootstrap", "--config FILE", "-X KEY=VALUE", "KWORKERS_SASL_USERNAME"):
        assert option in " ".join(out.split()), (args, option)


def test_a_bad_client_setting_never_prints_a_secret(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("bootstrap.servers=127.0.0.1:1\nsasl.password=hunter2-secret\n")
    code, out, err = _run(capsys, "dlq", "list", "--dlq", "x.dlq", "--config", str(props))
    assert code == 2 and "go together" in err  # no user name: refused before any connection
    assert "hunter2-secret" not in out + err


@pytest.mark.parametrize("kind", ["KafkaException", "SerializationError"])
def test_a_client_error_no_command_turned_into_ours_is_one_line_naming_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The CLI's last line (issue #48: it no longer names the client's exceptions itself):
    ``kworkers: error: <the client's type>: <its text>``, exit 1; with KWORKERS_DEBUG the
    traceback, the client's exception as the cause."""
    import click
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.serialization import SerializationError

    from kworkers.cli.main import cli
    from kworkers.kafka.errors import ClientError

    make = {"KafkaException": KafkaException, "SerializationError": SerializationError}[kind]
    exc = make(KafkaError(KafkaError._TRANSPORT, "broker down"))

    @click.command("fails-in-the-client")
    def fails() -> None:
        raise exc

    monkeypatch.setitem(cli.commands, "fails-in-the-client", fails)
    code, out, err = _run(capsys, "fails-in-the-client")
    assert code == 1, (out, err)
    assert err.strip() == f"kworkers: error: {kind}: {' '.join(str(exc).split())}"
    assert "broker down" in err and "Traceback" not in err

    monkeypatch.setenv("KWORKERS_DEBUG", "1")
    with pytest.raises(ClientError) as debug:
        run_cli(["fails-in-the-client"])
    assert debug.value.__cause__ is exc
