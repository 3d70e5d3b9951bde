"""What the API, the page and the CLI show of the store: one pydantic model per
view. The API answers with them and the OpenAPI document is generated from
them, so the documented shape and the real one are the same thing."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class View(BaseModel):
    """A view is read by attribute, or by name as a mapping (`run["status"]`: the
    page's templates and scripts that knew the JSON read it so)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __getitem__(self, name: str) -> Any:
        if name not in type(self).model_fields:
            raise KeyError(name)
        return getattr(self, name)


class RunView(View):
    """The canonical state of a run (`GET /runs/{run_id}`, the items of `GET /runs`)."""

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


class AttemptView(View):
    """One attempt of a run (a running one has no finish yet)."""

    attempt: int
    worker: str
    started_at: str | None
    finished_at: str | None
    outcome: str | None
    error_code: str | None
    error_message: str | None
    duration_ms: float | None


class HistoryEntry(View):
    """One state change of a run."""

    at: str | None
    status: str
    attempt: int
    note: str | None  # what happened when the status does not say it (replayed, discarded)


class NotificationView(View):
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


class DestinationView(View):
    """A callback destination (a URL's origin) and its health."""

    destination: str
    state: str  # active, paused
    consecutive_failures: int
    paused_reason: str | None
    paused_at: str | None
    last_error: str | None
    updated_at: str | None
    pending: int


class RunDetail(RunView):
    """`GET /runs/{run_id}`: the run, its callbacks, and with `?history=1` its
    attempts and state changes."""

    callbacks: list[NotificationView]
    # When retention removed the event's raw body (ISO 8601, UTC): the run stays
    # readable, but it cannot be replayed any more.
    body_removed_at: str | None = None
    attempts: list[AttemptView] | None = None  # with ?history=1
    history: list[HistoryEntry] | None = None  # with ?history=1


# -- subscriptions --------------------------------------------------------------------


class AgentSubscriptionView(View):
    """One change an agent made to the event types it receives."""

    agent: str
    event_type: str
    subscribed: bool
    run_id: str  # the run whose success made it
    changed_at: str


class SubscriptionView(View):
    """Another program's webhook subscription, as `GET /subscriptions` shows it.
    Its secret is never shown: `secret_hint` is a fingerprint of it."""

    id: str
    url: str
    event_types: list[str]
    state: str  # pending_verification, active, suspended, expired
    created_at: str
    refreshed_at: str
    expires_at: str
    refresh_before: str
    ttl_ms: int
    verified_at: str | None
    secret_hint: str
    last_error: str | None  # a category (timeout, http_503, challenge_mismatch, ...)
    consecutive_failures: int
    pending: int  # deliveries queued for it
