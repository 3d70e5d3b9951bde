"""The review's answers, as models (agentbox.models' `Answer`): a project's exports
(`GET /exports`), what became of a project tidied, its reference track. The server
answers with them, the review's part of the OpenAPI document is made from them, and
the client (agentbox.client) reads its answers into them. Nothing here but pydantic
and agentbox.models: a program that only talks to agentbox imports it cheaply.
"""

from __future__ import annotations

from typing import Any

from agentbox.models import Answer


class ExportView(Answer):
    """One export of a project (a run of an event naming it) as `GET /exports` shows it."""

    run_id: str
    project: str
    agent: str
    status: str  # the run's status
    accepted_at: str  # ISO 8601, UTC
    finished_at: str | None  # ISO 8601, UTC, when terminal
    result: dict[str, Any] | None  # the agent's result (the review) when succeeded
    # Retention removed its run (GET /runs/{run_id} answers 404): what is here is all
    # that is kept of it.
    archived: bool = False
    # A project's exports (GET /exports?project=NAME): its place among them, the oldest
    # #1 (a re-judgment: the number of the export it judges), and the number of the
    # earliest one whose audio is identical (going back to an older version is a new
    # export; the latest's very bytes again are that export), else None.
    number: int | None = None
    same_audio_as: int | None = None


class ExportList(Answer):
    exports: list[ExportView]
    # Without a project: the cursor of the next page of projects (GET /exports?cursor=),
    # null on the last page. A project's exports come in one answer: no next_cursor.
    next_cursor: str | None = None


class ProjectChanged(Answer):
    """A project renamed, merged or removed (POST /projects/{project}/rename, /merge,
    /remove): the project it is now (None: removed) and what became of the other."""

    project: str | None
    was: str | None = None  # rename: its former name
    merged: str | None = None  # merge: the project merged into `project`
    removed: str | None = None  # remove: the project removed
    exports: int | None = None  # remove: how many exports left the pages
    audio_dropped: int | None = None  # remove: how many kept copies the archive let go


class OctaveBandOut(Answer):
    hz: float
    db: float  # the band's share of the track's power


class ReferenceOut(Answer):
    """A project's reference track, as `GET /projects/{project}/reference` shows it:
    its file and what was measured of it, once, when it was added."""

    project: str
    name: str  # its file's name
    sha256: str  # of its bytes, kept in the archive
    size_bytes: int
    added_at: str | None  # ISO 8601, UTC
    audio_url: str  # its bytes, for the page's A/B player
    integrated_lufs: float | None
    loudness_range_lu: float | None
    true_peak_dbtp: float | None
    plr_db: float | None
    stereo_correlation: float | None
    duration_seconds: float | None
    sample_rate: int | None
    channels: int | None
    octave_bands: list[OctaveBandOut]


class ReferenceList(Answer):
    references: list[ReferenceOut]


class ReferenceRemoved(Answer):
    removed: ReferenceOut
