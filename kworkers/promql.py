"""PromQL the query builders share: the label-value check every one makes, and ``new_in``.

Why one place: a group id is the operator's text, and the queries built from it (the share
and drainable-lag triggers, the dashboard, the alerts) put it between double quotes in a label
matcher. A quote, a backslash or a newline would end the string early or need escaping that
KEDA, Grafana and Prometheus' rule files each treat their own way; an empty one matches every
series without the label. Such a value is refused, in one line (``ConfigError``: the CLI's exit
2), before anything is rendered, rather than escaped into a query nobody can read back.
"""

from __future__ import annotations

from kworkers.errors import ConfigError

#: what a label value in a rendered query may not hold
UNQUOTABLE = ('"', "\\", "\n")


def quoted(value: str, what: str = "group") -> str:
    """``value`` as a PromQL string (``"value"``); ``ConfigError`` when it cannot be one."""
    if not value or any(c in value for c in UNQUOTABLE):
        raise ConfigError(f"{what}: cannot be quoted in a PromQL label matcher: {value!r}")
    return f'"{value}"'


def new_in(counter: str, window: str) -> str:
    """What ``counter`` counted in ``window``, a series born in it included.

    A counter whose labels are known only when it first counts (``kworkers_dead_letters_total``
    by error type) is born at its first value, and ``increase`` sees no increase in a series'
    first sample: the first dead letters of a new error type would never fire. A series with
    no sample ``window`` ago counts its whole value; the others their ``increase``."""
    born = f"({counter} unless {counter} offset {window})"
    return f"(increase({counter}[{window}]) unless {born}) or {born}"
