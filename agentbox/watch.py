"""`agentbox watch DIR`: for DAWs that cannot POST a webhook.

The folder is polled (no platform-specific notification API needed). An audio
file counts as finished once its size and modification time have not changed
for `settle` seconds; then a `session.exported` event is sent for it. The
event_id is derived from the file's path, size and content, so a restart of
the watcher, or a `touch`, sends the same id again, which agentbox answers as
a duplicate instead of starting a second run. Files already in the folder when
the watcher starts are left alone unless `include_existing` is set.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agentbox.events import unfit_for_a_name

AUDIO_SUFFIXES = frozenset({".wav", ".wave", ".flac", ".aif", ".aiff"})

Stamp = tuple[int, int]  # size, mtime_ns


def audio_files(folder: Path) -> Iterator[tuple[Path, Stamp]]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(root, name)
            if name.startswith(".") or path.suffix.lower() not in AUDIO_SUFFIXES:
                continue
            try:
                found = path.stat()
            except OSError:
                continue  # gone meanwhile
            yield path, (found.st_size, found.st_mtime_ns)


def content_id(path: Path, size: int) -> str:
    """The event_id of a finished file: its absolute path, size and content."""
    digest = hashlib.sha256(f"{path.resolve()}\0{size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "watch-" + digest.hexdigest()[:40]


def project_of(path: Path) -> str:
    """A project_id from the file name: its stem as written, characters a project
    name cannot hold (control and invisible ones) replaced by a space."""
    cleaned = "".join(" " if unfit_for_a_name(c) else c for c in path.stem)
    return cleaned.strip()[:256].strip() or "mix"


@dataclass
class Watcher:
    folder: Path
    settle: float = 2.0
    include_existing: bool = False
    clock: Callable[[], float] = time.monotonic
    _seen: dict[Path, tuple[Stamp, float]] = field(default_factory=dict)  # stamp, since when
    _done: dict[Path, Stamp] = field(default_factory=dict)  # last stamp sent (or skipped)
    _started: bool = False

    def poll(self) -> list[Path]:
        """Files that have just finished being written (each once per change)."""
        now = self.clock()
        current = dict(audio_files(self.folder))
        if not self._started:
            self._started = True
            if not self.include_existing:
                self._done.update(current)
        ready = []
        for path, stamp in current.items():
            if self._done.get(path) == stamp:
                continue
            previous = self._seen.get(path)
            if previous is None or previous[0] != stamp:
                self._seen[path] = (stamp, now)  # new or still changing
                continue
            if now - previous[1] >= self.settle and stamp[0] > 0:
                ready.append(path)
        for path in set(self._seen) - set(current):
            del self._seen[path]
        return ready

    @property
    def busy(self) -> bool:
        """Some file is still changing (or waiting to settle)."""
        return bool(self._seen)

    def sent(self, path: Path) -> None:
        """`path` was handed to agentbox (or refused for good): not again until it changes."""
        stamp = self._seen.pop(path, None)
        if stamp is not None:
            self._done[path] = stamp[0]
