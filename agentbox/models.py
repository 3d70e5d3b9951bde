"""What agentbox's API answers, as models: the shape of a run, an export, a
reference track, a callback, said once.

The server answers with them (http/api.py builds a run's answer from them), the
OpenAPI document is generated from them (http/openapi.py), and the client
(agentbox.client) reads its answers into them, so the document, the answers and
what a program reads cannot disagree. Nothing here imports the store, the review
or the server: a program that only talks to agentbox imports this and the client.

Every model is read by attribute (`run.status`); a field a newer agentbox adds is
kept as it came (`run.model_extra`), so one client reads an older or a newer
server alike, and `as_json()` gives back the answer as it was sent.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Answer(BaseModel):
    """Part of an answer of agentbox's API.

    `answer["status"]` reads a field by name too, as the client's dicts were read
    before it answered models (KeyError for a field it does not have)."""

    # The document says what this version answers (additionalProperties: false); a
    # client keeps what another version adds, and gives it back in as_json().
    model_config = ConfigDict(frozen=True, extra="allow",
                              json_schema_extra={"additionalProperties": False})

    def __getitem__(self, name: str) -> Any:
        if name in self.model_fields_set:  # a field the answer carried (a newer one's too)
            return getattr(self, name)
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def as_json(self) -> dict[str, Any]:
        """The answer as agentbox sent it: its fields, names and nulls, those of a
        newer version too; a field the answer left out stays out."""
        return self.model_dump(mode="json", exclude_unset=True)


# -- errors ---------------------------------------------------------------------------------


class ErrorAnswer(Answer):
    """Every error answer: what went wrong for programs (`error_code`), what to change
    for people (`message`), and an invalid event's field `errors` (`loc`, `msg`)."""

    # The document's name for it, as before: its `status` (not the receiver's exception).
    # Other fields may come with an error (additionalProperties, as the document said).
    model_config = ConfigDict(title="Rejected", json_schema_extra={})

    status: str = Field(pattern="^rejected$")
    error_code: str
    message: str
    errors: list[dict[str, Any]] | None = None


# -- sending --------------------------------------------------------------------------------


class RunRefOut(Answer):
    """One run an event started (one per agent it reached)."""

    run_id: str
    agent: str
    status: str
    status_url: str


class Accepted(Answer):
    """202 (stored) or 200 (a known duplicate: the first run's current status)."""

    status: str
    run_id: str
    duplicate: bool
    status_url: str
    runs: list[RunRefOut]


# -- runs -----------------------------------------------------------------------------------


class RunView(Answer):
    """The canonical state of a run (`GET /runs/{run_id}`, the items of `GET /runs`,
    a replay's answer)."""

    run_id: str
    status: str
    event_id: str
    event_type: str
    source: str
    agent: str
    idempotency_key: str
    project: str | None  # the event's payload.project_id (NFC), if it names one
    # The sender's own id of the request (webhook-id, svix-id); None when it sent none.
    webhook_id: str | None = None
    accepted_at: str
    started_at: str | None
    updated_at: str
    completed_at: str | None
    attempt: int  # every attempt, across replays
    retry_count: int
    next_attempt_at: str | None
    result: Any
    error_code: str | None
    error_message: str | None
    replays: int
    correlation_id: str | None
    causation_id: str | None
    hop: int
    terminal: bool
    # The name of the file the run's event names (payload.mix_url), whatever became
    # of the run: filled in by the API (GET /runs, GET /runs/{run_id}).
    file: str | None = None


class AttemptView(Answer):
    """One attempt of a run (a running one has no finish yet)."""

    attempt: int
    worker: str
    started_at: str | None
    finished_at: str | None
    outcome: str | None
    error_code: str | None
    error_message: str | None
    duration_ms: float | None


class HistoryEntry(Answer):
    """One state change of a run."""

    at: str | None
    status: str
    attempt: int
    note: str | None  # what happened when the status does not say it (replayed, discarded)


class NotificationView(Answer):
    """The delivery state of one callback notification."""

    notification_id: str
    run_id: str
    status: str  # the run state it reports (or "alert")
    destination: str
    state: str  # pending, delivered, dead
    attempts: int
    created_at: str | None
    next_attempt_at: str | None
    sending: bool
    last_attempt_at: str | None
    delivered_at: str | None
    last_error: str | None
    last_status_code: int | None


class RunDetail(RunView):
    """`GET /runs/{run_id}`: the run, its callbacks, and with `?history=1` its
    attempts and state changes (left out without it)."""

    callbacks: list[NotificationView]
    # When retention removed the event's raw body (ISO 8601, UTC): the run stays
    # readable, but it cannot be replayed any more.
    body_removed_at: str | None = None
    attempts: list[AttemptView] | None = None  # with ?history=1
    history: list[HistoryEntry] | None = None  # with ?history=1


class RunList(Answer):
    runs: list[RunView]


# -- exports and reference tracks -----------------------------------------------------------


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


# -- callbacks and maintenance --------------------------------------------------------------


class DestinationView(Answer):
    """A callback destination (a URL's origin) and its health."""

    destination: str
    state: str  # active, paused
    consecutive_failures: int
    paused_reason: str | None
    paused_at: str | None
    last_error: str | None
    updated_at: str | None
    pending: int


class Notifications(Answer):
    callbacks: list[NotificationView]


class Destinations(Answer):
    destinations: list[DestinationView]


class Resumed(Answer):
    """`POST /callbacks/destinations/resume`: the destination as `GET
    /callbacks/destinations` lists it (a DestinationView's fields), or only its name
    when it went from the list meanwhile."""

    destination: str
    state: str = "active"


class Pruned(Answer):
    """What a retention pass removed, or (dry_run) would remove, per table."""

    dry_run: bool
    runs_before: str  # finished runs older than this went (ISO 8601, UTC)
    bodies_before: str  # raw bodies of events finished before this went
    removed: dict[str, int]
    seconds: float
    free_pages: int = 0  # SQLite: free pages left in the file after the pass
    # What the apps add: the review's archive counts the exports' audio it let go.
    audio_dropped: int = 0
    notes: list[str] = []  # what apps kept or let go, in a sentence each


class LoginLink(Answer):
    """`POST /login-links`: a one-time link that logs one browser in to the page."""

    url: str  # open it once, within expires_in_seconds; ?next=PATH shows PATH after
    expires_in_seconds: float


class Health(Answer):
    """`GET /healthz`: ok or unhealthy, and the store's figures (more than named)."""

    model_config = ConfigDict(json_schema_extra={})  # the figures: additionalProperties

    status: str


class WatchedFolderOut(Answer):
    """One folder the server watches, as `GET /watch` shows it."""

    path: str
    stage: str | None  # mix or master: how its exports are judged, when the folder says
    state: str  # starting, watching, missing or unreadable
    said: str  # the state in a musician's words
    note: str = ""  # the last trouble told of it, cleared by success
    last_file: str = ""  # the last file handed over
    last_at: float | None = None  # when (Unix seconds)


class WatchState(Answer):
    """`GET /watch`, `POST /watch/pause`, `POST /watch/resume`: whether the watched
    folders are paused (renders found meanwhile are sent on resume), and each folder."""

    paused: bool
    folders: list[WatchedFolderOut]
