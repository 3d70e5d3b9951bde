"""The review as an app on the engine (agentbox.apps): the mix review agent for
`session.exported` and `mix.review_requested`, its history in its own tables (the
archive of exports, references, what a project keeps of removed runs), the
analysis processes its agent borrows, and its pages: projects on the home page, a
project's history, a review's run page, the audio and reference routes.

Importing this module registers the review's event types and its settings, the
`[review]` section (agentbox.review.contract, agentbox.review.settings); the heavy
parts (numpy, the analysis) load in `setup`, when a server is assembled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.routing import BaseRoute, Route

from agentbox.apps import App, Host
from agentbox.archive.history import SCHEMA, History
from agentbox.engine.retention import PruneReport
from agentbox.http.openapi import ApiPart
from agentbox.review.contract import AGENTS, MIX_REVIEW
from agentbox.review.settings import ReviewSettings
from agentbox.store import Tables

if TYPE_CHECKING:
    from agentbox.archive import Archive
    from agentbox.config import Settings
    from agentbox.review.analysis import Analysis
    from agentbox.review.web.not_audio import NotAudio
    from agentbox.review.web.pages import ReviewPages



WEB = Path(__file__).parent / "web"


class ReviewApp(App):
    name = "review"
    schemas = (SCHEMA,)
    templates = WEB / "templates"  # "review/home.html", ...
    static = WEB / "static"  # /static/review/ab.js, drop.js, review.css

    def __init__(self) -> None:
        self.host: Host | None = None
        self.analysis: Analysis | None = None
        self.archive: Archive | None = None
        self.web: ReviewPages | None = None
        self._not_audio: NotAudio | None = None
        self._routes: list[BaseRoute] = []
        self._is_review: dict[str, bool] = {}  # by agent name: the registry never changes

    def agents(self) -> Mapping[str, Sequence[str]]:
        return AGENTS

    def setup(self, host: Host) -> None:
        from agentbox.archive import Archive
        from agentbox.review import renders
        from agentbox.review.agent import confine_mixes
        from agentbox.review.analysis import Analysis
        from agentbox.review.present import mix_name
        from agentbox.review.web.audio import AudioRoutes
        from agentbox.review.web.drops import DropRoutes
        from agentbox.review.web.not_audio import NotAudio
        from agentbox.review.web.pages import ReviewPages, add_templates
        from agentbox.review.web.references import ReferenceRoutes
        from agentbox.review.web.rejudge import RejudgeRoutes
        from agentbox.review.web.tidy import TidyRoutes, project_url

        self.host = host
        # For the receiver's admission check.
        confine_mixes(host.settings.of(ReviewSettings).mix_roots)
        # Starts no process until `start` warms one.
        self.analysis = Analysis(host.settings.of(ReviewSettings).analysis_processes)
        history = History(host.tables(SCHEMA))
        renders.know(history)  # what counts as a render, for the receiver's admission
        self.archive = archive = Archive(host.settings, history, host.clock)
        host.provide(Analysis, self.analysis)
        host.provide(Archive, archive)
        host.provide(History, history)
        pages = host.pages
        add_templates(pages.env)  # its filters
        host.add_menu_link("Projects", "/", area="projects")
        self.web = web = ReviewPages(pages, history, archive, self._reviews)
        host.provide(ReviewPages, web)  # the desktop side tells it its watched folders
        host.add_file_namer(lambda payload: payload["file_name"]
                            if isinstance(payload.get("file_name"), str)
                            else mix_name(payload["mix_url"])
                            if isinstance(payload.get("mix_url"), str) else None)
        host.add_removed_note(web.removed_note)
        host.add_run_page(web.run_page)
        host.add_run_field_link("project", project_url)  # the run list's project column
        audio = AudioRoutes(host.store, archive)
        references = ReferenceRoutes(archive, self.analysis, pages.access, pages.csrf,
                                     web.project)
        rejudge = RejudgeRoutes(history, archive, pages.access, pages.csrf, host.take, pages)
        tidy = TidyRoutes(history, archive, pages.access, pages.csrf, host.clock, pages)
        drops = DropRoutes(archive, pages.access, pages.csrf, pages, host.store, host.take)
        host.on_transition(drops.on_transition)
        not_audio = NotAudio(history, pages.access, pages.csrf, self._reviews, host.clock,
                             pages)
        host.on_transition(not_audio.on_transition)
        self._not_audio = not_audio
        self._routes = [
            Route("/", web.home, methods=["GET"]),
            Route("/exports", drops.or_read(web.exports), methods=["GET", "POST"]),
            Route("/runs/{run_id}/audio", audio.run_audio, methods=["GET"]),
            Route("/runs/{run_id}/rejudge", rejudge.rejudge, methods=["POST"]),
            Route("/runs/{run_id}/dismiss", not_audio.dismiss, methods=["POST"]),
            Route("/references", references.listing, methods=["GET"]),
            Route("/projects/{project:path}/reference", references.reference,
                  methods=["GET", "PUT", "DELETE"]),
            Route("/projects/{project:path}/reference/audio", references.audio,
                  methods=["GET"]),
            Route("/projects/{project:path}/rename", tidy.rename, methods=["POST"]),
            Route("/projects/{project:path}/merge", tidy.merge, methods=["POST"]),
            Route("/projects/{project:path}/remove", tidy.remove, methods=["POST"]),
            Route("/projects/{project:path}", web.project, methods=["GET"]),
        ]

    def routes(self) -> Sequence[BaseRoute]:
        return self._routes

    def api(self) -> ApiPart:
        from agentbox.review.web.openapi import api

        return api()

    def _reviews(self, agent: str) -> bool:
        """Whether `agent` (a run's, by name) is the mix review: told in a musician's
        words. Asked of every run's every change of state: known once per name."""
        known = self._is_review.get(agent)
        if known is None:
            from agentbox.review.agent import mix_review

            assert self.host is not None
            spec = self.host.registry.get(agent)
            known = self._is_review[agent] = spec is not None and spec.function is mix_review
        return known

    async def start(self) -> None:
        assert self.archive is not None and self.analysis is not None
        await self.archive.open()
        if self._not_audio is not None:
            await self._not_audio.catch_up()
        if self.host is not None and any(
                spec.name == MIX_REVIEW
                for spec in self.host.registry.for_event_type("session.exported")):
            self.analysis.warm()  # exports are reviewed: warm before the first one

    async def stop(self) -> None:
        if self.archive is not None:
            await self.archive.close()
        if self.analysis is not None:
            self.analysis.shutdown()

    async def retain(self, report: PruneReport) -> None:
        said(report, None if report.dry_run or self.archive is None
             else await self.archive.bound())

    async def retain_alone(self, tables: Mapping[str, Tables], settings: Settings,
                           report: PruneReport, own_files: bool) -> None:
        from agentbox.archive import Archive

        dropped = None
        if own_files and not report.dry_run:
            archive = Archive(settings, History(tables[SCHEMA.line]))
            await archive.open()
            try:
                dropped = await archive.bound()
            finally:
                await archive.close()
        said(report, dropped)


def said(report: PruneReport, dropped: int | None) -> None:
    """What the review kept of a pass's removed runs (its project history) and what
    its archive let go, in the report."""
    kept = report.removed.get("project_exports", 0)
    if kept:
        report.notes.append(f"{kept} finished exports {'would be' if report.dry_run else 'were'}"
                            " kept for their projects' history")
    report.counts["audio_dropped"] = dropped or 0
    if dropped:
        report.notes.append(f"{dropped} exports' audio let go by the archive, over its "
                                "bounds")


app = ReviewApp()
