"""Label values written into PromQL: the one check every query builder makes.

Why one place: a group id is the operator's text, and the queries built from it (the share
and drainable-lag triggers, the dashboard, the alerts) put it between double quotes in a label
matcher. A quote, a backslash or a newline would end the string early or need escaping that
KEDA, Grafana and Prometheus' rule files each treat their own way; an empty one matches every
series without the label. Such a value is refused, in one line (``ConfigError``: the CLI's exit
2), before anything is rendered, rather than escaped into a query nobody can read back.
"""

from __future__ import annotations

from collections.abc import Iterable

from kworkers.errors import ConfigError

#: what a label value in a rendered query may not hold
UNQUOTABLE = ('"', "\\", "\n")


def quoted(value: str, what: str = "group") -> str:
    """``value`` as a PromQL string (``"value"``); ``ConfigError`` when it cannot be one."""
    if not value or any(c in value for c in UNQUOTABLE):
        raise ConfigError(f"{what}: cannot be quoted in a PromQL label matcher: {value!r}")
    return f'"{value}"'


def check_all(values: Iterable[str], what: str = "group") -> tuple[str, ...]:
    """Every value checked (``quoted``), returned as given."""
    out = tuple(values)
    for v in out:
        quoted(v, what)
    return out
