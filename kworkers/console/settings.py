"""What a console serves and how it is exposed: one frozen value, and the exposure rule.

Why the rule lives here and not in the server: a console can replay dead letters into
production topics, so who can reach it matters as much as what it shows. Bound to a loopback
address it is reachable only from this machine (and ``Host`` is checked, so a web page cannot
reach it through DNS rebinding); bound to anything else it needs a token. That is decided
before a socket is opened, from the address alone, and tested without a server.

Pure: nothing here imports the web stack or a client library.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from kworkers.errors import ConfigError
from kworkers.kafka.settings import MASK, ClientSettings
from kworkers.keda import RENDERED_LAG_THRESHOLD
from kworkers.payloads.settings import RegistrySettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: Records one dead-letter page reads from the broker at most, across its partitions.
DEFAULT_SCAN_BOUND = 2_000
DEFAULT_PAGE_SIZE = 50
#: A token shorter than this is refused: it guards replays into production topics.
MIN_TOKEN_LENGTH = 16
TOKEN_ENV = "KWORKERS_CONSOLE_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the console on this machine.

    ``localhost`` and loopback addresses are; the wildcard addresses (``0.0.0.0``, ``::``)
    and every other name or address are not (a name could resolve anywhere).
    """
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


#: the name an unnamed token (``KWORKERS_CONSOLE_TOKEN``, a one-line token file) stands for
UNNAMED = "token"
_OPERATOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


def parse_tokens(text: str, where: str) -> tuple[str | None, dict[str, str]]:
    """A token file: one bare token (unnamed), or ``NAME:TOKEN`` lines, one per operator
    (``#`` comments, blank lines). Named tokens make the audit name who redrove what."""
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.strip().startswith("#")]
    if not lines:
        raise ConfigError(f"{where}: the file is empty")
    if len(lines) == 1 and ":" not in lines[0]:
        return lines[0], {}
    named: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        name, sep, token = line.partition(":")
        if not sep or not _OPERATOR.fullmatch(name.strip()) or not token.strip():
            raise ConfigError(f"{where}: entry {n}: expected NAME:TOKEN (one operator a line)")
        if name.strip() in named:
            raise ConfigError(f"{where}: {name.strip()!r} is named twice")
        named[name.strip()] = token.strip()
    return None, named


def check_exposure(host: str, tokens: Collection[str]) -> None:
    """Refuse a console reachable from other machines without a token, or a weak token."""
    for token in tokens:
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"console token: at least {MIN_TOKEN_LENGTH} characters, got "
                              f"{len(token)}")
    if len(set(tokens)) != len(list(tokens)):
        raise ConfigError("console tokens: two operators share a token (the audit could not "
                          "tell them apart)")
    if not tokens and not is_loopback(host):
        raise ConfigError(f"binding the console to {host} makes it reachable from other "
                          f"machines: set a token ({TOKEN_ENV} or --token-file), or bind to "
                          "127.0.0.1")


@dataclass(frozen=True, repr=False)
class ConsoleSettings:
    """Everything ``kworkers console`` was told; the token never appears in ``repr``.

    ``metrics_urls``: worker ``/metrics`` endpoints the Groups page reads the breaker state
    from. ``groups``: show only these worker groups (default: every group). ``avro_schema``:
    the parsed writer schema dead-letter values are decoded with, when one is configured;
    ``registry``: the schema registry Confluent-framed values are decoded through.
    KEDA's trigger: ``lag_threshold``, ``min_replicas``, ``max_replicas`` (None: the
    partition count, the most replicas that can have work). ``workflow_store``: where the
    Workflows pages read the engine's tables (None: the pages say how to configure it).
    """

    client: ClientSettings
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    read_only: bool = False
    token: str | None = None
    #: named tokens, operator name -> token (a token file of NAME:TOKEN lines)
    tokens: Mapping[str, str] = field(default_factory=dict)
    metrics_urls: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    avro_schema: object | None = None
    registry: RegistrySettings | None = None
    scan_bound: int = DEFAULT_SCAN_BOUND
    page_size: int = DEFAULT_PAGE_SIZE
    lag_threshold: int = RENDERED_LAG_THRESHOLD
    min_replicas: int = 0
    max_replicas: int | None = None
    connect_timeout: float = 10.0
    #: the durable workflows' store URL (may hold a password: never shown) and table prefix
    workflow_store: str | None = None
    workflow_tables: str = "kworkers_wf"

    def __post_init__(self) -> None:
        check_exposure(self.host, list(self.credentials.values()))
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: 0..65535, got {self.port}")
        if self.page_size < 1 or self.scan_bound < self.page_size:
            raise ConfigError(f"scan bound ({self.scan_bound}) must be >= page size "
                              f"({self.page_size}) >= 1")
        if self.lag_threshold < 1 or self.min_replicas < 0 or (
                self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas)):
            raise ConfigError("KEDA settings: need lag threshold >= 1 and 0 <= min <= max, "
                              "max >= 1")
        for url in self.metrics_urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"metrics URL {url!r}: expected http(s)://host:port/metrics")

    @property
    def credentials(self) -> dict[str, str]:
        """Every token the console accepts, by the name the audit records for it."""
        return {**({UNNAMED: self.token} if self.token is not None else {}), **self.tokens}

    @property
    def loopback_only(self) -> bool:
        return is_loopback(self.host)

    def __repr__(self) -> str:
        token = None if not self.credentials else MASK
        return (f"ConsoleSettings({self.client!r}, host={self.host!r}, port={self.port}, "
                f"read_only={self.read_only}, token={token!r})")
