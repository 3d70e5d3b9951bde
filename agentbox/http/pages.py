"""The status page: projects and their reviews for the musician; runs, a run's
story, dead letters and callbacks for the operator; live by SSE.

Server-rendered HTML (jinja2, autoescaped), a little vanilla JavaScript, no
CDN: it works on a machine without internet. Live updates come from
`/ui/stream` (Server-Sent Events); the browser reconnects by itself after a
server restart.

Safety: on a loopback address the pages are open to this machine. Bound to
any other address, every page, stream and admin call needs the admin token
(a cookie set by the login form, or `Authorization: Bearer`). State-changing
actions are POST forms carrying a CSRF token, and a request from another
origin is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import re
import secrets
import time
import unicodedata
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import escape
from sse_starlette.sse import EventSourceResponse
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    HTMLResponse,
    RedirectResponse,
    Response,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbox.archive import Archive
from agentbox.config import Settings
from agentbox.desktop.watched import FolderStatus, WatchedFolders
from agentbox.engine.callbacks import SUBSCRIPTION_DESTINATION
from agentbox.engine.dispatcher import Dispatcher
from agentbox.engine.subscriptions import agent_sets
from agentbox.http.access import Access, TooManyLogins, from_this_site
from agentbox.http.audio import audio_type
from agentbox.http.errors import error_response
from agentbox.http.listening import listening, reference_url
from agentbox.http.server import stopping
from agentbox.review import figures
from agentbox.review import view as review_view
from agentbox.review.agent import mix_review
from agentbox.runs import RunStatus
from agentbox.store import (
    NotReplayable,
    ProjectExport,
    RunNotFound,
    StorageUnavailable,
    Store,
    Transition,
    iso,
)

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"  # the page's stylesheet and script
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
STATIC_FILES = frozenset({"page.css", "page.js", "ab.js"})
PAGE_SIZE = 50
MAX_FORM_BYTES = 64 * 1024
STATS_EVERY_SECONDS = 2.0
SUBSCRIBER_BACKLOG = 1000
SECRET_KEYS = re.compile(r"secret|token|signature|password|passwd|api[_-]?key|authorization|"
                         r"credential|cookie", re.IGNORECASE)
RANGES = (("3600", "last hour"), ("86400", "last day"), ("604800", "last week"))
RUN_FILTERS = ("q", "status", "event_type", "agent", "project", "since", "before")
HOME_PROJECTS = 100
PROJECT_EXPORTS = 200


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
                 access: Access, watched: WatchedFolders | None = None) -> None:
        self.settings = settings
        self.watched = watched  # the folders serve watches (the `watch` setting)
        self.store = store
        self.dispatcher = dispatcher
        self.access = access
        self.archive: Archive | None = None  # the app's, for what a project page can play
        self.live = Live()
        self.csrf = secrets.token_urlsafe(24)  # per process: forms from a previous life fail
        self.alerts: list[str] = []  # on every page: what stops exports being stored
        self.operator_alerts: list[str] = []  # in the operations area: what needs a decision
        self.env = page_templates()
        self.env.globals["logout"] = not access.open_to_this_machine  # a session to end

    # -- access (the rules are agentbox.http.access's) -----------------------------------

    @property
    def open_to_this_machine(self) -> bool:
        return self.access.open_to_this_machine

    def login_page(self) -> Response:
        return self._page("login.html", status_code=401, logout=False)

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        try:
            session = await self.access.log_in(request, (form.get("token") or [""])[0])
        except TooManyLogins as exc:
            return self._error(429, "Too many wrong tokens from here: wait a minute and try "
                                    "again.", {"Retry-After": str(round(exc.retry_after))})
        if session is None:
            return self.login_page()
        response = RedirectResponse("/", status_code=303)
        self.access.session_cookie(response, request, session)
        return response

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
            return self._error(403, "This action must come from agentbox's own page.")
        form = await _form(request)
        if not hmac.compare_digest((form.get("csrf") or [""])[0].encode(), self.csrf.encode()):
            return self._error(403, "The form is stale or forged (CSRF check failed); reload "
                                    "the page and try again.")
        return {"run_ids": form.get("run_id", [])[:500],
                "reason": (form.get("reason") or [""])[0][:500]}

    # -- pages ----------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        """Projects and their latest exports; the operator's runs are one click away."""
        if any(key in request.query_params for key in RUN_FILTERS):
            # a link to the runs view from before it moved off the home page
            return RedirectResponse("/ui/runs?" + request.url.query, status_code=307)
        await self.refresh_alerts()
        latest = await self.store.projects(limit=HOME_PROJECTS)
        stats = await self.store.stats()
        return self._page("home.html", projects=await self._rows(latest),
                          stats=stats, folders=self._folders(),
                          oldest_waiting=_age(stats["oldest_waiting_accepted_at"], time.time()))

    async def project(self, request: Request) -> Response:
        """Every export of one project, its trends, and two exports side by side."""
        await self.refresh_alerts()
        # Past the longest name there is (cut, it could match a name it is not).
        name = unicodedata.normalize("NFC", request.path_params["project"][:1024])
        exports = await self.store.project_exports(name, limit=PROJECT_EXPORTS)
        if not exports:
            return self._error(404, f"No export of a project named {name[:200]!r} has "
                                    "arrived yet.")
        rows = review_view.numbered(await self._rows(exports))
        reviewed = [row for row in rows if row.review is not None]
        q = request.query_params
        pair = review_view.choose_pair(reviewed, q.get("a"), q.get("b"))
        kept = {k.run_id: k for k in await self.store.kept_audio(name)}
        reference = await self.store.reference(name)
        archive = self.archive
        listen = None if archive is None else listening(
            rows, kept, reference, archive.keeper, archive.on)
        use = None
        if archive is not None:
            used, bound = await archive.usage()
            use = {"on": archive.on, "keep": archive.bounds.keep_per_project,
                   "max_gb": f"{bound / 1e9:g}", "used_gb": f"{used / 1e9:.2f}"}
        return self._page("project.html", name=name, rows=rows, reviewed=reviewed,
                          trends=review_view.trend_charts(reviewed), pair=pair,
                          comparison=review_view.compare(*pair) if pair else None,
                          capped=len(exports) == PROJECT_EXPORTS, kept=kept, listen=listen,
                          reference=reference, reference_url=reference_url(name),
                          reference_added=iso(reference.added_at) if reference else None,
                          archive=use)

    async def _rows(self, exports: list[ProjectExport]) -> list[review_view.ExportRow]:
        """Each export as a row; one without a review is named by its event's file,
        and says why by its run's error."""
        rows = []
        for export in exports:
            row = review_view.export_row(export)
            if row.review is None and not export.archived:  # an archived one has no event
                run = await self.store.get_run(export.run_id)
                error = (run.error_code, run.error_message) if run else (None, None)
                row = review_view.export_row(export, await self.store.event_of(export.run_id),
                                             error)
            rows.append(row)
        return rows

    async def runs(self, request: Request) -> Response:
        """The operator's view: queue health, runs with filters."""
        await self.refresh_alerts()
        q = request.query_params
        # Bounded, but past the longest name there is: cut shorter, a longer search
        # could find what it is not (a name of its first 256 characters).
        query = {k: (q.get(k) or "").strip()[:1024] or None for k in RUN_FILTERS}
        if query["status"] not in {s.value for s in RunStatus}:
            query["status"] = None
        now = time.time()
        window = query["since"] or ""
        since = now - float(window) if window.isascii() and window.isdigit() else None
        runs = await self.store.search_runs(
            status=query["status"], event_type=query["event_type"], agent=query["agent"],
            project=query["project"], text=query["q"], since=since, before=query["before"],
            limit=PAGE_SIZE)
        stats = await self.store.stats()
        filtered = any(v for k, v in query.items() if k != "before")
        next_page = None
        if len(runs) == PAGE_SIZE:
            params = {k: v for k, v in query.items() if v and k != "before"}
            next_page = "/ui/runs?" + urlencode({**params, "before": runs[-1]["run_id"]})
        finished = await self._finished_per_interval(now)
        return self._page(
            "index.html", area="operations", request=request, runs=runs, stats=stats,
            query=query,
            statuses=[s.value for s in RunStatus], ranges=RANGES, filtered=filtered,
            event_types=sorted(self.dispatcher.registry.event_types()),
            agents=sorted(self.dispatcher.registry.agent_names()),
            oldest_waiting=_age(stats["oldest_waiting_accepted_at"], now),
            throughput=_bars(finished), finished_last_hour=sum(finished),
            live_rows=not filtered and not query["before"], next_page=next_page)

    async def run(self, request: Request) -> Response:
        await self.refresh_alerts()
        run_id = request.path_params["run_id"]
        found_run = await self.store.get_run(run_id)
        if found_run is None:
            archived = await self.store.archived_export(run_id)
            if archived is not None:
                return self._removed(archived)
            return self._error(404, f"No run has the id {run_id[:100]!r}.")
        run = {**dict(found_run), "callbacks": await self.store.notifications(run_id)}
        event = redact(await self.store.event_of(run_id) or {})
        review = review_view.Review.of(run["result"])
        chain_id = run["correlation_id"] or run["event_id"]
        chain = await self.store.search_runs(chain=chain_id, limit=200)
        chain.sort(key=lambda r: (r["hop"], r["run_id"]))
        project = _project_of(event) or found_run.project  # the body may be gone (retention)
        export = review_view.export_row(ProjectExport(
            run_id, project or "", found_run.agent, found_run.status, found_run.accepted_at,
            found_run.completed_at, found_run.result), event,
            (found_run.error_code, found_run.error_message))
        return self._page(
            "run.html", run=run, event=event, review=review, chain=chain, project=project,
            export=export, reviewing=review is not None or self._reviews(found_run.agent),
            history=await self.store.history(run_id),
            attempts=await self.store.attempts(run_id),
            discarded=await self.store.discarded(run_id),
            previous=await self._previous(review, run, project) if review else None,
            audio_type=audio_type(review.file_name) if review else None,
            audio_gone=await self._audio_gone(run_id, project) if review else None)

    async def _audio_gone(self, run_id: str, project: str | None) -> str | None:
        """Why a review's mix can no longer be played, when the archive says so."""
        if self.archive is None or not self.archive.on or not project:
            return None
        kept = next((k for k in await self.store.kept_audio(project) if k.run_id == run_id),
                    None)
        if kept is None:
            return "the archive holds no copy of it (made before the archive, or not kept)"
        return kept.dropped_because

    def _reviews(self, agent: str) -> bool:
        """Whether `agent` is the mix review: its runs are told in a musician's words."""
        spec = self.dispatcher.registry.get(agent)
        return spec is not None and spec.function is mix_review

    async def _previous(self, review: review_view.Review, run: dict[str, Any],
                        project: str | None) -> review_view.Previous | None:
        """The export this review is compared with: the one its document names, else
        the project's last reviewed export before it."""
        named = review.comparison_run_id
        if project is None:
            return None
        if named is None:  # the review says: the project's first export
            return review_view.Previous(None, None, None, review)
        if isinstance(named, str):
            found = await self.store.get_run(named)
            if found is not None:
                return review_view.Previous(named, found["accepted_at"],
                                            review_view.Review.of(found["result"]), review)
            kept = await self.store.archived_export(named)  # retention removed the run
            if kept is None:
                return review_view.Previous(named, None, None, review)
            return review_view.Previous(named, kept.accepted_at,
                                        review_view.Review.of(kept.result), review, True)
        earlier = await self.store.project_exports(
            unicodedata.normalize("NFC", project), agent=run["agent"], status="succeeded",
            before_run_id=run["run_id"], limit=1)
        if not earlier:
            return review_view.Previous(None, None, None, review)
        return review_view.Previous(earlier[0].run_id, earlier[0].accepted_at,
                                    review_view.Review.of(earlier[0].result), review,
                                    earlier[0].archived)

    async def dead_letters(self, request: Request) -> Response:
        await self.refresh_alerts()
        runs = await self.store.search_runs(status="dead_lettered", include_discarded=False,
                                            limit=200)
        return self._page("dead.html", area="operations", runs=runs)

    async def callbacks(self, request: Request) -> Response:
        await self.refresh_alerts()
        subscribers = [{**view.model_dump(mode="json"), "url": redact(view.url)}
                       for view in await self.store.subscriptions(self.dispatcher.clock())]
        return self._page("callbacks.html", area="operations",
                          destinations=await self.store.destinations(),
                          dead=await self.store.list_notifications("dead", 100),
                          agent_sets=await agent_sets(self.store, self.dispatcher.registry),
                          subscribers=subscribers)

    async def replay(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        if not form["run_ids"]:
            return self._error(422, "Select at least one run to replay.")
        for run_id in form["run_ids"]:
            try:
                await self.dispatcher.replay(run_id)
            except (RunNotFound, NotReplayable) as exc:
                return self._error(409, f"{run_id}: {exc}")
            except StorageUnavailable:
                return self._error(503, "The store cannot take writes right now.")
        target = (f"/ui/runs/{form['run_ids'][0]}" if len(form["run_ids"]) == 1
                  else "/ui/runs")
        return RedirectResponse(target, status_code=303)

    async def discard(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        if not form["run_ids"] or not form["reason"].strip():
            return self._error(422, "Choose a run and say why it is discarded.")
        try:
            await self.store.discard(form["run_ids"][0], form["reason"].strip(), time.time())
        except (RunNotFound, NotReplayable) as exc:
            return self._error(409, str(exc))
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
        folders = {f"watch-{i}": folder.said for i, folder in enumerate(self._folders())}
        return {**stats["runs"], "active": stats["active"], **folders,
                "oldest_waiting": _age(stats["oldest_waiting_accepted_at"], time.time())}

    def _folders(self) -> list[FolderStatus]:
        return [] if self.watched is None else self.watched.status()

    async def _finished_per_interval(self, now: float) -> list[int]:
        """Runs that reached a terminal state in each 5-minute slice of the last hour."""
        return await self.store.finished_counts(now - 3600, 300, 12)

    def _page(self, template: str, status_code: int = 200, area: str = "projects",
              **context: Any) -> HTMLResponse:
        """A page of the musician's area (projects, reviews), or of the operations
        area (runs, dead letters, callbacks), whose banners only it shows."""
        context.setdefault("csrf", self.csrf)
        context.setdefault("alerts", self.alerts + (self.operator_alerts
                                                    if area == "operations" else []))
        html = self.env.get_template(template).render(
            area=area, attention=len(self.operator_alerts), **context)
        return HTMLResponse(html, status_code=status_code)

    def _removed(self, kept: ProjectExport) -> HTMLResponse:
        """The page of a run retention removed: gone, but its project's history kept
        what the project page shows of it."""
        finished = (kept.finished_at or kept.accepted_at)[:16].replace("T", " ")
        return self._page("removed.html", status_code=404, run_id=kept.run_id,
                          finished=finished, days=f"{self.settings.retention_days:g}",
                          reviewed=kept.result is not None, project=kept.project, alerts=[])

    def _error(self, status: int, message: str,
               headers: dict[str, str] | None = None) -> HTMLResponse:
        page = self._page("error.html", status_code=status, title=f"{status}",
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


def _age(iso_time: str | None, now: float) -> str:
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



def page_templates() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    env.globals["asset"] = asset_url
    # JSON for people: readable text, which autoescaping then makes inert HTML
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    env.filters["project_url"] = project_url
    env.filters["signed"] = review_view.signed
    env.filters["mmss"] = figures.mmss
    return env


@functools.cache
def _asset(name: str) -> tuple[bytes, str]:
    """A file of the page's (stylesheet, script): its bytes and a digest of them,
    read once."""
    body = (STATIC / name).read_bytes()
    return body, hashlib.sha256(body).hexdigest()[:12]


def asset_url(name: str) -> str:
    """Where the page finds one of its files: named with its digest, so that a
    browser keeps it until agentbox changes it."""
    return f"/ui/static/{name}?v={_asset(name)[1]}"


async def asset(request: Request) -> Response:
    """`GET /ui/static/{name}`: the page's stylesheet and script."""
    name = request.path_params["name"]
    if name not in STATIC_FILES:
        return error_response(404, "not_found", f"The page has no file {name[:100]!r}.")
    body, version = _asset(name)
    cache = ("public, max-age=31536000, immutable" if request.query_params.get("v") == version
             else "no-cache")
    return Response(body, media_type=STATIC_TYPES[Path(name).suffix],
                    headers={"Cache-Control": cache, "ETag": f'"{version}"'})


def project_url(name: str) -> str:
    """A project's page: its whole name percent-encoded, slashes included."""
    return "/projects/" + quote(name, safe="")


def _project_of(event: dict[str, Any]) -> str | None:
    payload = event.get("payload")
    project = payload.get("project_id") if isinstance(payload, dict) else None
    return project if isinstance(project, str) else None
