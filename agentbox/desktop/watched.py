"""The folders `agentbox serve` watches (the `watch` setting): each render that
finishes in one is reviewed by the server that starts at login, with no
terminal open and no `agentbox watch` running.

Each folder is watched by `folders.FolderWatch`, the loop `agentbox watch DIR`
runs, with its guarantees: a file counts once it has settled and its header says
the audio is all there; one export is one run however its writer stalls; and
what was sent is kept in the same state file, so a restarted server (or an
`agentbox watch` of the same folder) goes on where the last one stopped.

It hands the files to this server over loopback HTTP, signed with the server's
own current secret, as `agentbox watch` would. Not a call into the receiver:
the watcher's guarantees are the watch loop's and the receiver's together (a
signature refused while secrets rotate, 429 while the queue is full, 503 while
storage is down: the file waits and is tried again, never lost). Over loopback
they hold unchanged, with nothing written twice, for about a millisecond per
export.

Nothing here runs on the event loop: one thread scans every folder once a second
(as `agentbox watch` does), at low priority beside the DAW. A folder that is not
there (an unplugged drive, one not made yet) is looked for at each turn and
watched once it appears; one that goes away is let go until it is back, so the
files on a drive plugged in again are not taken for new exports. `status()` says
how each folder is, for the page.

Paused (`POST /watch/pause`, the tray, `agentbox watch pause`), the folders are
still scanned but nothing is sent: the renders written meanwhile are kept as found
(in the same state file, so a restart still sends them) and sent on resume, oldest
first so that the newest is reviewed last. The pause is a file in the data
directory (`Pause`): it survives a restart of the server.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from agentbox import portable
from agentbox.client import Client, configured_url
from agentbox.config import ConfigError, Settings, secrets_in_file
from agentbox.desktop.folders import DEFAULT_INTERVAL_SECONDS, Folder, FolderWatch, News
from agentbox.desktop.settings import DesktopSettings, WatchedFolder
from agentbox.logs import get_logger
from agentbox.review.contract import SessionExported
from agentbox.terminal import line

log = get_logger("watch")

SOURCE = "watch"  # the events' source, as `agentbox watch` sends them
STAGE_FIELD = "default_stage"  # the payload field a folder's stage travels in
READY_WAIT_SECONDS = 0.5  # between looks at whether this server answers yet
JOIN_SECONDS = 10.0  # at shutdown: a turn in progress is given this long to end
PAUSE_FILE = "paused"  # in the data directory's watch/: there while the folders are paused


@dataclass(frozen=True)
class FolderStatus:
    """How one watched folder is, as the page shows it."""

    path: Path
    stage: str | None
    state: str  # starting, watching, missing or unreadable
    note: str = ""  # the last trouble told of it (waiting, refused), cleared by success
    last_file: str = ""  # the last file handed over
    last_at: float | None = None  # when (time.time())

    @property
    def watching(self) -> bool:
        return self.state == "watching"

    @property
    def said(self) -> str:
        """The state in a musician's words."""
        return STATES[self.state]

    @property
    def judged(self) -> str:
        return f"its exports judged as {self.stage}s" if self.stage else ""


STATES = {"starting": "starting…", "watching": "watching",
          "missing": "not there: watched as soon as it appears",
          "unreadable": "cannot be read: check that agentbox may open it"}


class Pause:
    """Whether the watched folders are paused: a file in the data directory, so that a
    pause outlives the server (a musician who paused for a long session of takes does
    not want them all reviewed after a reboot)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "watch" / PAUSE_FILE
        self._paused = self.path.exists()

    @property
    def paused(self) -> bool:
        return self._paused

    def set(self, paused: bool) -> None:
        """Pause or resume; kept on disk before this returns (OSError if it cannot be)."""
        if paused:
            portable.private_directory(self.path.parent)
            portable.write_durably(self.path, "paused\n")
        else:
            self.path.unlink(missing_ok=True)
        self._paused = paused


class ServerClient(Client):
    """This server, reached over loopback, signing with its current secret (read
    afresh from its file, so a rotation needs no restart here either)."""

    def __init__(self, settings: Settings, admin_token: str) -> None:
        super().__init__(configured_url(settings), admin_token=admin_token, environ={})
        self._settings = settings

    def signing_secret(self) -> str:
        if self._settings.webhook_secret_file is not None:
            try:
                return secrets_in_file(self._settings.webhook_secret_file)[0]
            except ConfigError:
                pass  # removed or emptied meanwhile: the secret the server started with
        return self._settings.webhook_secret[0]

    def answers(self) -> bool:
        """Whether this server is listening yet (any answer from /healthz)."""
        try:
            self._http.get(self.url + "/healthz", timeout=5)
        except httpx.HTTPError:
            return False
        return True


class WatchedFolders:
    """The configured folders, watched by one low-priority thread until `stop`."""

    def __init__(self, folders: Sequence[WatchedFolder], client: ServerClient,
                 data_dir: Path, interval: float = DEFAULT_INTERVAL_SECONDS,
                 pause: Pause | None = None) -> None:
        self.client = client
        self.data_dir = data_dir
        self.interval = interval
        self.pause = pause or Pause(data_dir)
        self._status = {f.path: FolderStatus(f.path, f.stage, "starting") for f in folders}
        self._stages = {f.path: f.stage for f in folders}
        self._watches: dict[Path, FolderWatch] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, settings: Settings, admin_token: str) -> WatchedFolders:
        return cls(settings.of(DesktopSettings).watch, ServerClient(settings, admin_token),
                   settings.data_dir)

    @property
    def paused(self) -> bool:
        return self.pause.paused

    def status(self) -> list[FolderStatus]:
        with self._lock:
            return list(self._status.values())

    def start(self) -> None:
        if self._status and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agentbox-watch",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the thread to stop and wait for its turn to end (blocks: call it from a
        thread, not the event loop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_SECONDS)
        self.client.close()

    # -- the thread --

    def _run(self) -> None:
        portable.lower_thread_priority()
        while not self._stop.is_set() and not self.client.answers():
            self._stop.wait(READY_WAIT_SECONDS)
        for path in self._status:
            log.info("watching a folder for renders", extra={"folder": str(path)})
        while not self._stop.is_set():
            for path in self._status:
                self._turn(path)
            self._stop.wait(self.interval)

    def _turn(self, path: Path) -> None:
        state = _state_of(path)
        if state != "watching":
            self._watches.pop(path, None)  # let go: a folder back is started afresh
            self._set(path, state=state)
            return
        watch = self._watches.get(path) or self._watch(path)
        try:
            watch.turn(hold=self.pause.paused)
        except Exception as exc:  # one folder's trouble never stops the others
            self._watches.pop(path, None)
            self._set(path, state="unreadable", note=f"{type(exc).__name__}: "
                                                     f"{line(exc)[:200]}")
            log.warning("a watched folder could not be scanned; looking again",
                        extra={"folder": str(path), "error": type(exc).__name__})
            return
        self._set(path, state="watching")

    def _watch(self, path: Path) -> FolderWatch:
        folder = Folder(path, payload=stage_payload(self._stages[path]))
        watch = FolderWatch(folder, self.client, self._tell, self.data_dir, SOURCE)
        self._watches[path] = watch
        return watch

    def _tell(self, news: News) -> None:
        folder = next((p for p in self._status if news.path.is_relative_to(p)),
                      news.path.parent)
        first = news.text.splitlines()[0] if news.text else ""
        if news.problem:
            self._set(folder, note=first)
            log.warning(first, extra={"folder": str(folder)})
        elif news.run is None:  # handed over (a review told later is the run's own log)
            self._set(folder, note="", last_file=news.path.name, last_at=time.time())
            log.info(first, extra={"folder": str(folder), "run_id": news.run_id})

    def _set(self, path: Path, **changes: object) -> None:
        with self._lock:
            found = self._status.get(path)
            if found is not None:
                self._status[path] = replace(found, **changes)  # type: ignore[arg-type]


def stage_payload(stage: str | None) -> dict[str, str]:
    """A folder's stage as its exports carry it: below the event's own stage and the
    project's, above the configuration's (the review's order). Sent once the event
    contract has the field; before, it would be refused as an unknown one."""
    if stage is None or STAGE_FIELD not in SessionExported.model_fields:
        return {}
    return {STAGE_FIELD: stage}


def _state_of(path: Path) -> str:
    """watching (there and readable), missing, or unreadable."""
    if not path.is_dir():
        return "missing"
    return "watching" if os.access(path, os.R_OK | os.X_OK) else "unreadable"
