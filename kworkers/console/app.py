"""The console as an ASGI application: routes, the guard every request passes, error pages.

Server-rendered pages (Starlette + Jinja2 with autoescaping), no script: forms and links only,
and a ``<meta refresh>`` on a running redrive's page. Every page reads the broker when it is
asked for, through the same functions as the CLI; nothing is cached, so a page is never stale
and the console holds no state but its redrive jobs.

The guard (``Guard``) runs before every route: the token when there is one (else the loopback
``Host`` check), the session cookie behind the CSRF token, and response headers that keep the
pages out of frames and caches and forbid every script (``Content-Security-Policy``). The one
state-changing request, the redrive POST, checks the CSRF token and ``--read-only`` before it
reads anything else.

Errors are pages: an unreachable broker is a 503 that says which address did not answer, a
missing topic a 404, a malformed filter a 400 naming the field; every message passes the
client settings' redaction, so no secret reaches a page.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from kworkers.console import auth
from kworkers.console.dlq_filter import ConsoleFilter, parse_filter
from kworkers.console.dlq_pages import as_row, cursor_text, read_page
from kworkers.console.groups import group_view, list_groups
from kworkers.console.history import read_history, replayed_lookup
from kworkers.console.jobs import Busy, Jobs
from kworkers.console.record_view import record_view
from kworkers.console.redrive import PLAN_ROWS, plan_redrive, run_redrive
from kworkers.console.settings import UNNAMED, ConsoleSettings
from kworkers.console.workflows import StoreUnavailable, WorkflowTables
from kworkers.dlq.audit import Actor
from kworkers.dlq.format import age_text, bytes_text, iso
from kworkers.dlq.redrive import read_audit
from kworkers.dlq.redrive_plan import ledger_key
from kworkers.errors import ConfigError, KworkersError
from kworkers.kafka import clients
from kworkers.kafka.clients import KafkaUnreachable, TopicNotFound, require_topic
from kworkers.kafka.offsets import topic_watermarks
from kworkers.kafka.reader import ReadTimeout, read_record
from kworkers.topic_names import DLQ_SUFFIX, ledger_topic
from kworkers.workflow.state import STATUSES

log = logging.getLogger("kworkers.console")
HERE = Path(__file__).resolve().parent
#: The record page looks this far back in the ledger for "replayed since".
RECORD_LEDGER_LOOKBACK = 2_000

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # not no-referrer: with it Chromium sends "Origin: null" on the console's own form posts
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _query(items: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in items:
        out.setdefault(k, []).append(v)
    return out


def _url(path: str, params: Sequence[tuple[str, str]]) -> str:
    return f"{path}?{urlencode(list(params))}" if params else path


class Guard(BaseHTTPMiddleware):
    """Token (or loopback ``Host``), session cookie and CSRF token, security headers."""

    def __init__(self, app: Any, settings: ConsoleSettings, secret: bytes,
                 pages: Jinja2Templates) -> None:
        super().__init__(app)
        self.settings = settings
        self.secret = secret
        self.pages = pages

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        tokens = self.settings.credentials
        request.state.operator = None
        if tokens:
            operator = auth.identify(request.headers.get("authorization"), tokens)
            if operator is None:
                who = ("your operator name" if self.settings.tokens else "any user name")
                return self._refuse(request, 401, "Token required", "This console needs a "
                                    "token: the password of the browser's sign-in dialog "
                                    f"({who} as the user name), or an 'Authorization: Bearer' "
                                    "header.",
                                    {"WWW-Authenticate": 'Basic realm="kworkers console", '
                                                         'charset="UTF-8"'})
            request.state.operator = operator
        elif not auth.loopback_host(request.headers.get("host")):
            return self._refuse(request, 403, "Loopback only", "This console has no token, so "
                                "it answers only requests addressed to 127.0.0.1, [::1] or "
                                "localhost.")
        session = request.cookies.get(auth.SESSION_COOKIE, "")
        fresh = not (16 <= len(session) <= 64 and session.replace("-", "").replace(
            "_", "").isalnum())
        if fresh:
            session = auth.new_session()
        request.state.session = session
        request.state.csrf = auth.csrf_token(self.secret, session)
        if request.method not in ("GET", "HEAD", "POST"):
            response: Response = self._refuse(request, 405, "Method not allowed",
                                              f"{request.method} is not served here.")
        else:
            response = await call_next(request)
        if fresh:
            response.set_cookie(auth.SESSION_COOKIE, session, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https", path="/")
        for k, v in SECURITY_HEADERS.items():
            response.headers.setdefault(k, v)
        return response

    def _refuse(self, request: Request, status: int, title: str, message: str,
                headers: Mapping[str, str] | None = None) -> Response:
        response = self.pages.TemplateResponse(
            request, "error.html", {"status": status, "title": title, "message": message,
                                    "hint": None, "settings": self.settings, "csrf": "",
                                    "nav": ""},
            status_code=status, headers=dict(headers or {}))
        for k, v in SECURITY_HEADERS.items():
            response.headers.setdefault(k, v)
        return response


def _templates(settings: ConsoleSettings) -> Jinja2Templates:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(iso=iso, age=age_text, shown=bytes_text, url=_url,
                       number=lambda n: f"{n:,}")
    env.globals.update(settings=settings, cluster=settings.client.bootstrap_servers,
                       cluster_props=settings.client.masked())
    return Jinja2Templates(env=env)


def create_app(settings: ConsoleSettings, *, jobs: Jobs | None = None,
               secret: bytes | None = None) -> Starlette:
    """The console for ``settings``. ``secret`` signs CSRF tokens (default: a fresh one)."""
    s = settings
    client = s.client
    pages = _templates(s)
    work = jobs or Jobs()
    guard_secret = secret or auth.new_secret()
    flows = (None if s.workflow_store is None
             else WorkflowTables(s.workflow_store, s.workflow_tables))

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("csrf", getattr(request.state, "csrf", ""))
        context.setdefault("now", time.time())
        context.setdefault("nav", "")
        context.setdefault("status", status)
        return pages.TemplateResponse(request, name, {"settings": s, **context},
                                      status_code=status)

    def preflight() -> dict[str, int]:
        """The topics, and proof the broker answers (within the console's connect timeout)."""
        return clients.list_topics(client, timeout=s.connect_timeout)

    # --- pages ---------------------------------------------------------------------------

    def home(request: Request) -> Response:
        return RedirectResponse("/groups", status_code=303)

    def groups(request: Request) -> Response:
        preflight()
        return page(request, "groups.html", groups=list_groups(s), nav="groups")

    def group(request: Request) -> Response:
        name = request.path_params["group"]
        preflight()
        view = group_view(s, name)
        if view.main is None and not any(m.members for m in view.members) and all(
                m.state in ("dead", "unknown") for m in view.members):
            raise HTTPException(404, f"no consumer group {name!r} on {s.client.bootstrap_servers}"
                                     " (no members, no committed offsets)")
        return page(request, "group.html", view=view, nav="groups")

    def dlqs(request: Request) -> Response:
        have = preflight()
        names = {t: n for t, n in sorted(have.items()) if t.endswith(DLQ_SUFFIX)}
        marks = topic_watermarks(client, names)
        rows = [(t, n, sum(hi - lo for lo, hi in marks[t]), ledger_topic(t) in have)
                for t, n in names.items()]
        return page(request, "dlqs.html", rows=rows, nav="dlq")

    def dlq(request: Request) -> Response:
        topic = request.path_params["topic"]
        preflight()
        flt = parse_filter(_query(request.query_params.multi_items()))
        cursor = request.query_params.get("from") or None
        got = read_page(client, topic, flt, cursor, s.page_size, s.scan_bound)
        base = [(k, v) for k, v in flt.query() if k not in ("sel", "upto")]
        history = read_history(client, topic, RECORD_LEDGER_LOOKBACK)  # the redriven marks
        marks = replayed_lookup(history)
        redriven = {(r.message.partition, r.message.offset): marks.get(ledger_key(r.dead))
                    for r in got.rows if r.dead is not None}
        return page(request, "dlq.html", topic=topic, page=got, filter=flt, base=base,
                    redriven=redriven, history=history, lookback=RECORD_LEDGER_LOOKBACK,
                    next_url=None if got.next is None else _url(
                        f"/dlq/{topic}", [*base, ("from", cursor_text(got.next))]),
                    nav="dlq")

    def record(request: Request) -> Response:
        topic = request.path_params["topic"]
        p, o = request.path_params["partition"], request.path_params["offset"]
        preflight()
        require_topic(client, topic, hint="is the DLQ name <topic>.dlq?")
        row = as_row(read_record(client, topic, p, o))
        dead = row.dead
        replayed = None
        history = read_history(client, topic, RECORD_LEDGER_LOOKBACK)
        if dead is not None:
            mark = replayed_lookup(history).get(ledger_key(dead))
            if mark is not None:
                where = f"{mark.target}" + ("" if mark.target_partition is None
                                            else f"/{mark.target_partition}")
                replayed = (mark.at, where)
        through = None
        if s.registry is not None:
            from kworkers.kafka.schema_registry import describe, registry_client

            through = describe(registry_client(s.registry), row.message.value, s.registry)
        view = record_view(row.message, dead, row.problem, s.avro_schema, replayed, through)
        return page(request, "record.html", topic=topic, view=view, history=history,
                    replayed=replayed is not None, lookback=RECORD_LEDGER_LOOKBACK, nav="dlq")

    def plan(request: Request) -> Response:
        topic = request.path_params["topic"]
        preflight()
        flt = parse_filter(_query(request.query_params.multi_items()))
        if request.query_params.get("selection") and flt.records is None:
            raise ConfigError("no dead letter selected: tick at least one, or plan the whole "
                              "filter")
        target = (request.query_params.get("to") or "").strip() or None
        got = plan_redrive(client, topic, flt, target)
        back = [(k, v) for k, v in flt.query() if k not in ("sel", "upto")]
        return page(request, "plan.html", topic=topic, plan=got, rows=got.rows[:PLAN_ROWS],
                    rows_max=PLAN_ROWS,
                    hidden=[*got.filter.query(), *([("to", target)] if target else [])],
                    back=back, nav="dlq")

    async def redrive(request: Request) -> Response:
        topic = request.path_params["topic"]
        form = await request.form()
        items = [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
        fields = _query(items)
        problem = auth.csrf_problem(
            guard_secret, request.state.session, next(iter(fields.get(auth.CSRF_FIELD, [])), None),
            request.headers.get("origin"), f"{request.url.scheme}://{request.url.netloc}")
        if problem is not None:
            return page(request, "error.html", 403, title="CSRF check failed",
                        message=f"Redrive refused: {problem}. Nothing was replayed.",
                        hint="Start the redrive from its plan page in this console.")
        if s.read_only:
            return page(request, "error.html", 403, title="Read-only console",
                        message="Redrive refused: this console runs with --read-only. "
                                "Nothing was replayed.", hint=None)
        flt = parse_filter(fields)
        if flt.upto is None:
            raise ConfigError("a redrive is confirmed from its dry-run plan (the form carries "
                              "the end of the DLQ the plan read)")
        target = (fields.get("to") or [""])[0].strip() or None
        what = _describe(flt, target)

        actor = _operator(request.state.operator)

        def run(progress: Callable[[int, int], None]) -> Any:
            return run_redrive(client, topic, flt, target, progress, actor, what)

        await run_in_threadpool(preflight)
        job = work.start(topic, what, run, client.redact)
        return RedirectResponse(f"/jobs/{job.id}", status_code=303)

    def workflow_list(request: Request) -> Response:
        if flows is None:
            return page(request, "workflows.html", runs=None, nav="workflows")
        status = (request.query_params.get("status") or "").strip() or None
        name = (request.query_params.get("workflow") or "").strip() or None
        return page(request, "workflows.html", runs=flows.runs(status, name), status_filter=status,
                    workflow=name, statuses=STATUSES, nav="workflows")

    def workflow_run(request: Request) -> Response:
        if flows is None:
            return RedirectResponse("/workflows", status_code=303)
        wid = request.path_params["workflow_id"]
        detail = flows.run(wid)
        if detail is None:
            raise HTTPException(404, f"no workflow run {wid!r} in the workflow store")
        return page(request, "workflow.html", detail=detail, nav="workflows")

    def job(request: Request) -> Response:
        found = work.get(request.path_params["job"])
        if found is None:
            raise HTTPException(404, "no such redrive in this console (jobs are kept in "
                                     "memory; the History page has every replay)")
        return page(request, "job.html", job=found, nav="dlq")

    def history(request: Request) -> Response:
        topic = request.path_params["topic"]
        preflight()
        require_topic(client, topic, hint="is the DLQ name <topic>.dlq?")
        return page(request, "history.html", topic=topic, history=read_history(client, topic),
                    jobs=work.recent(topic), audit=read_audit(client, topic), nav="dlq")

    # --- errors --------------------------------------------------------------------------

    def failed(status: int, title: str, hint: str | None = None
               ) -> Callable[[Request, Exception], Response]:
        def handler(request: Request, exc: Exception) -> Response:
            message = client.redact(" ".join(str(exc).split()))
            return page(request, "error.html", status, title=title, message=message,
                        hint=hint)
        return handler

    def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return page(request, "error.html", exc.status_code,
                    title="Not found" if exc.status_code == 404 else "Error",
                    message=client.redact(str(exc.detail)), hint=None)

    def crashed(request: Request, exc: Exception) -> Response:
        log.exception("console page %s failed", request.url.path)
        return page(request, "error.html", 500, title="Internal error",
                    message=client.redact(f"{type(exc).__name__}: {exc}"),
                    hint="This is a bug in the console; the server log has the traceback.")

    handlers: dict[Any, Callable[[Request, Exception], Response]] = {
        HTTPException: http_error,
        KafkaUnreachable: failed(503, "Kafka is unreachable",
                                 "Check the bootstrap address and client settings the console "
                                 "was started with; every page reads the broker again."),
        TopicNotFound: failed(404, "Topic not found"),
        Busy: failed(409, "A redrive is already running"),
        StoreUnavailable: failed(503, "The workflow store is unavailable",
                                 "Check --workflow-store (its URL is never shown here)."),
        ReadTimeout: failed(504, "The broker did not answer in time"),
        ConfigError: failed(400, "Cannot do that"),
        KworkersError: failed(500, "The operation failed"),
        Exception: crashed,
    }
    routes = [
        Route("/", home),
        Route("/groups", groups),
        Route("/groups/{group}", group),
        Route("/dlq", dlqs),
        Route("/dlq/{topic}", dlq),
        Route("/dlq/{topic}/record/{partition:int}/{offset:int}", record),
        Route("/dlq/{topic}/plan", plan),
        Route("/dlq/{topic}/redrive", redrive, methods=["POST"]),
        Route("/dlq/{topic}/history", history),
        Route("/jobs/{job}", job),
        Route("/workflows", workflow_list),
        Route("/workflows/{workflow_id:path}", workflow_run),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, exception_handlers=handlers, middleware=[
        Middleware(Guard, settings=s, secret=guard_secret, pages=pages)])


def _operator(name: str | None) -> Actor:
    """Who the audit names for a console redrive: the operator's token name, the unnamed
    token, or (no token: a loopback console) whoever runs the console process."""
    if name is None:
        me = Actor.of_process("console")
        return Actor(f"{me.who} (loopback console, no token)", "console")
    return Actor(name if name != UNNAMED else "the console token (unnamed)", "console")


def _describe(flt: ConsoleFilter, target: str | None) -> str:
    parts = [f"{k}={v}" for k, v in flt.query() if k not in ("sel", "upto")]
    if flt.records is not None:
        parts.append(f"{len(flt.records)} selected records")
    if target:
        parts.append(f"to {target}")
    return ", ".join(parts) or "every dead letter"
