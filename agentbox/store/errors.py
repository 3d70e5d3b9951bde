"""The store's refusals: each says what happened and what to do, and the HTTP
side maps it to one answer (StorageUnavailable: 503, AdmissionRefused: 429, ...)."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of the store's refusals."""


class EngineMissing(StoreError):
    """The engine the configuration names is not installed (PostgreSQL without psycopg):
    a problem of the set-up, not of the database."""


class StorageUnavailable(StoreError):
    """The database cannot take writes (disk full, read-only, I/O error): answer 503."""


class StoreInUse(StorageUnavailable):
    """Another process serves this (SQLite) store: ask it, through its API."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer agentbox: this one must not write to it."""

    def __init__(self, database: str, version: int, known: int) -> None:
        super().__init__(
            f"the database {database} has schema version {version}, newer than this agentbox "
            f"knows (up to {known}): it was written by a newer agentbox. Upgrade agentbox "
            "(or point it at another database); nothing was changed.")
        self.version, self.known = version, known


class AdmissionRefused(StoreError):
    """Too many runs are not yet terminal: answer 429 with Retry-After."""

    def __init__(self, pending: int, limit: int) -> None:
        super().__init__(f"{pending} runs are waiting (limit {limit})")
        self.pending, self.limit = pending, limit


class RunNotFound(StoreError):
    pass


class NoSubscribedAgent(StoreError):
    """No agent receives this event type now (none configured, or every one
    unsubscribed): answer 422 no_agent; nothing was stored."""

    def __init__(self, event_type: str) -> None:
        super().__init__(f"no agent is subscribed to {event_type}")
        self.event_type = event_type


class SubscriptionNotFound(StoreError):
    pass


class TooManySubscriptions(StoreError):
    """As many subscriptions as allowed exist already: answer 409; nothing was stored."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} subscriptions exist already (the most allowed)")
        self.limit = limit


class NotReplayable(StoreError):
    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id} is {status}; only dead_lettered or failed_permanent "
                         "runs can be replayed")
        self.status = status


class BodyRemoved(NotReplayable):
    """The run's event body was removed by retention: there is nothing to run again."""

    def __init__(self, run_id: str, status: str) -> None:
        StoreError.__init__(
            self, f"run {run_id} cannot be replayed: its event's body was removed by "
            "retention (AGENTBOX_BODY_RETENTION_DAYS); send the event again instead")
        self.status = status


class DestinationNotFound(StoreError):
    pass
