"""The review's records: an export of a project, the audio a review heard, a
project's reference track. Plain frozen values, read from the review's own tables
(agentbox.archive.history)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProjectExport:
    """One run of an event that names a project (an export), for the project
    pages and the comparison with the previous export."""

    run_id: str
    project: str
    agent: str
    status: str  # the run's status
    accepted_at: str  # ISO 8601, UTC
    finished_at: str | None  # ISO 8601, UTC, when terminal
    result: dict[str, Any] | None  # the agent's result document when succeeded
    # Retention removed the run (GET /runs/{id} answers 404): this is what the
    # project's history kept of it (project_exports). Where it is kept, not what it
    # is: an export compares equal before and after retention.
    archived: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class ProjectLatest:
    """A project as the home page lists it: its latest export, how many exports it
    shows, and where it stands in the order of latest exports (`position`: the
    latest's acceptance, in seconds, and run id; a page's cursor)."""

    latest: ProjectExport
    exports: int
    position: tuple[float, str]


@dataclass(frozen=True, kw_only=True)
class KeptAudio:
    """The bytes a review heard, kept by the archive (agentbox.archive) under their
    SHA-256 in the archive folder of `keeper`, the instance that reviewed them."""

    run_id: str
    project: str
    sha256: str
    size: int
    file_name: str
    keeper: str
    kept_at: float
    dropped_at: float | None = None  # the archive let them go: no longer playable
    dropped_because: str | None = None  # why, in a few words a page can show


@dataclass(frozen=True, kw_only=True)
class ProjectReference:
    """A project's reference track: its bytes in `keeper`'s archive, and what the
    meter measured of it once, when it was added (every review compares with it)."""

    project: str
    name: str  # its file's name
    sha256: str
    size: int
    keeper: str
    measurements: dict[str, Any]
    added_at: float
