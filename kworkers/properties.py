"""Client properties as operators write them, for every client kworkers configures: the Kafka
clients (``kworkers.kafka.settings``, ``-X key=value``) and the schema registry's
(``kworkers.payloads.settings``, ``-S key=value``).

Below both on purpose: the registry's settings and the Kafka clients' share the key syntax and
the mask, and neither package need import the other for them. Pure: only the standard library.
"""

from __future__ import annotations

import re

from kworkers.errors import ConfigError

__all__ = ["MASK", "PROPERTY_KEY", "parse_property"]

#: What a secret value is shown as, wherever settings are printed.
MASK = "****"
#: A property name: librdkafka's and the registry client's (``security.protocol``,
#: ``basic.auth.user.info``).
PROPERTY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_property(text: str, what: str = "-X") -> tuple[str, str]:
    """``key=value`` (as kcat's ``-X``); the value is never echoed in an error."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not PROPERTY_KEY.fullmatch(key):
        raise ConfigError(f"{what}: expected a librdkafka property as key=value, such as "
                          "security.protocol=SASL_SSL")
    return key, value.strip()
