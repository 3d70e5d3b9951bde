"""A desktop notification when a mix review finishes, for the musician beside the DAW.

Sent by the server process through desktop-notifier (D-Bus on Linux, the
notification centre on macOS and Windows). Opt out with `notify = false` in
agentbox.toml or AGENTBOX_NOTIFY=0. Clicking one opens the review it speaks of
(the run's page) in the browser, where the desktop tells a click.

A notification is a courtesy, never part of a run: it is sent from a task of
its own after the run's state is stored, with a time limit, and whatever
happens to it (no library, no session bus, no notification server, a slow one)
is logged once and changes nothing else. Nothing here blocks the event loop:
desktop-notifier speaks D-Bus asynchronously on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import webbrowser
from collections.abc import Awaitable, Callable, Mapping
from pathlib import PurePath
from typing import Any

from agentbox.logs import get_logger, one_line
from agentbox.review import digest, present
from agentbox.runs import TERMINAL
from agentbox.store import Store, Transition

log = get_logger("notifications")

APP_NAME = "agentbox"
MIX_REVIEW_AGENT = "agentbox.review.agent:mix_review"
SEND_TIMEOUT_SECONDS = 5.0

# title, body, and the page a click on it opens (None: a click opens nothing)
Send = Callable[[str, str, str | None], Awaitable[None]]


def message(run: Mapping[str, Any], event: Mapping[str, Any] | None = None
            ) -> tuple[str, str]:
    """(summary, body): `Review: pass · night-drive.wav`, `-14.2 LUFS · true peak …`.
    `event`: the run's event, which names the file when the run has no result."""
    name = digest.file_name(run) or _file_of(event) or digest.project_of(run) or "your mix"
    if run.get("status") != "succeeded":
        error = run.get("error_code")
        # the agent's sentence, else why in a musician's words: never a run state
        why = present.outcome(str(run.get("status")), error).text
        return f"Review failed · {name}", one_line(run.get("error_message") or why)
    verdict = digest.run_verdict(run)
    title = "Review" if verdict == "succeeded" else f"Review: {verdict}"
    return f"{title} · {name}", digest.headline(run.get("result")) or "reviewed"


def _file_of(event: Mapping[str, Any] | None) -> str:
    payload = event.get("payload") if isinstance(event, Mapping) else None
    mix_url = payload.get("mix_url") if isinstance(payload, Mapping) else None
    if not isinstance(mix_url, str):
        return ""
    return one_line(PurePath(mix_url.replace("\\", "/")).name)


async def desktop_sender() -> Send | None:
    """desktop-notifier's send, or None when it is not installed (a trimmed install)."""
    try:
        from desktop_notifier import DesktopNotifier
    except ImportError:
        return None
    # It logs every failure with a traceback and does not raise; agentbox says it once.
    logging.getLogger("desktop_notifier").setLevel(logging.CRITICAL)
    notifier = DesktopNotifier(app_name=APP_NAME)

    async def send(title: str, body: str, link: str | None = None) -> None:
        dispatched: list[bool] = []
        await notifier.send(title=title, message=body,
                            on_dispatched=lambda: dispatched.append(True),
                            on_clicked=None if link is None else lambda: open_page(link))
        if not dispatched:
            raise NotificationUnavailable("no notification server took it (no desktop "
                                          "session, or its notifications are off)")

    return send


def open_page(url: str) -> None:
    """Open `url` in the browser from a thread of its own: finding and starting the
    browser blocks, and the click is told on the server's event loop."""
    threading.Thread(target=webbrowser.open, args=(url,), name="agentbox-open",
                     daemon=True).start()


class NotificationUnavailable(Exception):
    """The desktop did not take a notification."""


class ReviewNotifications:
    """A dispatcher listener: a notification for each mix review that reaches a
    terminal state (succeeded, failed for good, dead-lettered)."""

    def __init__(self, store: Store, sender: Callable[[], Awaitable[Send | None]]
                 = desktop_sender, pages: str | None = None) -> None:
        self.store = store
        self.pages = pages  # this server's address: a click opens the run's page there
        self._make_sender = sender
        self._send: Send | None = None
        self._ready = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._complained = False

    def on_transition(self, transition: Transition) -> None:
        if transition.status not in TERMINAL or transition.agent != MIX_REVIEW_AGENT:
            return
        task = asyncio.get_running_loop().create_task(self._notify(transition.run_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _notify(self, run_id: str) -> None:
        try:
            found = await self.store.get_run(run_id)
            if found is None:
                return
            run = found.model_dump(mode="json")
            event = None if run.get("result") else await self.store.event_of(run_id)
            if not self._ready:
                self._ready, self._send = True, await self._make_sender()
                if self._send is None:
                    log.info("desktop notifications need desktop-notifier: pip install "
                             "desktop-notifier (or set notify = false)")
            if self._send is not None:
                link = None if self.pages is None else f"{self.pages}/ui/runs/{run_id}"
                await asyncio.wait_for(self._send(*message(run, event), link),
                                       SEND_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no session bus, no server, a slow one: never the run's
            if not self._complained:
                self._complained = True
                log.warning("a desktop notification could not be shown; reviews go on "
                            "(said once)", extra={"error": f"{type(exc).__name__}: "
                                                           f"{one_line(exc)[:200]}"})

    async def close(self) -> None:
        """Cancel notifications still on their way (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
