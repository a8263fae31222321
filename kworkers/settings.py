"""Worker settings from outside the code: ``kworkers.toml``, ``KWORKERS_*`` variables, flags.

Why a layer of its own: the same worker module runs on a laptop, in CI and in a pod, and only
the settings differ. ``kworkers run`` reads them from three places, most specific first:

    command-line flags  >  KWORKERS_* environment  >  the TOML file  >  the Worker's own config

The operator commands (``kworkers dlq``, ``lag``, ``topics``, ``deploy render``) read the same
places for how to reach the cluster (``client_settings``): ``--bootstrap`` and ``-X key=value``
flags, the ``KWORKERS_*`` variables (``KWORKERS_BOOTSTRAP_SERVERS``, ``KWORKERS_SASL_*``,
``KWORKERS_SSL_*``: ``kworkers.kafka.settings.ENV_PROPERTIES``), and a ``--config`` file, which
is either a ``kworkers.toml`` (its ``bootstrap_servers`` and ``[client_config]``) or, for any
other name, a client properties file as Kafka's tools take with ``--command-config``.

Everything here is pure (a mapping in, a mapping or a ``WorkerConfig`` out) so the precedence
and every parse error are unit-tested without a process or a broker. A bad value is a
``ConfigError`` that names where it came from (``KWORKERS_CONCURRENCY``, ``kworkers.toml:
retry.max_attempts``), because "invalid literal for int()" does not tell an operator which of
three places to fix.

Durations are seconds as numbers, or labels such as ``500ms``, ``1s``, ``2m``, ``1h`` (the
labels retry tier topics are named with); sizes are bytes as numbers, or ``512KiB``, ``64MiB``,
``256MB``, ``1GiB``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from kworkers.clock import Seconds
from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.kafka.settings import (
    DEFAULT_BOOTSTRAP,
    ENV_PROPERTIES,
    ClientSettings,
    check_properties,
    parse_properties,
    parse_property,
    properties_from_env,
)
from kworkers.memory import Bytes, parse_bytes
from kworkers.retry_tiers.tiers import TierLadder

Layer = dict[str, Any]
"""Setting name (``concurrency``, ``retry.max_attempts``) -> parsed value."""

ENV_PREFIX = "KWORKERS_"

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:/\s*(s|m|h))?\s*$")


# --- value parsers -------------------------------------------------------------------------


def parse_duration(value: object, what: str = "duration") -> float:
    """Seconds from ``1.5``, ``"500ms"``, ``"1s"``, ``"2m"``, ``"1h"``; > 0 and finite."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a duration (500ms, 1s, 2m, 1h), got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            try:
                seconds = float(value)
            except ValueError:
                raise ConfigError(
                    f"{what}: expected a duration such as 500ms, 1s, 2m or 1h, got {value!r}"
                ) from None
        else:
            seconds = float(m[1]) * _UNIT_SECONDS[m[2]]
    else:
        raise ConfigError(f"{what}: expected a duration (500ms, 1s, 2m, 1h), got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{what}: must be a positive duration, got {value!r}")
    return seconds


def parse_tiers(value: object, what: str = "tiers") -> TierLadder:
    """A retry ladder from ``"1s,5s,30s"`` or ``["1s", 5, "2m"]``; labels must increase.

    ``TierLadder`` does the rest of the checking (whole milliseconds, strictly increasing), and
    its message is prefixed with ``what`` so the operator sees which flag or key was wrong.
    """
    if isinstance(value, str):
        items: list[object] = [p for p in (s.strip() for s in value.split(",")) if p]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ConfigError(f"{what}: expected a list of delays such as 1s,5s,30s, got {value!r}")
    if not items:
        raise ConfigError(f"{what}: need at least one delay, such as 1s,5s,30s")
    delays = tuple(parse_duration(v, what) for v in items)
    try:
        return TierLadder(delays)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def parse_rate(value: str, what: str = "rate") -> float:
    """Records per second from ``"50"``, ``"50/s"``, ``"600/m"`` or ``"1000/h"``."""
    m = _RATE.match(value)
    if m is None:
        raise ConfigError(f"{what}: expected records per second such as 50/s, got {value!r}")
    per = {"s": 1.0, "m": 60.0, "h": 3600.0}[m[2] or "s"]
    rate = float(m[1]) / per
    if rate <= 0:
        raise ConfigError(f"{what}: must be > 0, got {value!r}")
    return rate


def _int(value: object, what: str, minimum: int | None = 1) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(f"{what}: expected a whole number, got {value!r}") from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{what}: expected a whole number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{what}: must be >= {minimum}, got {value}")
    return value


def _any_int(value: object, what: str) -> int:
    return _int(value, what, minimum=None)


def _float(value: object, what: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(f"{what}: expected a number, got {value!r}") from None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{what}: expected a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what}: must be a positive number, got {value!r}")
    return float(value)


def _str(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what}: expected non-empty text, got {value!r}")
    return value.strip()


def _optional_str(value: object, what: str) -> str | None:
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        return None
    return _str(value, what)


def _str_list(value: object, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [_str(v, what) for v in value]
    else:
        raise ConfigError(f"{what}: expected a list (or comma-separated text), got {value!r}")
    out = tuple(p for p in items if p)
    if not out:
        raise ConfigError(f"{what}: must not be empty")
    return out


def _choice(*choices: str) -> Callable[[object, str], str]:
    def parse(value: object, what: str) -> str:
        text = _str(value, what)
        if text not in choices:
            raise ConfigError(f"{what}: one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _optional_duration(value: object, what: str) -> float | None:
    if isinstance(value, str) and value.strip().lower() in ("", "none", "off"):
        return None
    return parse_duration(value, what)


def _client_config(value: object, what: str) -> dict[str, str | int | float | bool]:
    """A librdkafka property table (a TOML table, ``-X`` flags, or the ``KWORKERS_SASL_*``-like
    variables of ``ENV_PROPERTIES``)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what}: expected a table of librdkafka properties, got {value!r}")
    return check_properties(value, what)


def _bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"{what}: expected true or false, got {value!r}")


Parser = Callable[[object, str], Any]

#: How a field's type is read from the outside (text from a variable or a flag, or a TOML
#: value). A ``WorkerConfig`` field of a type not here is a ``TypeError`` at import: a new
#: setting cannot be added without saying how it is read.
_BY_TYPE: list[tuple[Any, Parser]] = [
    (str, _str), (str | None, _optional_str), (int, _int), (int | None, _any_int),
    (float, _float), (bool, _bool),
    (Seconds, parse_duration), (Seconds | None, _optional_duration), (Bytes, parse_bytes),
    (tuple[str, ...], _str_list), (TierLadder, parse_tiers),
]


def _parser(tp: Any) -> Parser | None:
    for known, parse in _BY_TYPE:
        if tp == known:
            return parse
    origin = typing.get_origin(tp)
    if origin is Literal:
        return _choice(*typing.get_args(tp))
    if origin is collections.abc.Mapping:
        return _client_config
    return None


def _policy(tp: Any) -> type[Any] | None:
    """The dataclass of a nested policy field (``RetryPolicy``, or ``BreakerPolicy | None``)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    cls = args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(
        args) == 1 else tp
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


#: nested policy name -> its class (``retry`` -> ``RetryPolicy``); filled by ``_fields``
_POLICIES: dict[str, type[Any]] = {}


def _fields(cls: type[Any], prefix: str = "") -> dict[str, Parser]:
    """Every init field of ``cls`` with its parser; a nested policy (a dataclass such as
    ``RetryPolicy``) contributes its own fields as ``retry.max_attempts`` and so on. An
    optional policy (``breaker: BreakerPolicy | None``) is switched on by setting any of its
    fields, the others keeping their defaults."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: dict[str, Parser] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        parse = _parser(tp)
        policy = None if parse is not None else _policy(tp)
        if parse is not None:
            out[prefix + f.name] = parse
        elif policy is not None:
            _POLICIES[prefix + f.name] = policy
            out.update(_fields(policy, f"{prefix}{f.name}."))
        else:
            raise TypeError(f"kworkers.settings: no parser for {prefix}{f.name}: {tp}")
    return out


#: Every setting the outside may change, with its parser: derived from ``WorkerConfig`` (and
#: its nested policies), so a new field is a new setting everywhere (TOML, KWORKERS_*, the
#: rendered ConfigMap) with nothing to keep in step by hand.
FIELDS: dict[str, Parser] = _fields(WorkerConfig)

#: Settings a table carries (``client_config`` also takes ``-X`` and security variables).
TABLES = frozenset(n for n, p in FIELDS.items() if p is _client_config)
#: Settings whose layers merge key by key instead of replacing each other.
_MERGED = TABLES
#: The nested policies (``retry``, ``commit``): a TOML table each.
_NESTED = frozenset(n.partition(".")[0] for n in FIELDS if "." in n)


def env_name(setting: str) -> str:
    """``retry.max_attempts`` -> ``KWORKERS_RETRY_MAX_ATTEMPTS``."""
    return ENV_PREFIX + setting.upper().replace(".", "_")


def env_vars() -> frozenset[str]:
    """Every variable ``from_env`` reads: one per setting, and the client properties'."""
    return frozenset({env_name(n) for n in FIELDS if n not in TABLES} | set(ENV_PROPERTIES))


# --- layers --------------------------------------------------------------------------------


def from_env(environ: Mapping[str, str]) -> Layer:
    """The settings named by ``KWORKERS_*`` variables.

    Only known names are read: ``KWORKERS_BOOTSTRAP``, ``KWORKERS_KAFKA_IMAGE`` and friends
    belong to the test tooling, so an unknown ``KWORKERS_*`` variable is not an error.
    """
    layer: Layer = {}
    for name, parse in FIELDS.items():
        if name in TABLES:
            continue
        var = env_name(name)
        raw = environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        layer[name] = parse(raw, var)
    client = properties_from_env(environ)
    if client:
        layer["client_config"] = client
    return layer


def from_toml(data: Mapping[str, Any], source: str = "kworkers.toml") -> Layer:
    """The settings of a parsed TOML document; an unknown key is an error (it is a typo)."""
    layer: Layer = {}
    for key, value in data.items():
        if key in _NESTED and isinstance(value, Mapping):
            for sub, subvalue in value.items():
                _toml_value(layer, f"{key}.{sub}", subvalue, source)
        else:
            _toml_value(layer, key, value, source)
    return layer


def _toml_value(layer: Layer, name: str, value: object, source: str) -> None:
    parse = FIELDS.get(name)
    if parse is None:
        known = ", ".join(sorted(FIELDS))
        raise ConfigError(f"{source}: unknown setting {name!r} (known: {known})")
    layer[name] = parse(value, f"{source}: {name}")


def _read(p: Path) -> str:
    try:
        return p.read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None


def load_toml(path: str | Path) -> Layer:
    """``from_toml`` of a file; a missing or malformed file is a ``ConfigError``."""
    p = Path(path)
    try:
        data = tomllib.loads(_read(p))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from None
    return from_toml(data, str(p))


def load_file(path: str | Path) -> Layer:
    """A ``--config`` file: ``kworkers.toml`` settings when its name ends in ``.toml``, else
    client properties (``key=value`` lines, as Kafka's ``--command-config``)."""
    p = Path(path)
    if p.suffix == ".toml":
        return load_toml(p)
    return _client_layer(parse_properties(_read(p), str(p)))


def _client_layer(props: Mapping[str, str], bootstrap: str | None = None) -> Layer:
    """Client properties as settings: ``bootstrap.servers`` is the ``bootstrap_servers``."""
    rest = dict(props)
    bootstrap = bootstrap or rest.pop("bootstrap.servers", None) or None
    rest.pop("bootstrap.servers", None)
    layer: Layer = {"client_config": rest} if rest else {}
    if bootstrap is not None:
        layer["bootstrap_servers"] = _str(bootstrap, "bootstrap servers")
    return layer


def client_flags(bootstrap: str | None, properties: Sequence[str]) -> Layer:
    """``--bootstrap`` and ``-X key=value`` flags as a layer (``--bootstrap`` wins over
    ``-X bootstrap.servers``); what ``from_flags`` would make of them, parsed."""
    return _client_layer(dict(parse_property(p) for p in properties), bootstrap)


def from_flags(flags: Mapping[str, object]) -> Layer:
    """Command-line values (``None`` = not given), parsed like the other layers."""
    layer: Layer = {}
    for name, value in flags.items():
        if value is None or value == ():
            continue
        parse = FIELDS.get(name)
        if parse is None:
            raise ConfigError(f"unknown setting {name!r}")
        layer[name] = parse(value, f"--{name.replace('_', '-')}")
    return layer


def merge(*layers: Mapping[str, Any]) -> Layer:
    """Layers from least to most specific: a later layer wins, setting by setting.

    Client property tables merge key by key, so an environment-specific file can change one
    librdkafka property without repeating the others.
    """
    out: Layer = {}
    for layer in layers:
        for name, value in layer.items():
            if name in _MERGED and name in out:
                out[name] = {**out[name], **value}
            else:
                out[name] = value
    return out


def apply(config: WorkerConfig, overrides: Mapping[str, Any]) -> WorkerConfig:
    """``config`` with ``overrides`` applied; ``WorkerConfig`` validates the result.

    Nested policies are replaced field by field (``retry.max_attempts`` keeps the worker's
    own backoff), client tables key by key over the worker's own.
    """
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for name, value in overrides.items():
        if name not in FIELDS:
            raise ConfigError(f"unknown setting {name!r}")
        head, dot, field = name.partition(".")
        if dot:
            nested.setdefault(head, {})[field] = value
        elif name == "tiers":
            top["tiers"] = value if isinstance(value, TierLadder) else parse_tiers(value)
        elif name in _MERGED:
            top[name] = {**getattr(config, name), **value}
        else:
            top[name] = value
    for head, fields in nested.items():
        policy = getattr(config, head)
        if policy is None:
            _check_complete(head, fields)
        top[head] = (_POLICIES[head](**fields) if policy is None
                     else dataclasses.replace(policy, **fields))
    if not top:
        return config
    return dataclasses.replace(config, **top)


def _check_complete(head: str, fields: Mapping[str, Any]) -> None:
    """An optional policy switched on from outside (``rate_limit.scope`` alone) must be given
    every field it cannot default: one line naming what is missing and what was given."""
    missing = [f"{head}.{f.name}" for f in dataclasses.fields(_POLICIES[head])
               if f.init and f.name not in fields and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        given = ", ".join(f"{head}.{k}" for k in sorted(fields))
        need = ", ".join(f"{m} ({env_name(m)})" for m in missing)
        raise ConfigError(f"{given} set without {need}: the worker has no {head} of its own, "
                          f"so a {head} from settings needs {', '.join(missing)} too")


def resolve(
    config: WorkerConfig,
    flags: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    path: str | Path | None = None,
) -> WorkerConfig:
    """The worker's config with the file, then the environment, then flags applied."""
    return apply(config, overrides(flags, environ, path))


def overrides(
    flags: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    path: str | Path | None = None,
) -> Layer:
    """The merged outside settings (CLI > env > file), before they meet a config."""
    file_layer = load_file(path) if path is not None else {}
    return merge(file_layer, from_env(environ or {}), from_flags(flags or {}))


def client_settings(
    flags: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    path: str | Path | None = None,
    default_bootstrap: str = DEFAULT_BOOTSTRAP,
) -> ClientSettings:
    """How an operator command reaches the cluster: the same flags > env > file layers as
    ``kworkers run``, of which only ``bootstrap_servers`` and ``client_config`` matter."""
    layer = overrides(flags, environ, path)
    return ClientSettings.of(layer.get("bootstrap_servers", default_bootstrap),
                             layer.get("client_config", {}))
