"""The desktop side as an app beside the review (agentbox.http.apps): the folders the
server watches for renders (the `watch` setting; they send exports as `agentbox
watch` does, through the client), a notification when a review finishes (the
`notify` setting), and the review's line in the log. It brings no agent and no
table: it is a client of the engine that happens to run in the server's process.
"""

from __future__ import annotations

import asyncio

from agentbox.desktop.notifications import ReviewNotifications
from agentbox.desktop.review_log import ReviewLog
from agentbox.desktop.watched import WatchedFolders
from agentbox.http.apps import App, Host


class DesktopApp(App):
    name = "desktop"

    def __init__(self) -> None:
        self.watched: WatchedFolders | None = None
        self.notices: ReviewNotifications | None = None
        self.review_log: ReviewLog | None = None

    def setup(self, host: Host) -> None:
        settings = host.settings
        self.review_log = ReviewLog(host.store)
        host.on_transition(self.review_log.on_transition)
        if settings.notify:
            self.notices = ReviewNotifications(host.store)
            host.on_transition(self.notices.on_transition)
        if settings.watch:
            self.watched = watched = WatchedFolders.of(settings, host.admin_token)
            host.pages.stats_extras.append(lambda: {
                f"watch-{i}": folder.said for i, folder in enumerate(watched.status())})
            review = host.service("review pages")
            if review is not None:
                review.folders = watched  # the home page says what each folder is doing

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
