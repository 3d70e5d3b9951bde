"""What agentbox's API answers, as models: the shape of a run, a callback, a
pruning, said once (an app's answers are its own: agentbox.review.answers,
agentbox.desktop.answers, on `Answer` as these are).

The server answers with them (http/api.py builds a run's answer from them), the
OpenAPI document is generated from them (http/openapi.py), and the client
(agentbox.client) reads its answers into them, so the document, the answers and
what a program reads cannot disagree. Nothing here imports the store, an app
or the server: a program that only talks to agentbox imports this and the client.

Every model is read by attribute (`run.status`); a field a newer agentbox adds is
kept as it came (`run.model_extra`), so one client reads an older or a newer
server alike, and `as_json()` gives back the answer as it was sent.
"""

from __future__ import annotations

from typing import Any, Generic, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

# A run's state, as the API says it (agentbox.runs.RunStatus's values): a type checker
# knows them (`run.status == "succeded"` is an error), a program matches on them.
RunState = Literal["accepted", "processing", "succeeded", "failed_retryable",
                   "failed_permanent", "dead_lettered"]
# The model a run's result is read into (RunDetail[MixReview]); by default a JSON
# object, as any agent's result is stored.
ResultT = TypeVar("ResultT", bound=BaseModel | dict[str, Any], default=dict[str, Any])


class Answer(BaseModel):
    """Part of an answer of agentbox's API.

    `answer["status"]` reads a field by name too, as the client's dicts were read
    before it answered models (KeyError for a field it does not have)."""

    # The document says what this version answers (additionalProperties: false); a
    # client keeps what another version adds, and gives it back in as_json().
    # defer_build: a model's validator is built when it first reads an answer, not when
    # agentbox.models is imported (`agentbox runs` reads two of the twenty).
    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True,
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
    a replay's answer). The fields the apps add to a run's view (their tables'
    `run_fields`; the review's `project`) come after these, as extra fields: read by
    attribute (`run.project`) or by name (`run.get("project")`), and declared in the
    app's part of the API document (ApiPart.run_fields)."""

    run_id: str
    status: RunState
    event_id: str
    event_type: str
    source: str
    agent: str
    idempotency_key: str
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


class RunDetail(RunView, Generic[ResultT]):
    """`GET /runs/{run_id}`: the run, its callbacks, and with `?history=1` its
    attempts and state changes (left out without it).

    `result` is the agent's result once it succeeded, else None: a JSON object, or
    read into the agent's own model as `RunDetail[ThatModel]` (what `Client.run` and
    `Client.follow` answer when given `result=ThatModel`)."""

    result: ResultT | None
    callbacks: list[NotificationView]
    # When retention removed the event's raw body (ISO 8601, UTC): the run stays
    # readable, but it cannot be replayed any more.
    body_removed_at: str | None = None
    attempts: list[AttemptView] | None = None  # with ?history=1
    history: list[HistoryEntry] | None = None  # with ?history=1


class RunList(Answer):
    runs: list[RunView]


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
