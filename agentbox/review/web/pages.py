"""The review's pages: projects and their latest exports (the home page), a
project's history with its trends and A/B player, a review's own run page, and
`GET /exports`. They stand on the engine's pages (agentbox.http.pages.StatusPages:
templates, banners, CSRF) and read the review's history (agentbox.archive.history).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from agentbox.archive import Archive
from agentbox.archive.history import History
from agentbox.archive.records import ProjectExport, ProjectLatest
from agentbox.events import MAX_ID_LENGTH, unfit_for_a_name
from agentbox.http.api import limit_of
from agentbox.http.errors import error_response
from agentbox.http.pages import RUN_FILTERS, StatusPages, age
from agentbox.review import figures
from agentbox.review import view as review_view
from agentbox.review.answers import ExportView
from agentbox.review.contract import project_name
from agentbox.review.web.audio import audio_type
from agentbox.review.web.drops import MAX_DROP_BYTES
from agentbox.review.web.listening import listening, reference_url
from agentbox.review.web.tidy import project_url
from agentbox.store import RunView, iso

HOME_PROJECTS = 30  # projects on a page of the home page
PROJECT_EXPORTS = 200
_CURSOR = re.compile(r"[A-Za-z0-9_-]{4,400}")
BAD_CURSOR = "cursor must be the next_cursor of the page before, as agentbox gave it."


def cursor_of(position: tuple[float, str]) -> str:
    """A page's `next_cursor`: the position of its last project (ProjectLatest), opaque."""
    at, run_id = position
    return base64.urlsafe_b64encode(f"{at!r} {run_id}".encode()).decode().rstrip("=")


def position_of(cursor: str) -> tuple[float, str] | None:
    """The position a `cursor_of` names; None: not one agentbox gave."""
    if not _CURSOR.fullmatch(cursor):
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, run_id = text.partition(" ")
        value = float(at)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not math.isfinite(value) or not run_id or not run_id.isprintable():
        return None
    return value, run_id


def name_asked(request: Request) -> str | None:
    """The home page's `?q=`: part of a project's name (spaces at its ends left out)."""
    q = request.query_params.get("q", "").strip()[:MAX_ID_LENGTH]
    return q if q and not any(unfit_for_a_name(c) for c in q) else None


def add_templates(env: Environment) -> Environment:
    """The review's filters, in the pages' environment `env` (its templates, "review/
    <file>", and static files come in as the app's: ReviewApp.templates, .static)."""
    env.filters["signed"] = review_view.signed
    env.filters["reading"] = review_view.number  # figures.fixed: never "-0.0"
    env.filters["mmss"] = figures.mmss
    env.filters["project_url"] = project_url  # a project's page
    return env


def shown(exports: Sequence[ProjectExport], numbered: bool = False,
          payloads: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Exports as `GET /exports` shows them (agentbox.models.ExportView), field by field;
    `numbered`: a project's (newest first), each with its number and same_audio_as
    (`payloads`: the events' payloads of those with no review yet, by run_id: a
    re-judgment's says so before its review does)."""
    views = [ExportView.model_validate(export, from_attributes=True) for export in exports]
    if numbered:
        told = payloads or {}
        places = review_view.numbers(
            [(export.run_id, review_view.rejudged(export.result, told.get(export.run_id)))
             for export in exports],
            [_audio_hash(export.result) for export in exports])
        views = [view.model_copy(update={"number": number, "same_audio_as": same})
                 for view, (number, same) in zip(views, places, strict=True)]
    return [view.model_dump(mode="json") for view in views]


def _audio_hash(result: Any) -> str | None:
    """The SHA-256 of the audio a review heard, if it says."""
    file = result.get("file") if isinstance(result, dict) else None
    sha = file.get("sha256") if isinstance(file, dict) else None
    return sha if isinstance(sha, str) else None


def project_of(event: dict[str, Any]) -> str | None:
    """The project an event's payload names (`project_id`), if it names one."""
    payload = event.get("payload")
    project = payload.get("project_id") if isinstance(payload, dict) else None
    return project if isinstance(project, str) else None


def _never_reviewed(row: review_view.ExportRow | ProjectExport, project: ProjectLatest
                    ) -> bool:
    """A "project" made by one file that could not be reviewed (a text file, an
    empty one in a watched folder): listed apart, once, with a dismiss, on the home
    page; no project's export in `GET /exports`."""
    heard = row.review if isinstance(row, review_view.ExportRow) else row.result
    return heard is None and row.status == "failed_permanent" and project.exports == 1


def _home_url(q: str | None, cursor: str | None) -> str:
    """The home page's link to a page of projects (`cursor`: None, the first), of
    those whose name holds `q` when given."""
    if cursor is None and q is None:
        return "/"
    query = "&".join(f"{key}={quote(value, safe='')}" for key, value in
                     (("q", q), ("cursor", cursor)) if value is not None)
    return "/?" + query


class Folders(Protocol):
    """The watched folders' state, when the server watches any (the desktop side)."""

    def status(self) -> Sequence[Any]: ...


class ReviewPages:
    def __init__(self, pages: StatusPages, history: History, archive: Archive,
                 reviews: Callable[[str], bool]) -> None:
        self.pages = pages
        self.store = pages.store
        self.history = history
        self.archive = archive
        self.reviews = reviews  # whether an agent (by name) is the mix review
        self.folders: Folders | None = None  # set by the desktop side, when it watches

    # -- the musician's pages -------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        """Projects and their latest exports; the operator's runs are one click away."""
        if any(key in request.query_params for key in (*RUN_FILTERS, "project") if key != "q"):
            # a link to the runs view from before it moved off the home page (its `q`
            # is the home page's own now: a project's name)
            return RedirectResponse("/ui/runs?" + request.url.query, status_code=307)
        cursor = request.query_params.get("cursor")
        after = None if cursor is None else position_of(cursor)
        if cursor is not None and after is None:
            return self.pages.error(422, "This page of projects no longer exists: " +
                                    BAD_CURSOR[0].upper() + BAD_CURSOR[1:] +
                                    " Start again from the home page.")
        await self.pages.refresh_alerts()
        q = name_asked(request)
        found = await self.history.latest(limit=HOME_PROJECTS + 1, name=q, after=after)
        shown = found[:HOME_PROJECTS]
        stats = await self.store.stats(finished=False)  # the page shows no finished count
        folders = [] if self.folders is None else self.folders.status()
        rows = await self._rows([project.latest for project in shown])
        unreviewable = [row for row, project in zip(rows, shown, strict=True)
                        if _never_reviewed(row, project)]
        not_audio = await self._not_audio() if after is None else []
        more = cursor_of(shown[-1].position) if len(found) > HOME_PROJECTS else None
        return self.pages.page("review/home.html",
                               projects=[r for r in rows if r not in unreviewable],
                               unreviewable=not_audio + unreviewable,
                               dismiss={row.run_id: f"/runs/{row.run_id}/dismiss"
                                        for row in not_audio},
                               stats=stats, folders=folders,
                               q=q or "", count=await self.history.count_projects(),
                               matching=await self.history.count_projects(q) if q else None,
                               next_url=more and _home_url(q, more),
                               first_url=_home_url(q, None) if after is not None else None,
                               drop_max_bytes=MAX_DROP_BYTES,
                               oldest_waiting=age(stats["oldest_waiting_accepted_at"],
                                                  time.time()))

    async def _not_audio(self) -> list[review_view.ExportRow]:
        """The files that could not be reviewed as audio, not dismissed: no project's
        exports (agentbox.review.web.not_audio), listed apart, each once."""
        found = [await self.history.export(run_id)
                 for run_id in await self.history.not_audio(limit=HOME_PROJECTS)]
        return await self._rows([export for export in found if export is not None])

    async def project(self, request: Request) -> Response:
        """Every export of one project, its trends, and two exports side by side."""
        await self.pages.refresh_alerts()
        # Past the longest name there is (cut, it could match a name it is not).
        name = unicodedata.normalize("NFC", request.path_params["project"][:1024])
        now = await self.history.resolve(name)
        if now != name:  # renamed, or merged into another: its page is the project's now
            return RedirectResponse("/projects/" + quote(now, safe=""), status_code=307)
        exports = await self.history.project_exports(name, limit=PROJECT_EXPORTS)
        if not exports:
            return self.pages.error(404, f"No export of a project named {name[:200]!r} has "
                                         "arrived yet.")
        rows = review_view.numbered(await self._rows(exports))
        reviewed = [row for row in rows if row.review is not None]
        q = request.query_params
        pair = review_view.choose_pair(reviewed, q.get("a"), q.get("b"))
        kept = {k.run_id: k for k in await self.history.kept_audio(name)}
        reference = await self.history.reference(name)
        archive = self.archive
        listen = listening(rows, kept, reference, archive.keeper, archive.on)
        used, bound = await archive.usage()
        use = {"on": archive.on, "keep": archive.bounds.keep_per_project,
               "max_gb": f"{bound / 1e9:g}", "used_gb": f"{used / 1e9:.2f}"}
        return self.pages.page("review/project.html", name=name, rows=rows, reviewed=reviewed,
                               trends=review_view.trend_charts(reviewed), pair=pair,
                               comparison=review_view.compare(*pair) if pair else None,
                               capped=len(exports) == PROJECT_EXPORTS, kept=kept,
                               listen=listen, reference=reference,
                               reference_url=reference_url(name),
                               reference_added=iso(reference.added_at) if reference
                               else None, archive=use, drop_project=name,
                               drop_max_bytes=MAX_DROP_BYTES)

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

    # -- a review's run page ------------------------------------------------------------

    async def run_page(self, request: Request, run_id: str, found_run: RunView | None
                       ) -> Response | None:
        """A run of the mix review, told in a musician's words; a run retention removed
        that its project's history kept; None: another agent's run (the engine's page)."""
        if found_run is None:
            archived = await self.history.archived_export(run_id)
            return None if archived is None else self._removed(archived)
        review = review_view.Review.of(found_run["result"])
        if review is None and not self.reviews(found_run.agent):
            return None
        context = await self.pages.run_context(found_run)
        event, run = context["event"], context["run"]
        project = project_of(event) or found_run.get("project")  # the body may be gone (retention)
        if project:  # renamed or merged since: the name it goes by now
            project = await self.history.resolve(project)
        export = review_view.export_row(ProjectExport(
            run_id, project or "", found_run.agent, found_run.status, found_run.accepted_at,
            found_run.completed_at, found_run.result), event,
            (found_run.error_code, found_run.error_message))
        return self.pages.page(
            "review/review_run.html", **context, review=review, project=project, export=export,
            previous=await self._previous(review, run, project) if review else None,
            audio_type=audio_type(review.file_name) if review else None,
            audio_gone=await self._audio_gone(run_id, project) if review else None)

    async def _audio_gone(self, run_id: str, project: str | None) -> str | None:
        """Why a review's mix can no longer be played, when the archive says so."""
        if not self.archive.on or not project:
            return None
        kept = next((k for k in await self.history.kept_audio(project) if k.run_id == run_id),
                    None)
        if kept is None:
            return "the archive holds no copy of it (made before the archive, or not kept)"
        return kept.dropped_because

    async def _previous(self, review: review_view.Review, run: dict[str, Any],
                        project: str | None) -> review_view.Compared | None:
        """The export this review is compared with: the one its document names, else
        the project's last reviewed export before it."""
        named = review.comparison_run_id
        if project is None:
            return None
        if named is None:  # the review says: the project's first export
            return review_view.Compared(None, None, None, review)
        if isinstance(named, str):
            found = await self.store.get_run(named)
            if found is not None:
                return review_view.Compared(named, found["accepted_at"],
                                            review_view.Review.of(found["result"]), review)
            kept = await self.history.archived_export(named)  # retention removed the run
            if kept is None:
                return review_view.Compared(named, None, None, review)
            return review_view.Compared(named, kept.accepted_at,
                                        review_view.Review.of(kept.result), review, True)
        earlier = await self.history.project_exports(
            unicodedata.normalize("NFC", project), agent=run["agent"], status="succeeded",
            before_run_id=run["run_id"], limit=1)
        if not earlier:
            return review_view.Compared(None, None, None, review)
        return review_view.Compared(earlier[0].run_id, earlier[0].accepted_at,
                                    review_view.Review.of(earlier[0].result), review,
                                    earlier[0].archived)

    def _removed(self, kept: ProjectExport) -> HTMLResponse:
        """The page of a run retention removed: gone, but its project's history kept
        what the project page shows of it."""
        finished = (kept.finished_at or kept.accepted_at)[:16].replace("T", " ")
        return self.pages.page("review/removed.html", status_code=404, run_id=kept.run_id,
                               finished=finished,
                               days=f"{self.pages.settings.retention_days:g}",
                               reviewed=kept.result is not None, project=kept.project,
                               alerts=[])

    # -- the API ----------------------------------------------------------------------------

    async def exports(self, request: Request) -> Response:
        """`GET /exports?project=NAME`: that project's exports, newest first (what its page
        and the comparison read); without it, the latest export of each project, a page
        of them (`limit`; `cursor`, the `next_cursor` of the page before)."""
        limit = limit_of(request)
        if limit is None:
            return error_response(422, "invalid_query", "limit must be an integer from 1 "
                                  "to 500")
        project = request.query_params.get("project")
        cursor = request.query_params.get("cursor")
        if project is None:
            return await self._latest_exports(limit, cursor)
        if cursor is not None:
            return error_response(422, "invalid_query", "cursor pages through the latest "
                                  "export of each project (GET /exports without project); "
                                  "a project's exports come in one answer.")
        if not 1 <= len(project) <= MAX_ID_LENGTH:
            return error_response(422, "invalid_query",
                                  f"project must be 1 to {MAX_ID_LENGTH} characters")
        name = project_name(project)
        # A name no event may carry (a control character, a space at an end) names no
        # project: not asked of the store, where PostgreSQL refuses a NUL.
        fit = name == name.strip() and not any(unfit_for_a_name(c) for c in name)
        # Numbered among as many as the project page numbers (or more, when asked).
        found = await self.history.project_exports(
            name, limit=max(limit, PROJECT_EXPORTS)) if fit else []
        if not found:
            return error_response(404, "project_not_found", "No export of a project named "
                                  f"{name[:200]!r} has arrived yet.")
        return JSONResponse({"exports": shown(found, numbered=True,
                                              payloads=await self._payloads(found))[:limit]})

    async def _payloads(self, exports: Sequence[ProjectExport]) -> dict[str, Any]:
        """The events' payloads of the exports with no review yet, by run_id."""
        found = {}
        for export in exports:
            if export.result is None and not export.archived:
                event = await self.store.event_of(export.run_id)
                found[export.run_id] = event.get("payload") if isinstance(event, dict) \
                    else None
        return found

    async def _latest_exports(self, limit: int, cursor: str | None) -> Response:
        """`GET /exports`: a page of the latest export of each project, newest first."""
        after = None if cursor is None else position_of(cursor)
        if cursor is not None and after is None:
            return error_response(422, "invalid_query", BAD_CURSOR)
        found = await self.history.latest(limit=limit + 1, after=after)
        page = found[:limit]
        return JSONResponse({
            "exports": shown([one.latest for one in page
                              if not _never_reviewed(one.latest, one)]),
            "next_cursor": cursor_of(page[-1].position) if len(found) > limit else None})

    async def removed_note(self, run_id: str) -> str | None:
        """For GET /runs/{run_id}'s 404: where a run retention removed is kept."""
        kept = await self.history.archived_export(run_id)
        if kept is None:
            return None
        days = self.pages.settings.retention_days
        return (f"No run has the id {run_id[:100]!r} any more: retention removed it (it "
                f"finished {kept.finished_at or kept.accepted_at}; finished runs are kept "
                f"{days:g} days, AGENTBOX_RETENTION_DAYS). Its export is kept in the "
                f"history of project {kept.project[:200]!r}: "
                f"GET /exports?project={quote(kept.project, safe='')}")

