"""The archive's settings, in the review's section of agentbox.toml (`[review]`): the
bytes each review heard, kept in the data directory within a total size and a number
per project, oldest dropped first; and the free space it and the uploads leave."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentbox.config import (
    ConfigError,
    app_settings,
    parse_bool,
    parse_positive_float,
    parse_positive_int,
    setting,
)

# 5 GB holds some sixty 5-minute 24-bit stereo mixes; 20 per project, the last
# evening's renders of a song. A project page lists at most MAX_KEEP_PER_PROJECT
# exports, so an archive keeping more would keep audio no page could play.
DEFAULT_ARCHIVE_MAX_GB = 5.0
DEFAULT_ARCHIVE_KEEP_PER_PROJECT = 20
MAX_KEEP_PER_PROJECT = 200
# Free space the archive and reference uploads leave on the data directory's disk:
# below it they are refused (507 insufficient_storage), so that the database, whose
# writes are the promise of every 202, and the DAW's own renders still find room.
DEFAULT_MIN_FREE_MB = 500
FOLDER = "archive"  # in the data directory


@app_settings("review")
@dataclass(frozen=True)
class ArchiveSettings:
    # The reviewed bytes kept (off: only a file still as it was reviewed can be
    # played), within a size in GB and a number per project.
    archive: bool = setting(True, parse_bool)
    archive_max_gb: float = setting(DEFAULT_ARCHIVE_MAX_GB, parse_positive_float)
    archive_keep_per_project: int = setting(DEFAULT_ARCHIVE_KEEP_PER_PROJECT,
                                            parse_positive_int)
    min_free_mb: int = setting(DEFAULT_MIN_FREE_MB, parse_positive_int)

    @property
    def max_bytes(self) -> int:
        return int(self.archive_max_gb * 1_000_000_000)

    @property
    def min_free_bytes(self) -> int:
        return self.min_free_mb * 1_000_000

    def check(self, named: Callable[[str], str]) -> None:
        if self.archive_keep_per_project > MAX_KEEP_PER_PROJECT:
            raise ConfigError(f"{named('archive_keep_per_project')} must be at most "
                              f"{MAX_KEEP_PER_PROJECT}: a project's page lists its latest "
                              f"{MAX_KEEP_PER_PROJECT} exports, and audio kept beyond them "
                              "could not be played")


def archive_path(data_dir: Path) -> Path:
    """Where the archive of exports keeps its files."""
    return data_dir / FOLDER
