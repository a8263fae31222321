"""How ``kworkers run --processes N`` hands its secrets to its children: a pipe, never argv.

Why: a process's command line is world-readable (``ps``, ``/proc/<pid>/cmdline``) and its
environment is readable by the same user and by anything that dumps it (``/proc/<pid>/
environ``, crash reports, a debugger). So the parent takes every secret property it was given
by ``-X`` or by a ``KWORKERS_*`` variable (``sasl.password``, ``ssl.key.password``,
``sasl.oauthbearer.client.secret``, ...) out of the children's arguments and environment, and
writes them as JSON into a pipe each child inherits (``--secrets-fd N``) and reads once at
start; the pipe is gone when both ends close, so nothing is left on disk. A ``--config`` file
stays a file: the children read it themselves, by its path.

The parent's own ``-X sasl.password=...`` is still in the parent's command line: nothing a
program does can take it back out of ``ps`` once it started. That is why the docs steer
secrets to ``--config FILE`` (mode 0600) or to variables from a Kubernetes Secret.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

from kworkers.errors import ConfigError
from kworkers.kafka.settings import ENV_PROPERTIES, is_secret_key, parse_property

#: the hidden ``kworkers run`` option a child reads its secrets from
FD_OPTION = "--secrets-fd"


def split_properties(properties: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """``-X key=value`` flags as (the ones a child may see on its command line, the secret
    ones)."""
    shown: list[str] = []
    secret: dict[str, str] = {}
    for text in properties:
        key, value = parse_property(text)
        if is_secret_key(key):
            secret[key] = value
        else:
            shown.append(text)
    return shown, secret


def secret_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``KWORKERS_*`` variables that carry a secret property: variable -> property."""
    return {var: prop for var, prop in ENV_PROPERTIES.items()
            if is_secret_key(prop) and environ.get(var, "").strip()}


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables that carry secrets."""
    drop = secret_variables(environ)
    return {k: v for k, v in environ.items() if k not in drop}


def secrets_for_children(environ: Mapping[str, str], flags: Mapping[str, str]
                         ) -> dict[str, str]:
    """The secret properties the children must get: from the environment, ``-X`` winning."""
    from_env = {prop: environ[var].strip() for var, prop in secret_variables(environ).items()}
    return {**from_env, **flags}


def attach(args: Sequence[str], secrets: Mapping[str, str]) -> tuple[list[str], int | None]:
    """``args`` with ``--secrets-fd N`` and the pipe's read end ``N`` (the caller passes it to
    the child and closes it after the start); unchanged without secrets."""
    if not secrets:
        return list(args), None
    data = json.dumps(dict(secrets)).encode()
    read, write = os.pipe()
    try:
        if len(data) > 60_000:  # a pipe buffer holds 64 KiB: more would block this write
            raise ConfigError("the secret client properties are too large to hand to the "
                              "worker processes")
        os.write(write, data)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return [*args, FD_OPTION, str(read)], read


def read(fd: int) -> dict[str, str]:
    """The secrets a parent wrote into the pipe ``fd`` (closed afterwards)."""
    try:
        with os.fdopen(fd, "rb") as pipe:
            data = json.loads(pipe.read() or b"{}")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{FD_OPTION} {fd}: cannot read the secrets the parent passed "
                          f"({type(exc).__name__})") from None
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ConfigError(f"{FD_OPTION} {fd}: not a table of client properties")
    return data
