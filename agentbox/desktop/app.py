"""The desktop side as an app beside the review (agentbox.apps): the folders the
server watches for renders (the `watch` setting; they send exports as `agentbox
watch` does, through the client), a notification when a review finishes (the
`notify` setting) — its settings, the `[desktop]` section (agentbox.desktop.settings)
—, the review's line in the log, and the folders' routes (`GET
/watch`, `POST /watch/pause`, `POST /watch/resume`: agentbox.desktop.watch_api). It
brings no agent and no table: it is a client of the engine that happens to run in
the server's process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from starlette.routing import BaseRoute, Route

from agentbox.apps import App, Host
from agentbox.client import configured_url
from agentbox.desktop.notifications import ReviewNotifications
from agentbox.desktop.review_log import ReviewLog
from agentbox.desktop.settings import DesktopSettings
from agentbox.desktop.watch_api import WatchRoutes
from agentbox.desktop.watched import Pause, WatchedFolders
from agentbox.http.openapi import ApiPart


class DesktopApp(App):
    name = "desktop"

    def __init__(self) -> None:
        self.watched: WatchedFolders | None = None
        self.notices: ReviewNotifications | None = None
        self.review_log: ReviewLog | None = None
        self._routes: list[BaseRoute] = []

    def setup(self, host: Host) -> None:
        settings = host.settings
        own = settings.of(DesktopSettings)
        self.review_log = ReviewLog(host.store)
        host.on_transition(self.review_log.on_transition)
        if own.notify:
            # a click opens the run's page on the page's private name (a session's)
            self.notices = ReviewNotifications(
                host.store, pages=host.pages.access.page_url(configured_url(settings)))
            host.on_transition(self.notices.on_transition)
        if own.watch:
            self.watched = watched = WatchedFolders.of(settings, host.admin_token)
            host.add_stats(lambda: {
                f"watch-{i}": folder.said for i, folder in enumerate(watched.status())})
            from agentbox.review.web.pages import ReviewPages

            review = host.service(ReviewPages)
            if review is not None:
                review.folders = watched  # the home page says what each folder is doing
        pause = self.watched.pause if self.watched else Pause(settings.data_dir)
        # On the live stream too: the tray sees a pause made on the page or the CLI.
        host.add_stats(lambda: {"watch_paused": pause.paused})
        routes = WatchRoutes(pause, self.watched, host.pages.access, host.pages.csrf)
        self._routes = [Route("/watch", routes.get, methods=["GET"]),
                        Route("/watch/pause", routes.pause_folders, methods=["POST"]),
                        Route("/watch/resume", routes.resume_folders, methods=["POST"])]

    def routes(self) -> Sequence[BaseRoute]:
        return self._routes

    def api(self) -> ApiPart:
        from agentbox.desktop.watch_api import api

        return api()

    async def start(self) -> None:
        if self.watched is not None:
            self.watched.start()  # its first scan waits for the server to answer

    async def stopping(self) -> None:
        if self.watched is not None:  # no new exports while the rest stops
            await asyncio.to_thread(self.watched.stop)

    async def stop(self) -> None:
        if self.notices is not None:
            await self.notices.close()
        if self.review_log is not None:
            await self.review_log.close()


app = DesktopApp()
