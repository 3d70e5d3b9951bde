"""The engine's pages: runs, a run's story, dead letters and callbacks for the
operator; live by SSE. Apps bring their own pages on top (the review's projects and
reviews: agentbox.review.web), with these templates, banners and CSRF token
(`page`, `error`, `run_context`), and may tell the runs of their agents
(`run_pages`).

Server-rendered HTML (jinja2, autoescaped), a little vanilla JavaScript, no
CDN: it works on a machine without internet. Live updates come from
`/ui/stream` (Server-Sent Events); the browser reconnects by itself after a
server restart.

Safety: every page, stream and admin call needs the admin token, on loopback
too (a session's cookie set by the login form or a one-time login link, or
`Authorization: Bearer`): agentbox.http.access. State-changing
actions are POST forms carrying a CSRF token, and a request from another
origin is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import html
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader, select_autoescape
from markupsafe import escape
from sse_starlette.sse import EventSourceResponse
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbox.config import Settings
from agentbox.engine.callbacks import SUBSCRIPTION_DESTINATION
from agentbox.engine.dispatcher import Dispatcher
from agentbox.engine.subscriptions import agent_sets
from agentbox.http.access import (
    CSRF_FAILED,
    LOGIN_LINK_PATH,
    LOGIN_LINK_SECONDS,
    Access,
    TooManyLogins,
    bearer,
    from_this_site,
    page_token_ok,
    token_required,
)
from agentbox.http.errors import error_response
from agentbox.http.server import stopping
from agentbox.models import LoginLink
from agentbox.runs import RunStatus
from agentbox.store import (
    NotReplayable,
    RunNotFound,
    RunView,
    Schema,
    StorageUnavailable,
    Store,
    Transition,
)

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"  # the engine's pages' stylesheet and script
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".svg": "image/svg+xml", ".png": "image/png", ".woff2": "font/woff2"}
PAGE_SIZE = 50
MAX_FORM_BYTES = 64 * 1024
STATS_EVERY_SECONDS = 2.0
SUBSCRIBER_BACKLOG = 1000
SECRET_KEYS = re.compile(r"secret|token|signature|password|passwd|api[_-]?key|authorization|"
                         r"credential|cookie", re.IGNORECASE)
RANGES = (("3600", "last hour"), ("86400", "last day"), ("604800", "last week"))
# The run list's own filters; the apps' join them (StatusPages.add_run_fields).
RUN_FILTERS = ("q", "status", "event_type", "agent", "since", "before")


# An app's page of a run (agentbox.apps.Host.add_run_page): None when not its run.
RunPage = Callable[[Request, str, "RunView | None"], Awaitable["Response | None"]]
# Where a value of an app's run field links to (agentbox.apps.Host.add_run_field_link).
FieldLink = Callable[[str], str]


@dataclass
class RunField:
    """A field an app adds to a run's view (its tables' `run_fields`), as the run list
    shows it: a column (`label`), a filter input if the app's search has a filter of
    its name, its values linked with `link` if the app gave one."""

    name: str
    label: str
    filter: bool = False
    link: FieldLink | None = None


class Live:
    """Fans run transitions out to every open page."""

    def __init__(self) -> None:
        self.subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    def transition(self, t: Transition) -> None:
        message = {"run_id": t.run_id, "status": t.status, "event_type": t.event_type,
                   "agent": t.agent, "event_id": t.event_id}
        for queue in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):  # a stalled page misses updates
                queue.put_nowait(message)


class StatusPages:
    def __init__(self, settings: Settings, store: Store, dispatcher: Dispatcher,
                 access: Access) -> None:
        self.settings = settings
        self.store = store
        self.dispatcher = dispatcher
        self.access = access
        # Apps' pages of their runs (agentbox.apps.Host.add_run_page), asked in order.
        self.run_pages: list[RunPage] = []
        # Apps' links in the menu (agentbox.apps.Host.add_menu_link), before the engine's.
        self.menu: list[dict[str, str]] = []
        # Apps' fields of a run, in the run list (add_run_fields), and what its search
        # box's text finds beside run ids and event ids (their labels, lowercase).
        self.run_fields: list[RunField] = []
        self.run_filters: list[str] = []  # the apps' filters that are no field of a run
        self.searched: list[str] = []
        # Apps' figures for the live stream's stats (a watched folder's state, say).
        self.stats_extras: list[Callable[[], dict[str, Any]]] = []
        self.live = Live()
        self.csrf = secrets.token_urlsafe(24)  # per process: forms from a previous life fail
        self.alerts: list[str] = []  # on every page: what stops exports being stored
        self.operator_alerts: list[str] = []  # in the operations area: what needs a decision
        self.env = page_templates()
        self.env.globals["logout"] = True  # a session to end, on loopback too
        self.env.globals["menu"] = self.menu

    def add_run_fields(self, schema: Schema) -> None:
        """An app's tables' fields of a run and filters of the run search, in the run
        list: a column each, and a filter input each (the search box's `text` filter
        widens the box)."""
        for name in schema.run_fields:
            label = name.replace("_", " ").capitalize()
            self.run_fields.append(RunField(name, label, filter=name in schema.filters))
            if "text" in schema.filters:
                self.searched.append(label.lower())
        self.run_filters += [name for name in schema.filters
                             if name != "text" and name not in schema.run_fields]

    def link_run_field(self, name: str, link: FieldLink) -> None:
        """Link each value of the run field `name` in the run list to `link(value)`."""
        for each in self.run_fields:
            if each.name == name:
                each.link = link

    def add_app_files(self, app: str, templates: Path | None, static: Path | None) -> None:
        """An app's templates and static files, under its name (`add_app_files`)."""
        add_app_files(self.env, app, templates, static)

    @property
    def static(self) -> dict[str, Path]:
        """Each app's folder of static files, by the app's name."""
        folders: dict[str, Path] = self.env.globals["static_folders"]  # type: ignore[assignment]
        return folders

    async def app_asset(self, request: Request) -> Response:
        """`GET /static/{app}/{name}`: a file an app ships with its pages."""
        return _asset_answer(request, f"{request.path_params['app']}/"
                                      f"{request.path_params['name']}", self.static)

    # -- access (the rules are agentbox.http.access's) -----------------------------------

    @property
    def open_to_this_machine(self) -> bool:
        return self.access.open_to_this_machine

    def login_page(self, why: str | None = None) -> Response:
        return self.page("login.html", status_code=401, logout=False, why=why)

    async def login(self, request: Request) -> Response:
        """`POST /ui/login`: the admin token traded for a session, on the page's private
        name alone (at 127.0.0.1 or localhost the right token sends the browser there
        by a new one-time link, and sets no cookie here)."""
        form = await _form(request)
        try:
            right = await self.access.log_in(request, (form.get("token") or [""])[0])
        except TooManyLogins as exc:
            return self.error(429, "Too many wrong tokens from here: wait a minute and try "
                                    "again.", {"Retry-After": str(round(exc.retry_after))})
        if not right:
            return self.login_page("That is not the admin token.")
        if not self.access.on_page_name(request.scope):
            # A page that goes on, not a redirect: the page's form-action 'self' would
            # stop a form's redirect to another origin.
            return forward(self.access.page_url_of(request) + self.access.login_path())
        response = RedirectResponse("/", status_code=303)
        self.access.session_cookie(response, request, self.access.sessions.start())
        return response

    async def login_link(self, request: Request) -> Response:
        """`GET /ui/login?code=...[&next=/path]`: a one-time login link (agentbox open,
        the tray) trades its code for a session, once, then shows `next` (a path of
        this site only); a used or expired one asks for the token. A working link used
        at 127.0.0.1 or localhost sends the browser to the same link on the page's
        private name first (not used up there); `GET /ui/login` alone is the form."""
        code = request.query_params.get("code")
        if code is None:
            return self.login_page()
        if self.access.links.waiting(code) and not self.access.on_page_name(request.scope):
            return self.access.moved(request, f"{LOGIN_LINK_PATH}?{request.url.query}")
        if not self.access.on_page_name(request.scope) or not self.access.links.use(code):
            return self.login_page("This login link was used already or has expired (a link "
                                   "works once, within minutes): run agentbox open for a "
                                   "new one.")
        after = request.query_params.get("next", "/")
        local = after.startswith("/") and not after.startswith(("//", "/\\"))
        response: Response = RedirectResponse(after if local else "/", status_code=303)
        if request.headers.get("sec-fetch-site", "none") not in ("none", "same-origin"):
            # Come from elsewhere (agentbox open's file): a redirect would still be that
            # navigation, which a browser sends no SameSite=Strict cookie with; a
            # refresh from this page is this site's own.
            response = forward(after if local else "/")
        self.access.session_cookie(response, request, self.access.sessions.start())
        return response

    async def new_login_link(self, request: Request) -> Response:
        """`POST /login-links` (the admin token as a Bearer token; a session is not
        enough): a one-time login link to this page."""
        if not self.access.token_is(bearer(request) or ""):
            return token_required()
        link = LoginLink(url=self.access.login_link(self.access.page_url_of(request)),
                         expires_in_seconds=LOGIN_LINK_SECONDS)
        return JSONResponse(link.as_json(), status_code=201)

    async def login_link_used(self, request: Request) -> Response:
        """`GET /login-links/{link_id}` (the admin token): whether the one-time link of
        that id (the SHA-256 of its code, 32 hexadecimal digits) was used yet."""
        if not self.access.token_is(bearer(request) or ""):
            return token_required()
        used = self.access.links.used(request.path_params["link_id"])
        if used is None:
            return error_response(404, "login_link_not_found", (
                "No login link of that id is waiting or used: it expired, or was never "
                "made."))
        return JSONResponse({"used": used}, headers={"Cache-Control": "no-store"})

    async def logout(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        response = RedirectResponse("/", status_code=303)
        self.access.log_out(request, response)
        return response

    async def _checked_form(self, request: Request) -> dict[str, Any] | Response:
        """The form of a state-changing POST, or the refusal (CSRF, origin)."""
        if not from_this_site(request.headers):
            return self.error(403, "This action must come from agentbox's own page.")
        form = await _form(request)
        if not page_token_ok(request, (form.get("csrf") or [""])[0], self.csrf):
            return self.error(403, CSRF_FAILED)
        return {"run_ids": form.get("run_id", [])[:500],
                "reason": (form.get("reason") or [""])[0][:500]}

    # -- pages ----------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        """`/` when no app has a home page of its own: the operator's runs."""
        return RedirectResponse("/ui/runs" + (f"?{request.url.query}" if request.url.query
                                              else ""), status_code=307)

    async def runs(self, request: Request) -> Response:
        """The operator's view: queue health, runs with filters."""
        await self.refresh_alerts()
        q = request.query_params
        # Bounded, but past the longest name there is: cut shorter, a longer search
        # could find what it is not (a name of its first 256 characters).
        asked_of_apps = [*(f.name for f in self.run_fields if f.filter), *self.run_filters]
        query = {k: (q.get(k) or "").strip()[:1024] or None
                 for k in (*RUN_FILTERS, *asked_of_apps)}
        if query["status"] not in {s.value for s in RunStatus}:
            query["status"] = None
        now = time.time()
        window = query["since"] or ""
        since = now - float(window) if window.isascii() and window.isdigit() else None
        runs = await self.store.search_runs(
            status=query["status"], event_type=query["event_type"], agent=query["agent"],
            text=query["q"], since=since, before=query["before"], limit=PAGE_SIZE,
            filters={name: query[name] for name in asked_of_apps})
        stats = await self.store.stats()
        filtered = any(v for k, v in query.items() if k != "before")
        next_page = None
        if len(runs) == PAGE_SIZE:
            params = {k: v for k, v in query.items() if v and k != "before"}
            next_page = "/ui/runs?" + urlencode({**params, "before": runs[-1]["run_id"]})
        finished = await self._finished_per_interval(now)
        return self.page(
            "index.html", area="operations", request=request, runs=runs, stats=stats,
            query=query, run_fields=self.run_fields, run_filters=self.run_filters,
            searched=_either(["run_id", "event_id", *self.searched]),
            statuses=[s.value for s in RunStatus], ranges=RANGES, filtered=filtered,
            event_types=sorted(self.dispatcher.registry.event_types()),
            agents=sorted(self.dispatcher.registry.agent_names()),
            oldest_waiting=age(stats["oldest_waiting_accepted_at"], now),
            throughput=_bars(finished), finished_last_hour=sum(finished),
            live_rows=not filtered and not query["before"], next_page=next_page)

    async def run(self, request: Request) -> Response:
        """A run's page: an app's, when one tells the runs of its agents (`run_pages`),
        else the engine's."""
        await self.refresh_alerts()
        run_id = request.path_params["run_id"]
        found_run = await self.store.get_run(run_id)
        for page in self.run_pages:
            told = await page(request, run_id, found_run)
            if told is not None:
                return told
        if found_run is None:
            return self.error(404, f"No run has the id {run_id[:100]!r}.")
        return self.page("run.html", **await self.run_context(found_run))

    async def run_context(self, found_run: RunView) -> dict[str, Any]:
        """What run.html shows of a run (an app's run page adds its own)."""
        run_id = found_run.run_id
        run = {**dict(found_run), "callbacks": await self.store.notifications(run_id)}
        chain_id = run["correlation_id"] or run["event_id"]
        chain = await self.store.search_runs(chain=chain_id, limit=200)
        chain.sort(key=lambda r: (r["hop"], r["run_id"]))
        return {"run": run, "event": redact(await self.store.event_of(run_id) or {}),
                "chain": chain, "history": await self.store.history(run_id),
                "attempts": await self.store.attempts(run_id),
                "discarded": await self.store.discarded(run_id)}

    async def dead_letters(self, request: Request) -> Response:
        await self.refresh_alerts()
        runs = await self.store.search_runs(status="dead_lettered", include_discarded=False,
                                            limit=200)
        return self.page("dead.html", area="operations", runs=runs)

    async def callbacks(self, request: Request) -> Response:
        await self.refresh_alerts()
        subscribers = [{**view.model_dump(mode="json"), "url": redact(view.url)}
                       for view in await self.store.subscriptions(self.dispatcher.clock())]
        return self.page("callbacks.html", area="operations",
                          destinations=await self.store.destinations(),
                          dead=await self.store.list_notifications("dead", 100),
                          agent_sets=await agent_sets(self.store, self.dispatcher.registry),
                          subscribers=subscribers)

    async def replay(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        if not form["run_ids"]:
            return self.error(422, "Select at least one run to replay.")
        for run_id in form["run_ids"]:
            try:
                await self.dispatcher.replay(run_id)
            except (RunNotFound, NotReplayable) as exc:
                return self.error(409, f"{run_id}: {exc}")
            except StorageUnavailable:
                return self.error(503, "The store cannot take writes right now.")
        target = (f"/ui/runs/{form['run_ids'][0]}" if len(form["run_ids"]) == 1
                  else "/ui/runs")
        return RedirectResponse(target, status_code=303)

    async def discard(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        if not form["run_ids"] or not form["reason"].strip():
            return self.error(422, "Choose a run and say why it is discarded.")
        try:
            await self.store.discard(form["run_ids"][0], form["reason"].strip(), time.time())
        except (RunNotFound, NotReplayable) as exc:
            return self.error(409, str(exc))
        return RedirectResponse("/ui/dead-letters", status_code=303)

    async def stream(self, request: Request) -> Response:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(SUBSCRIBER_BACKLOG)

        async def events() -> AsyncIterator[dict[str, Any]]:
            self.live.subscribers.add(queue)
            try:
                yield {"event": "stats", "data": json.dumps(await self._stats()),
                       "retry": 1000}
                while True:
                    try:
                        message = await asyncio.wait_for(queue.get(), STATS_EVERY_SECONDS)
                    except TimeoutError:
                        yield {"event": "stats", "data": json.dumps(await self._stats())}
                        continue
                    yield {"event": "run", "data": json.dumps(message)}
            finally:
                self.live.subscribers.discard(queue)

        return LiveStream(events(), ping=15)

    # -- helpers --------------------------------------------------------------------------

    async def _stats(self) -> dict[str, Any]:
        stats = await self.store.stats()
        extra = {key: value for more in self.stats_extras for key, value in more().items()}
        return {**stats["runs"], "active": stats["active"], **extra,
                "oldest_waiting": age(stats["oldest_waiting_accepted_at"], time.time())}

    async def _finished_per_interval(self, now: float) -> list[int]:
        """Runs that reached a terminal state in each 5-minute slice of the last hour."""
        return await self.store.finished_counts(now - 3600, 300, 12)

    def page(self, template: str, status_code: int = 200, area: str | None = None,
              **context: Any) -> HTMLResponse:
        """A page of an app's area (default: the area of the menu link of the app whose
        template it is, "<app>/<file>"; the engine's: the first link's, the home
        page's), or of the operations area (runs, dead letters, callbacks), whose
        banners only it shows."""
        if area is None:
            app = template.partition("/")[0] if "/" in template else None
            links = [link for link in self.menu if link["app"] == app] or self.menu
            area = links[0]["area"] if links else ""
        context.setdefault("csrf", self.csrf)
        context.setdefault("alerts", self.alerts + (self.operator_alerts
                                                    if area == "operations" else []))
        html = self.env.get_template(template).render(
            area=area, attention=len(self.operator_alerts), **context)
        return HTMLResponse(html, status_code=status_code)

    def error(self, status: int, message: str,
               headers: dict[str, str] | None = None) -> HTMLResponse:
        page = self.page("error.html", status_code=status, title=f"{status}",
                          message=message, alerts=[])
        page.headers.update(headers or {})
        return page

    async def refresh_alerts(self) -> None:
        """The banners: storage trouble (every page), and in the operations area dead
        letters waiting for a decision and paused destinations."""
        self.store.look_around()
        alerts = []
        if not self.store.healthy:
            alerts.append(f"Events cannot be stored: {escape(self.store.last_error or '')}. "
                          "Senders get 503 and retry.")
        operator = []
        dead = await self.store.search_runs(status="dead_lettered", include_discarded=False,
                                            limit=101)
        if dead:
            count = "100+" if len(dead) > 100 else str(len(dead))
            operator.append(f'{count} dead-lettered run(s) need a look: '
                            f'<a href="/ui/dead-letters">dead letters</a>.')
        paused = [d["destination"] for d in await self.store.destinations()
                  if d["state"] == "paused"]
        origins = [d for d in paused if not d.startswith(SUBSCRIPTION_DESTINATION)]
        if origins:
            operator.append(f'{len(origins)} callback destination(s) paused; resume one with '
                            '<span class="mono">agentbox callbacks resume ORIGIN</span>: '
                            '<a href="/ui/callbacks">callbacks</a>.')
        if len(origins) < len(paused):  # held for verification, or suspended
            suspended = [s for s in await self.store.subscriptions(self.dispatcher.clock())
                         if s.state == "suspended"]
            if suspended:
                operator.append(f'{len(suspended)} subscription(s) suspended; each resumes '
                                'when its subscriber refreshes it (<span class="mono">POST '
                                '/subscriptions/{id}/refresh</span>): '
                                '<a href="/ui/callbacks">callbacks</a>.')
        self.alerts, self.operator_alerts = alerts, operator

async def _form(request: Request) -> dict[str, list[str]]:
    """An urlencoded form (what the pages post), at most MAX_FORM_BYTES."""
    body = bytearray()
    with contextlib.suppress(ClientDisconnect):
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return {}
    try:
        return parse_qs(body.decode("utf-8"), max_num_fields=1000)
    except (UnicodeDecodeError, ValueError):
        return {}


class LiveStream(EventSourceResponse):
    """sse-starlette's response without its shutdown watcher, which, once a page has
    been opened, polls twice a second for the rest of the process's life: the stream
    ends when the server is asked to stop, and nothing wakes until then."""

    @staticmethod
    async def _listen_for_exit_signal() -> None:
        await stopping().wait()


class TokenGuard:
    """Starlette middleware around Access.guard, asking for the token with the page."""

    def __init__(self, app: ASGIApp, pages: StatusPages) -> None:
        self._inner = pages.access.guard(app, pages.login_page)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._inner(scope, receive, send)


def forward(path: str) -> Response:
    """A page that sends the browser on to `path` (of this site) at once."""
    quoted = html.escape(path, quote=True)
    return HTMLResponse(
        f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url='
        f'{quoted}"><title>agentbox</title><p><a href="{quoted}">Open agentbox</a></p>',
        headers={"Cache-Control": "no-store"})


def redact(value: Any) -> Any:
    """The event as shown on a page: values under secret-looking keys hidden, and
    the query string of URLs (which may carry a token) dropped."""
    if isinstance(value, dict):
        return {k: "•••" if SECRET_KEYS.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str) and value.startswith(("http://", "https://")):
        parts = urlsplit(value)
        if parts.query or parts.username or parts.password:
            host = parts.hostname or ""
            port = f":{parts.port}" if parts.port else ""
            return f"{parts.scheme}://{host}{port}{parts.path}{'?•••' if parts.query else ''}"
    return value


def age(iso_time: str | None, now: float) -> str:
    if iso_time is None:
        return "—"
    seconds = max(0, now - datetime.fromisoformat(iso_time).timestamp())
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _bars(counts: list[int]) -> str:
    """A small inline SVG bar chart (no script, no CDN)."""
    top = max(counts) or 1
    bars = "".join(
        f'<rect x="{i * 10}" y="{30 - 28 * c / top:.1f}" width="8" height="{28 * c / top:.1f}" '
        f'fill="#1f5fbf"><title>{c}</title></rect>' for i, c in enumerate(counts))
    return (f'<svg width="120" height="32" role="img" aria-label="runs finished per 5 minutes">'
            f'{bars}</svg>')



def _either(words: list[str]) -> str:
    """`a, b or c`: what the search box finds."""
    return " or ".join(filter(None, (", ".join(words[:-1]), words[-1])))


def page_templates() -> Environment:
    """The pages' templates: the engine's by their names, each app's as "<app>/<file>"
    (`StatusPages.add_app_files`)."""
    env = Environment(loader=ChoiceLoader([FileSystemLoader(TEMPLATES), PrefixLoader({})]),
                      autoescape=select_autoescape(["html"]))
    folders: dict[str, Path] = {}  # each app's static files (add_app_files)
    env.globals["static_folders"] = folders
    env.globals["asset"] = functools.partial(asset_url, apps=folders)
    # JSON for people: readable text, which autoescaping then makes inert HTML
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    return env


def add_app_files(env: Environment, app: str, templates: Path | None,
                  static: Path | None) -> None:
    """An app's templates (named "<app>/<file>") and static files (served at
    /static/<app>/<file>, named `asset("<app>/<file>")` on a page), in the pages'
    environment `env`: under the app's name, so that no two apps' files collide."""
    if templates is not None:
        loader = env.loader
        assert isinstance(loader, ChoiceLoader) and isinstance(loader.loaders[-1], PrefixLoader)
        loader.loaders[-1].mapping = {**loader.loaders[-1].mapping,
                                      app: FileSystemLoader(templates)}
    if static is not None:
        env.globals["static_folders"][app] = static  # type: ignore[index]


def static_file(name: str, apps: Mapping[str, Path]) -> Path | None:
    """The file `name` names: the engine's ("page.css") or an app's ("<app>/ab.js",
    `apps`: each app's folder), if it is one (a file of a served type, directly in
    its folder)."""
    app, _, file = name.rpartition("/")
    folder = apps.get(app) if app else STATIC
    if (folder is None or not file or file.startswith(".") or "/" in app
            or Path(file).suffix not in STATIC_TYPES or Path(file).name != file):
        return None
    path = folder / file
    return path if path.is_file() else None


@functools.cache
def _asset(path: Path) -> tuple[bytes, str]:
    """A page's file (stylesheet, script): its bytes and a digest of them, read once."""
    body = path.read_bytes()
    return body, hashlib.sha256(body).hexdigest()[:12]


def asset_url(name: str, apps: Mapping[str, Path] | None = None) -> str:
    """Where a page finds one of the engine's files ("page.css") or an app's
    ("<app>/<file>"): named with its digest, so that a browser keeps it until it
    changes."""
    path = static_file(name, apps or {})
    if path is None:
        raise ValueError(f"no static file {name!r}")
    where = f"/static/{name}" if "/" in name else f"/ui/static/{name}"
    return f"{where}?v={_asset(path)[1]}"


async def asset(request: Request) -> Response:
    """`GET /ui/static/{name}`: the engine's pages' stylesheet and script."""
    return _asset_answer(request, request.path_params["name"], {})


def _asset_answer(request: Request, name: str, apps: Mapping[str, Path]) -> Response:
    path = static_file(name, apps)
    if path is None:
        return error_response(404, "not_found", f"The page has no file {name[:100]!r}.")
    body, version = _asset(path)
    cache = ("public, max-age=31536000, immutable" if request.query_params.get("v") == version
             else "no-cache")
    return Response(body, media_type=STATIC_TYPES[path.suffix],
                    headers={"Cache-Control": cache, "ETag": f'"{version}"'})


