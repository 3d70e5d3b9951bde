"""What the API, the page and the CLI show of the store: one pydantic model per
view. The API answers with them and the OpenAPI document is generated from
them, so the documented shape and the real one are the same thing.

A run, its attempts, its state changes, its callbacks and the callback
destinations are agentbox.models' (the shape the document and the client read,
said once there): the store makes them, the API answers them as they are. The
subscriptions' views are the store's own below."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from agentbox.models import (
    AttemptView,
    DestinationView,
    HistoryEntry,
    NotificationView,
    RunDetail,
    RunView,
)

__all__ = ["AgentSubscriptionView", "AttemptView", "DestinationView", "HistoryEntry",
           "NotificationView", "RunDetail", "RunView", "SubscriptionView", "View"]


class View(BaseModel):
    """A view is read by attribute, or by name as a mapping (`run["status"]`: the
    page's templates and scripts that knew the JSON read it so)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __getitem__(self, name: str) -> Any:
        if name not in type(self).model_fields:
            raise KeyError(name)
        return getattr(self, name)


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
