"""The store: durable events, idempotency claims, runs, their history and the
callback outbox, behind one interface (`Store`, in interface.py) with an engine
for SQLite and one for PostgreSQL. The rest of agentbox imports what it needs
from here (and `engines` to choose one); errors.py holds the refusals, records.py
the plain records, views.py what the API shows.
"""

from agentbox.store.errors import (
    AdmissionRefused,
    BodyRemoved,
    DestinationNotFound,
    NoSubscribedAgent,
    NotReplayable,
    RunNotFound,
    SchemaTooNew,
    StorageUnavailable,
    StoreError,
    StoreInUse,
    SubscriptionNotFound,
    TooManySubscriptions,
)
from agentbox.store.interface import Store
from agentbox.store.records import (
    ClaimedRun,
    ClaimResult,
    DeliveryResult,
    Emitted,
    IngestResult,
    KeptAudio,
    Lease,
    Notification,
    Outcome,
    ProjectExport,
    ProjectReference,
    PruneStep,
    RemoteChange,
    RunRef,
    SubscriptionTarget,
    Transition,
    Verification,
    iso,
    notification,
    project_of,
)
from agentbox.store.views import (
    AgentSubscriptionView,
    AttemptView,
    DestinationView,
    HistoryEntry,
    NotificationView,
    RunDetail,
    RunView,
    SubscriptionView,
)

__all__ = [
    "AdmissionRefused", "AgentSubscriptionView", "AttemptView", "BodyRemoved", "ClaimResult",
    "ClaimedRun", "DeliveryResult", "DestinationNotFound", "DestinationView", "Emitted",
    "HistoryEntry", "IngestResult", "KeptAudio", "Lease", "NoSubscribedAgent", "NotReplayable",
    "Notification", "NotificationView", "Outcome", "ProjectExport", "ProjectReference", "PruneStep",
    "RemoteChange", "RunDetail", "RunNotFound", "RunRef", "RunView", "SchemaTooNew",
    "StorageUnavailable", "Store", "StoreError", "StoreInUse", "SubscriptionNotFound",
    "SubscriptionTarget", "SubscriptionView", "TooManySubscriptions", "Transition",
    "Verification", "iso", "notification", "project_of",
]
