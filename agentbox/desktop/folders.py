"""Watched folders: each finished render sent to agentbox, its review told when done.

`agentbox watch DIR` runs one folder in the foreground; a program that watches
folders beside other work (a server, a thread) calls `watch_folders`, which runs
given folders until its `stop` event is set:

    stop = threading.Event()
    with Client() as box:
        threading.Thread(target=watch_folders, args=([Folder(Path("~/Exports"))], box),
                         kwargs={"tell": print_news, "stop": stop,
                                 "data_dir": settings.data_dir}).start()

Which files are finished, and how one export stays one run however its writer
stalls, is `watch.Watcher`'s. Here: a finished file is handed to agentbox as a
`session.exported`; while agentbox cannot take it for a reason that heals
(unreachable, busy, unavailable, a signature refused while secrets are rotated)
it stays pending and is tried again with backoff (`watch.Pending`); a refusal of
the event itself drops it. Each run is then followed, and its review told; a
file written on after its run read it is reviewed whole by a follow-up
`mix.review_requested` naming the run. Everything is told as `News`, never
printed: the caller decides where it goes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbox.client import (
    AgentboxError,
    Client,
    NotFound,
    Refused,
    Unreachable,
    build_event,
    content_id,
    export_event,
)
from agentbox.desktop.watch import (
    DEFAULT_HEADERLESS_SETTLE_SECONDS,
    DEFAULT_SETTLE_SECONDS,
    Pending,
    Reviewing,
    Watcher,
    follow_up_id,
    reviewed_whole,
    state_file,
)
from agentbox.models import RunDetail
from agentbox.terminal import line, told

DEFAULT_INTERVAL_SECONDS = 1.0  # between scans of a folder
FOLLOW_EVERY_SECONDS = 1.0  # between looks at the runs whose review is awaited
SOURCE = "watch"  # the events' `source`
# Refusals that heal by themselves: a signature refused while the secret is rotated
# (or the clock is off). Busy and unavailable (429, 503) are Unreachable: they heal too.
HEALING_STATUSES = (401,)


@dataclass(frozen=True)
class Folder:
    """A folder to watch, and what its exports are sent as."""

    path: Path
    project: str | None = None  # default: each file's name
    profile: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)  # more payload fields
    settle: float = DEFAULT_SETTLE_SECONDS
    headerless_settle: float = DEFAULT_HEADERLESS_SETTLE_SECONDS
    include_existing: bool = False  # also send the files already there at start


@dataclass(frozen=True)
class News:
    """Something that happened to a file, as people read it (`text`: one line, or
    a review's lines)."""

    path: Path
    text: str
    problem: bool = False  # waiting, refused, not sent: a warning's place (stderr)
    run_id: str | None = None
    run: RunDetail | None = None  # the finished run, when its review is told


Tell = Callable[[News], None]


@dataclass
class Tally:
    """How a `FolderWatch.once` ended, counted: files refused, files not sent
    (unavailable). Not a run's outcome (the store's, the review's): files left over."""

    refused: int = 0
    unsent: int = 0


class FolderWatch:
    """One watched folder: its Watcher, the files agentbox has not taken yet, and the
    runs whose review is awaited."""

    def __init__(self, folder: Folder, client: Client, tell: Tell,
                 data_dir: Path | None = None, source: str = SOURCE) -> None:
        self.folder = folder
        self.client = client
        self.tell = tell
        self.source = source
        self.watcher = Watcher(
            folder.path, folder.settle, folder.include_existing,
            headerless_settle=folder.headerless_settle,
            state=None if data_dir is None else state_file(data_dir, folder.path),
            warn=lambda message: tell(News(folder.path, message, problem=True)),
            stalled=lambda path: tell(News(path, f"{line(path.name)}: still being written…",
                                           problem=True)))
        self.pending: dict[Path, Pending] = {}
        self.reviewing: dict[str, Reviewing] = {}  # run_id -> its file, until told
        self._followed = 0.0
        self._started = False

    def start(self) -> None:
        """The first scan: what is there now is left alone (unless include_existing,
        or sent unfinished by an earlier watcher, or written since the folder was
        last watched and not seen)."""
        if not self._started:
            self._started = True
            self.watcher.poll()

    # -- watching for ever --

    def turn(self, hold: bool = False) -> None:
        """One scan: finished files become pending, pending ones due are tried, and
        the reviews that finished are told. `hold` (paused): scanned, nothing sent;
        what finished meanwhile is sent at the first turn not held, oldest first."""
        self.start()
        now = time.monotonic()
        ready = self.watcher.poll()  # kept as found until sent: a restart still sends them
        if hold:
            return
        for path in sorted(ready, key=_written_at):
            found = self._event_id(path)
            if found is None:
                continue
            event_id, grown = found
            self.pending[path] = Pending(path, event_id, grown=grown)
            self.watcher.sent(path, event_id)  # pending now: not again until it changes
        for item in [p for p in self.pending.values() if p.due <= now]:
            self._hand_over(item)
        if self.reviewing and now - self._followed >= FOLLOW_EVERY_SECONDS:
            self._followed = now
            for again in self._tell_finished_reviews():
                self.pending.setdefault(again.path, again)

    def _hand_over(self, item: Pending) -> None:
        run_id = self._try_once(item)
        if run_id is None:
            item.later(time.monotonic())
            return
        del self.pending[item.path]
        if item.again_of is None:  # a follow-up's id is not the file's
            self.watcher.taken(item.path)
        if run_id:
            try:
                size = item.path.stat().st_size
            except OSError:
                return
            self.reviewing[run_id] = Reviewing(item.path.name, item.path, item.event_id,
                                               size, item.grown)

    def _try_once(self, item: Pending) -> str | None:
        """One attempt at handing a file over: its run_id, '' when it was refused for
        good (or is gone), None when it should be tried again later."""
        name = line(item.path.name)
        try:
            answer = self.client.post_event(self._event(item.path, item.event_id,
                                                        item.again_of))
        except Refused as exc:
            if exc.status not in HEALING_STATUSES:
                self.tell(News(item.path, f"{name}: refused: {line(exc.body)}", problem=True))
                return ""
            reason = f"{exc.status} {line(exc.error_code or '')}"
        except (AgentboxError, OSError) as exc:
            if not item.path.exists():
                self.tell(News(item.path, f"{name}: gone before agentbox took it",
                               problem=True))
                return ""
            reason = exc.reason if isinstance(exc, Unreachable) else str(exc)
        else:
            # "sent before", not the engine's "duplicate": said to a musician
            what = "sent before, its review is" if answer.duplicate else "accepted"
            if item.grown:  # the same export, written on: its run, not a new one
                what = "written on after it was sent; still"
            elif item.again_of:
                what = f"reviewed whole again (run {item.again_of} read it unfinished):"
            self.tell(News(item.path, f"{name}: {what} {answer.run_id}",
                           run_id=answer.run_id))
            return answer.run_id
        if reason != item.said:
            item.said = reason
            self.tell(News(item.path, f"{name}: waiting: {reason}; trying again with backoff",
                           problem=True))
        return None

    def _tell_finished_reviews(self) -> list[Pending]:
        """Tell the reviews that finished; the follow-ups to send for files written on
        after their run read them (their review is of less than the whole file)."""
        again: list[Pending] = []
        for run_id, item in list(self.reviewing.items()):
            try:
                run = self.client.run(run_id)
            except NotFound:
                del self.reviewing[run_id]  # removed meanwhile: nothing left to tell
                continue
            except AgentboxError:
                return again  # asked again at the next turn
            if not run.terminal:
                continue
            del self.reviewing[run_id]
            if item.grown and not reviewed_whole(run, item.size) and item.path.exists():
                again.append(Pending(item.path, follow_up_id(item.event_id, item.size),
                                     again_of=run_id))
                continue
            self.tell(News(item.path, "\n".join(told(run, item.name)), run_id=run_id,
                           run=run))
        return again

    # -- once: until nothing is being written --

    def once(self, retries: int, interval: float = DEFAULT_INTERVAL_SECONDS) -> Tally:
        """Send what finishes until nothing is being written (two quiet scans), each
        file tried `retries` times; after one file found agentbox unavailable, the
        rest are not tried."""
        self.start()
        idle, outcome = 0, Tally()
        while True:
            ready = self.watcher.poll()
            for path in sorted(ready, key=_written_at):  # the newest ends as the latest
                self._send_once(path, retries, outcome)
            idle = 0 if ready or self.watcher.busy else idle + 1
            if idle >= 2:
                return outcome
            time.sleep(interval)

    def _send_once(self, path: Path, retries: int, outcome: Tally) -> None:
        found = self._event_id(path)
        if found is None:
            return
        event_id, name = found[0], line(path.name)
        try:
            if outcome.unsent:  # agentbox was found unavailable: the rest are not tried
                raise Unreachable("not tried", "agentbox unavailable")
            answer = self.client.send_body(self._event(path, event_id), retries=retries)
        except Refused as exc:
            self.tell(News(path, f"{name}: refused: {line(exc.body)}", problem=True))
            outcome.refused += 1
        except AgentboxError:
            self.watcher.sent(path, event_id)  # not taken: a restart tries it again
            self.tell(News(path, f"{name}: not sent (agentbox unavailable)", problem=True))
            outcome.unsent += 1
            return
        else:
            # "sent before", not the engine's "duplicate": said to a musician
            what = "sent before, its review is" if answer.duplicate else "accepted"
            self.tell(News(path, f"{name}: {what} {answer.run_id}", run_id=answer.run_id))
        self.watcher.sent(path, event_id)
        self.watcher.taken(path)

    # -- the events --

    def _event_id(self, path: Path) -> tuple[str, bool] | None:
        """The event_id of a finished file, and whether it is an export sent before and
        written on since (same event_id: one export, one run); else the id comes from
        its path, size, modification time and content (a restart: the same id again;
        a new render of the same audio: a new export)."""
        try:
            stat = path.stat()
            own = content_id(path, stat.st_size, stat.st_mtime_ns)
        except OSError:
            return None  # gone meanwhile
        earlier = self.watcher.continues(path)
        if earlier is not None:
            return str(earlier.event_id), earlier.event_id != own
        return own, False

    def _event(self, path: Path, event_id: str, again_of: str | None = None) -> bytes:
        """session.exported for a finished file; with `again_of`, the follow-up that has
        the whole file reviewed when the run `again_of` read it before it was all
        written."""
        fields = {**self.folder.payload,
                  **({"profile": self.folder.profile} if self.folder.profile else {})}
        event = export_event(path, event_id, self.folder.project, self.source, **fields)
        if again_of is not None:
            payload = event["payload"]
            payload["requested_by"] = "agentbox watch"
            payload["note"] = (f"{path.name} was written on after run {again_of} reviewed "
                               "it: the whole file, reviewed again")
            event = build_event("mix.review_requested", self.source, event_id, payload)
            event["causation_id"] = again_of
        return json.dumps(event, separators=(",", ":")).encode()


def _written_at(path: Path) -> int:
    """When a file was last written (0 if gone): the newest render is reviewed last."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def watch_folders(folders: Iterable[Folder], client: Client, tell: Tell, *,
                  stop: threading.Event, data_dir: Path | None = None,
                  interval: float = DEFAULT_INTERVAL_SECONDS, source: str = SOURCE) -> None:
    """Watch `folders` until `stop` is set (from another thread, or a signal handler):
    each finished file sent, each review told. `data_dir`: where what was sent is
    kept, so a restart goes on where it stopped (None: in memory only). Runs in the
    calling thread; from asyncio, `await asyncio.to_thread(watch_folders, ...)`."""
    watches = [FolderWatch(folder, client, tell, data_dir, source) for folder in folders]
    run_watches(watches, stop, interval)


def run_watches(watches: Iterable[FolderWatch], stop: threading.Event,
                interval: float = DEFAULT_INTERVAL_SECONDS) -> None:
    """Turn each watch, every `interval` seconds, until `stop` is set."""
    watches = list(watches)
    while not stop.is_set():
        for watch in watches:
            watch.turn()
        stop.wait(interval)
