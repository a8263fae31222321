"""Every partial or contradictory setting, from every entrance, is one line naming the setting
(issue #46, bug 6).

Before: ``KWORKERS_RATE_LIMIT_SCOPE=replica kworkers run app:worker`` (a rate limit without its
rate) raised ``TypeError: RateLimit.__init__() missing ... 'per_second'`` with a traceback, and
a value of the wrong type from code (``concurrency="8"``) a ``TypeError`` from inside a check.

The walk: every setting ``kworkers.settings.FIELDS`` knows (derived from ``WorkerConfig``, so a
new setting is walked without touching this file), through the environment, a kworkers.toml,
flags and code, with values of every wrong kind, each optional policy's fields given alone,
and every combination of the settings that are choices. Each attempt either gives a config or
a ``ConfigError`` of one line that names a setting it was given; any other exception fails.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kworkers import settings
from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError

BASE = WorkerConfig(topics=("t",), group_id="g")
ROOT = str(Path(__file__).resolve().parents[2])
SETTINGS = [n for n in settings.FIELDS if n not in settings.TABLES]
WRONG_TEXT = ["garbage", "-1", "0", "1e400", "nan", "true", "none", "1s,0s", "x" * 300]
WRONG_VALUES: list[object] = ["garbage", -1, 0, 1.5, True, None, [], {}, float("inf"), ()]


def _names(setting: str) -> tuple[str, ...]:
    """The spellings a message may name a setting by."""
    return (setting, settings.env_name(setting), f"--{setting.replace('_', '-')}",
            setting.replace("_", " "))


def _judged(attempt: Callable[[], object], *given: str) -> str | None:
    """None when ``attempt`` gave a config; else its one line, which must name one of
    ``given``. Anything but a ``ConfigError`` fails the test."""
    try:
        attempt()
    except ConfigError as exc:
        line = str(exc)
        assert "\n" not in line, f"{given}: more than one line: {line!r}"
        assert any(n in line for g in given for n in _names(g)), \
            f"{given}: the line names none of them: {line!r}"
        return line
    return None


def _partial() -> Iterator[tuple[str, str]]:
    """Each optional policy's fields, one at a time, with a value it takes."""
    hints = typing.get_type_hints(WorkerConfig)
    for head, cls in settings._POLICIES.items():
        if type(None) not in typing.get_args(hints[head]):
            continue  # a policy the worker always has: one field is never partial
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING:
                continue
            choices = typing.get_args(typing.get_type_hints(cls)[f.name])
            value = choices[-1] if typing.get_origin(
                typing.get_type_hints(cls)[f.name]) is typing.Literal else f.default
            if value not in (None, ""):  # an empty variable is no setting at all
                yield f"{head}.{f.name}", str(value)


PARTIAL = list(_partial())


def test_the_walk_has_something_to_walk() -> None:
    assert "rate_limit.scope" in dict(PARTIAL) and "concurrency" in SETTINGS
    assert len(SETTINGS) > 40


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_environment(setting: str) -> None:
    for text in WRONG_TEXT:
        _judged(partial(settings.resolve, BASE, environ={settings.env_name(setting): text}),
                setting)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_kworkers_toml(setting: str, tmp_path: Path) -> None:
    head, dot, sub = setting.partition(".")
    for value in [*WRONG_VALUES[:5], "1e400", "nan"]:
        text = f"{sub} = {_toml(value)}" if dot else f"{setting} = {_toml(value)}"
        path = tmp_path / "kworkers.toml"
        path.write_text(f"[{head}]\n{text}\n" if dot else f"{text}\n")
        _judged(partial(settings.resolve, BASE, path=path), setting)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


@pytest.mark.parametrize("setting", SETTINGS)
def test_flags(setting: str) -> None:
    for text in WRONG_TEXT:
        _judged(partial(settings.resolve, BASE, flags={setting: text}), setting)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(WorkerConfig) if f.init])
def test_code(field: str) -> None:
    for value in WRONG_VALUES:
        _judged(partial(dataclasses.replace, BASE, **{field: value}), field)


@pytest.mark.parametrize(("setting", "value"), PARTIAL)
def test_a_policy_given_in_part(setting: str, value: str, tmp_path: Path) -> None:
    """The issue's case and its kind: an optional policy switched on by one of its fields
    alone, from each outside entrance. A policy that cannot be whole without more says which
    setting is missing (and the one given)."""
    head, _, sub = setting.partition(".")
    path = tmp_path / "kworkers.toml"
    path.write_text(f'[{head}]\n{sub} = "{value}"\n')
    for attempt in (lambda: settings.resolve(BASE, environ={settings.env_name(setting): value}),
                    lambda: settings.resolve(BASE, flags={setting: value}),
                    lambda: settings.resolve(BASE, path=path)):
        line = _judged(attempt, setting)
        required = [f.name for f in dataclasses.fields(settings._POLICIES[head])
                    if f.default is dataclasses.MISSING]
        if required:
            assert line is not None and all(f"{head}.{r}" in line for r in required), line


def _choices() -> list[tuple[str, tuple[object, ...]]]:
    hints = typing.get_type_hints(WorkerConfig)
    return [(f.name, typing.get_args(hints[f.name])) for f in dataclasses.fields(WorkerConfig)
            if typing.get_origin(hints[f.name]) is typing.Literal]


CHOICES = _choices()


def test_every_combination_of_choices() -> None:
    """Contradictions between settings that are choices (share mode with key ordering, with
    exactly once, with inline execution, ...): each a line naming one of them."""
    names = [n for n, _ in CHOICES]
    assert {"mode", "ordering", "guarantee", "execution"} <= set(names)
    refused = 0
    for combo in itertools.product(*(c for _, c in CHOICES)):
        kw: dict[str, Any] = dict(zip(names, combo, strict=True))
        env = {settings.env_name(n): str(v) for n, v in kw.items()}
        for attempt in (partial(WorkerConfig, ("t",), "g", **kw),
                        partial(settings.resolve, BASE, environ=env)):
            refused += _judged(attempt, *names) is not None
    assert refused > 0  # the walk met contradictions, not only good combinations


def test_the_issues_command_is_one_line_exit_2() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KWORKERS_")}
    out = subprocess.run([sys.executable, "-m", "kworkers.cli", "run",
                          "kworkers.deploy.example:worker"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60,
                         env={**clean, "KWORKERS_RATE_LIMIT_SCOPE": "replica"})
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "rate_limit.per_second" in lines[0] and "rate_limit.scope" in lines[0], lines[0]


def test_code_of_the_wrong_type_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^concurrency: a whole number, got '8'$"):
        WorkerConfig(topics=("t",), group_id="g", concurrency="8")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^drain_timeout: a number of seconds"):
        WorkerConfig(topics=("t",), group_id="g", drain_timeout="5s")  # type: ignore[arg-type]
    assert WorkerConfig(topics=["t"], group_id="g",  # type: ignore[arg-type]
                        message_timeout=5).message_timeout == 5  # lists, ints as seconds: fine

