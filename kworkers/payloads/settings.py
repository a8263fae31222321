"""Where the schema registry is and how to reach it: one value, secrets masked.

Operators give it as ``--schema-registry URL`` and ``-S key=value`` (any property
``SchemaRegistryClient`` takes, as ``-X`` gives librdkafka's: ``basic.auth.user.info=user:pass``,
``ssl.ca.location=...``), or as ``KWORKERS_SCHEMA_REGISTRY_URL`` and
``KWORKERS_SCHEMA_REGISTRY_USER_INFO`` (so a password need not be on a command line). Flags win
over the environment, as everywhere in kworkers.

The password in ``basic.auth.user.info``, a bearer token or client secret, and credentials in
the URL itself (``https://user:pass@host``) never leave this value in text: ``repr``,
``masked()`` and ``shown_url`` mask them, ``redact`` takes them out of a message.

Pure: the client is built from ``client_config()`` by ``kworkers.kafka.schema_registry``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kworkers.errors import ConfigError
from kworkers.properties import MASK, parse_property

URL_ENV = "KWORKERS_SCHEMA_REGISTRY_URL"
USER_INFO_ENV = "KWORKERS_SCHEMA_REGISTRY_USER_INFO"
#: Parts of a registry client property name that mark its value as a secret.
_SECRET_MARKERS = ("user.info", "password", "secret", "token")


def is_secret_key(key: str) -> bool:
    return any(marker in key for marker in _SECRET_MARKERS)


def _user_info_secret(value: str) -> str:
    """The secret part of ``user:password`` (the whole value when there is no colon)."""
    return value.partition(":")[2] or value


@dataclass(frozen=True, repr=False)
class RegistrySettings:
    """A schema registry's URL (comma-separated for several) and client properties."""

    url: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        urls = [u.strip() for u in str(self.url).split(",") if u.strip()]
        if not urls:
            raise ConfigError("schema registry: the URL must not be empty")
        for u in urls:
            parts = urllib.parse.urlsplit(u)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"schema registry: {_mask_url(u)!r} is not an http(s) URL")
        if "url" in self.properties:
            raise ConfigError("schema registry: give the URL as --schema-registry, not -S url=")
        object.__setattr__(self, "url", ",".join(urls))
        object.__setattr__(self, "properties", dict(self.properties))

    def client_config(self) -> dict[str, str]:
        """The ``SchemaRegistryClient`` configuration."""
        return {**self.properties, "url": self.url}

    def secrets(self) -> list[str]:
        """The secret values, longest first (so a secret inside another is masked whole)."""
        found = set()
        for k, v in self.properties.items():
            if is_secret_key(k) and v:
                found.add(v)
                if "user.info" in k:
                    found.add(_user_info_secret(v))
        for u in self.url.split(","):
            password = urllib.parse.urlsplit(u).password
            if password:
                found.add(password)
        return sorted(found, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets():
            text = text.replace(secret, MASK)
        return text

    @property
    def shown_url(self) -> str:
        """The URL with any credentials in it masked (safe to print)."""
        return ",".join(_mask_url(u) for u in self.url.split(","))

    def masked(self) -> dict[str, str]:
        return {k: MASK if is_secret_key(k) else v for k, v in self.properties.items()}

    def __repr__(self) -> str:
        return f"RegistrySettings({self.shown_url!r}, {self.masked()!r})"


def _mask_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{MASK}@{host}"))


def registry_settings(url: str | None, properties: Sequence[str],
                      environ: Mapping[str, str]) -> RegistrySettings | None:
    """Flags (``--schema-registry``, ``-S``) over the environment; None when no URL is given
    (the operators then show values as text or hex)."""
    props: dict[str, str] = {}
    user_info = environ.get(USER_INFO_ENV, "").strip()
    if user_info:
        props["basic.auth.user.info"] = user_info
    for text in properties:
        key, value = parse_property(text, "-S")
        props[key] = value
    url = url or environ.get(URL_ENV, "").strip() or None
    if url is None:
        if properties:
            raise ConfigError("-S: schema registry properties need --schema-registry URL "
                              f"(or {URL_ENV})")
        return None
    return RegistrySettings(url, props)
