"""A desktop notification when a mix review finishes, for the musician beside the DAW.

Sent by the server process through desktop-notifier (D-Bus on Linux, the
notification centre on macOS and Windows). Opt out with `notify = false` in
agentbox.toml or AGENTBOX_NOTIFY=0.

A notification is a courtesy, never part of a run: it is sent from a task of
its own after the run's state is stored, with a time limit, and whatever
happens to it (no library, no session bus, no notification server, a slow one)
is logged once and changes nothing else. Nothing here blocks the event loop:
desktop-notifier speaks D-Bus asynchronously on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import PurePath
from typing import Any

from agentbox.logs import get_logger, one_line
from agentbox.review import digest
from agentbox.store import Store, Transition

log = get_logger("notifications")

APP_NAME = "agentbox"
MIX_REVIEW_AGENT = "agentbox.review.agent:mix_review"
SEND_TIMEOUT_SECONDS = 5.0
TERMINAL = frozenset({"succeeded", "failed_permanent", "dead_lettered"})

Send = Callable[[str, str], Awaitable[None]]


def message(run: Mapping[str, Any], event: Mapping[str, Any] | None = None
            ) -> tuple[str, str]:
    """(summary, body): `Review: pass · night-drive.wav`, `-14.2 LUFS · true peak …`.
    `event`: the run's event, which names the file when the run has no result."""
    name = digest.file_name(run) or _file_of(event) or digest.project_of(run) or "your mix"
    if run.get("status") != "succeeded":
        error = run.get("error_code")
        return (f"Review failed · {name}",
                one_line(run.get("error_message") or error or run.get("status")))
    verdict = digest.verdict_of(run)
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

    async def send(title: str, body: str) -> None:
        dispatched: list[bool] = []
        await notifier.send(title=title, message=body,
                            on_dispatched=lambda: dispatched.append(True))
        if not dispatched:
            raise NotificationUnavailable("no notification server took it (no desktop "
                                          "session, or its notifications are off)")

    return send


class NotificationUnavailable(Exception):
    """The desktop did not take a notification."""


class ReviewNotifications:
    """A dispatcher listener: a notification for each mix review that reaches a
    terminal state (succeeded, failed for good, dead-lettered)."""

    def __init__(self, store: Store, sender: Callable[[], Awaitable[Send | None]]
                 = desktop_sender) -> None:
        self.store = store
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
                await asyncio.wait_for(self._send(*message(run, event)), SEND_TIMEOUT_SECONDS)
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
