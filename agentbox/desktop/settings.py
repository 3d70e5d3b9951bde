"""The desktop side's settings, its section of agentbox.toml (`[desktop]`), each also
read from its AGENTBOX_* variable as before sections (and at the top of the file): a
notification when a review finishes, and the folders `serve` watches for renders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox.config import (
    ConfigError,
    app_settings,
    describe,
    env_name,
    folder_list,
    parse_bool,
    setting,
)
from agentbox.review.stage import STAGES


@dataclass(frozen=True)
class WatchedFolder:
    """A folder `agentbox serve` watches for renders (the `watch` setting)."""

    path: Path  # absolute
    stage: str | None = None  # mix or master; None: the review decides


def parse_watch(value: Any, where: str = env_name("watch")) -> tuple[WatchedFolder, ...]:
    """Watched folders: a TOML list of `PATH` or `PATH=STAGE` strings, or tables
    `{path = "...", stage = "master"}`; in the environment, `PATH` or `PATH=STAGE`
    items separated by the OS's path separator (`:`, on Windows `;`)."""
    folders = [_watched_folder(item, where) for item in folder_list(value)]
    seen: set[Path] = set()
    for folder in folders:
        if folder.path in seen:
            raise ConfigError(f"{where}: {str(folder.path)!r} is named twice")
        seen.add(folder.path)
    return tuple(folders)


def _watched_folder(item: Any, where: str) -> WatchedFolder:
    if isinstance(item, dict):
        unknown = sorted(set(item) - {"path", "stage"})
        if unknown or not isinstance(item.get("path"), str):
            raise ConfigError(f"{where}: a folder is a path, or a table with a path and a "
                              f"stage (got {describe(item)})")
        path, stage = item["path"], item.get("stage")
    elif isinstance(item, str):
        path, sep, stage = item.strip().rpartition("=")
        if not sep:
            path, stage = stage, None
    else:
        raise ValueError("expected a path")
    folder = Path(str(path).strip()).expanduser()
    if not str(path).strip() or not folder.is_absolute():
        raise ConfigError(f"{where}: {describe(item)} is not an absolute path (write the "
                          "whole path, or one starting with ~)")
    return WatchedFolder(folder, stage)


@app_settings("desktop")
@dataclass(frozen=True)
class DesktopSettings:
    notify: bool = setting(True, parse_bool)  # a desktop notification when a review finishes
    # Folders `serve` watches for renders, as `agentbox watch` does (its guarantees).
    watch: tuple[WatchedFolder, ...] = setting((), parse_watch)

    def check(self, named: Callable[[str], str]) -> None:
        for folder in self.watch:
            if folder.stage is not None and folder.stage not in STAGES:
                raise ConfigError(
                    f"{named('watch')}: {describe(f'{folder.path}={folder.stage}')}: the "
                    f"stage must be {' or '.join(STAGES)} (PATH=STAGE), not "
                    f"{describe(folder.stage)}")
