"""Who may use the console, and proof that a state-changing request came from its own pages.

Pure functions on header values; ``kworkers.console.app`` applies them to every request.

- **Token.** When the console has one, every request carries it: ``Authorization: Bearer
  <token>`` (scripts, curl), or HTTP Basic with the token as the password, so a browser asks
  for it with its own dialog and the pages need no script. Compared in constant time. With
  named tokens (one per operator) the token says who is asking, and Basic's user name must be
  that name; the redrive audit records it. One unnamed token takes any user name (and the
  audit records only "token": a typed name proves nothing).
- **Host.** A console without a token is on loopback; it answers only requests whose ``Host``
  names a loopback address, so a web page cannot reach it by pointing a name of its own at
  127.0.0.1 (DNS rebinding).
- **CSRF.** A redrive is the one request that changes anything, and it is a POST. Each browser
  gets a random session cookie (``HttpOnly``, ``SameSite=Strict``); the form carries
  ``HMAC(server secret, session)``. A page on another site can make the browser send the
  cookie (a different port on the same host is the same site) but cannot read the page to
  learn the form's value, so its POST fails the check. A request that says where it comes from
  (``Origin``) must come from the console itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from kworkers.console.settings import UNNAMED, is_loopback

SESSION_COOKIE = "kw_console_session"
CSRF_FIELD = "csrf_token"


def new_secret() -> bytes:
    """A server secret: a fresh one per process, so a restart invalidates old forms."""
    return secrets.token_bytes(32)


def new_session() -> str:
    return secrets.token_urlsafe(24)


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def identify(authorization: str | None, tokens: Mapping[str, str]) -> str | None:
    """The name of the token an ``Authorization`` header carries (``tokens``: name ->
    token), or None. Every token is compared, in constant time, whichever matches."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    user: str | None = None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, value = decoded.partition(":")
        if not sep:
            return None
    elif scheme.lower() != "bearer":
        return None
    found = None
    for name, token in tokens.items():
        if _same(value, token) and found is None:
            found = name
    if found is None or (user is not None and found != UNNAMED and user != found):
        return None
    return found


def loopback_host(host_header: str | None) -> bool:
    """Whether a ``Host`` header names a loopback address (with or without a port)."""
    if not host_header:
        return False
    name = urlsplit(f"//{host_header.strip()}").hostname
    return name is not None and is_loopback(name)


def csrf_token(secret: bytes, session: str) -> str:
    """The form value that proves a POST came from a page this console served to ``session``."""
    return hmac.new(secret, session.encode("utf-8"), hashlib.sha256).hexdigest()


def csrf_problem(secret: bytes, session: str | None, submitted: str | None,
                 origin: str | None, own_origin: str) -> str | None:
    """None when the POST passes the CSRF check, else why it does not (shown to the user)."""
    if origin is not None and origin != "null" and origin.rstrip("/") != own_origin:
        return f"the request came from another site ({origin})"
    if origin == "null":
        return "the request came from an opaque origin"
    if not session:
        return "the session cookie is missing (are cookies blocked?)"
    if not submitted:
        return "the form carries no CSRF token"
    if not _same(submitted, csrf_token(secret, session)):
        return "the form's CSRF token does not match this session (reload the page)"
    return None
