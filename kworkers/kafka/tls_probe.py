"""A direct TLS handshake with a broker, to say why librdkafka's failed (an adapter module).

Only on the error path: when librdkafka says "certificate verify failed" (which it says alike
for a wrong CA and for a host name the certificate lacks), or when a broker answered nothing
useful within the connect timeout. Python's ``ssl`` uses the same OpenSSL, the same CA file
and the same host name check as the client (``ssl.endpoint.identification.algorithm``), and
its verdict names the cause: "IP address mismatch", "unable to get local issuer certificate",
"certificate has expired". Nothing is sent beyond the handshake; no client certificate is
presented (the broker's certificate is checked before the broker asks for one).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import ssl

from kworkers.kafka.diagnose import Probe
from kworkers.kafka.settings import ClientSettings

PROBE_TIMEOUT = 3.0


def _context(c: ClientSettings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca = c.security.get("ssl.ca.location")
    if ca:
        path = str(ca)
        if os.path.isdir(path):
            ctx.load_verify_locations(capath=path)
        else:
            ctx.load_verify_locations(cafile=path)
    else:
        ctx.load_default_certs()
    algorithm = str(c.security.get("ssl.endpoint.identification.algorithm", "https"))
    ctx.check_hostname = algorithm.lower() != "none"
    return ctx


def probe(c: ClientSettings, host: str, port: int, timeout: float = PROBE_TIMEOUT
          ) -> Probe | None:
    """What a TLS handshake with ``host:port`` shows; None when the port does not answer."""
    try:
        ctx = _context(c)
    except (OSError, ssl.SSLError, ValueError):
        return None  # the client's own settings error says it better
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    with sock:
        try:
            with ctx.wrap_socket(sock, server_hostname=host):
                return Probe(host, tls=True)
        except ssl.SSLCertVerificationError as exc:
            return Probe(host, tls=True, verify=str(exc.verify_message or exc.reason))
        except ssl.SSLError as exc:
            # a plaintext listener reads the ClientHello as a request and hangs up, or
            # answers bytes that are no TLS record
            no_tls = exc.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE",
                                    "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_EOF_WHILE_READING")
            return Probe(host, tls=not no_tls, detail=str(exc.reason or exc))
        except (OSError, TimeoutError) as exc:
            return Probe(host, tls=False, detail=type(exc).__name__)


def expired_on(path: str | None, now: dt.datetime | None = None) -> str | None:
    """The date a PEM certificate file expired on, when it has; None when it is valid now or
    cannot be read (the broker's verdict then stands alone)."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if not path or decode is None:
        return None
    try:
        not_after = decode(path)["notAfter"]
        when = dt.datetime.fromtimestamp(ssl.cert_time_to_seconds(not_after), dt.UTC)
    except (OSError, ssl.SSLError, KeyError, ValueError):
        return None
    now = now or dt.datetime.now(dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M UTC") if when < now else None
