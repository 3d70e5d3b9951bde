"""What the store conformance suite's tests share: a fake clock's constants, event
bodies, and short forms of the store's calls."""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, TypeVar

import pytest

from agentbox.archive.history import SCHEMA as HISTORY
from agentbox.archive.history import History
from agentbox.events import parse_event
from agentbox.runs import RunStatus
from agentbox.store import (
    ClaimedRun,
    ClaimResult,
    DeliveryResult,
    IngestParams,
    IngestResult,
    Lease,
    Notification,
    Outcome,
    Store,
)

T = TypeVar("T")

T0 = 1_785_000_000.0  # the fake clock's start (2026-07-25); tests add seconds to it
TTL = 100.0
LEASE = 10.0
MAX_ATTEMPTS = 3
MAX_PENDING = 1000
STATUSES = {s.value for s in RunStatus}



def async_test(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an `async def` test on the `aio` loop, which the test must request."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        kwargs["aio"](test(*args, **kwargs))

    return wrapper


# -- helpers ---------------------------------------------------------------------------


def history(store: Store) -> History:
    """The review's history on `store` (its tables are added by the `store` fixture)."""
    return History(store.add_tables(HISTORY))



def event_body(event_id: str, mix_url: str = "/tmp/m.wav",
               callback_url: str | None = None) -> bytes:
    event: dict[str, Any] = {
        "schema_version": "v1",
        "event_id": event_id,
        "idempotency_key": f"studio:session.exported:{event_id}",
        "event_type": "session.exported",
        "source": "studio",
        "timestamp": "2026-07-27T15:42:00Z",
        "payload": {"project_id": "p", "mix_url": mix_url},
    }
    if callback_url is not None:
        event["callback_url"] = callback_url
    return json.dumps(event).encode()


async def ingest(
    store: Store, event_id: str, *, agents: Sequence[str] = ("mix_review",), now: float = T0,
    ttl: float = TTL, max_pending: int = MAX_PENDING, mix_url: str = "/tmp/m.wav",
    callback_url: str | None = None, lease: Lease | None = None,
    webhook_id: str | None = None,
) -> IngestResult:
    body = event_body(event_id, mix_url, callback_url)
    return await store.ingest(IngestParams(
        event=parse_event(body), body=body, agents=agents, now=now, ttl=ttl,
        max_pending=max_pending, lease=lease, webhook_id=webhook_id))


async def claim(
    store: Store, owner: str = "w1", *, now: float = T0, limit: int = 10,
    max_attempts: int = MAX_ATTEMPTS,
) -> ClaimResult:
    return await store.claim(owner, limit, now, LEASE, max_attempts)


async def claim_one(store: Store, owner: str = "w1", *, now: float = T0,
                    max_attempts: int = MAX_ATTEMPTS) -> ClaimedRun:
    result = await claim(store, owner, now=now, limit=1, max_attempts=max_attempts)
    assert len(result.claimed) == 1, result
    return result.claimed[0]


async def ingest_and_claim(store: Store, event_id: str, owner: str = "w1",
                           now: float = T0) -> ClaimedRun:
    run_id = (await ingest(store, event_id, now=now)).runs[0].run_id
    claimed = await claim_one(store, owner, now=now)
    assert claimed.run_id == run_id
    return claimed


async def status_of(store: Store, run_id: str) -> str:
    view = await store.get_run(run_id)
    assert view is not None
    return str(view["status"])


def at(text: str | None) -> float | None:
    """An API timestamp back to seconds, so engines may format it their own way."""
    return None if text is None else datetime.fromisoformat(text).timestamp()


def ms(seconds: float) -> Any:
    return pytest.approx(seconds, abs=1e-3)


SUCCEEDED = Outcome(RunStatus.SUCCEEDED, result={"ok": True})
PERMANENT = Outcome(RunStatus.FAILED_PERMANENT, error_code="invalid_event", error_message="no")
DEAD = Outcome(RunStatus.DEAD_LETTERED, error_code="timeout", error_message="budget spent")


def retryable(next_attempt_at: float) -> Outcome:
    return Outcome(RunStatus.FAILED_RETRYABLE, error_code="timeout", error_message="slow",
                   next_attempt_at=next_attempt_at)




HOOK = "https://studio.example/hooks/agentbox"
HOOK_ORIGIN = "https://studio.example:443"
OTHER_HOOK = "https://other.example:8443/cb"
SEND_LEASE = 30.0


async def with_callback(store: Store, event_id: str, url: str = HOOK, now: float = T0
                        ) -> ClaimedRun:
    await ingest(store, event_id, now=now, callback_url=url)
    return await claim_one(store, now=now)


async def take(store: Store, owner: str = "d1", now: float = T0, limit: int = 10
               ) -> list[Notification]:
    claimed, _ = await store.claim_notifications(owner, limit, now, SEND_LEASE)
    return claimed


def sent() -> DeliveryResult:
    return DeliveryResult("delivered", status_code=204)


def failed(next_at: float, error: str = "http_500", pause: str | None = None) -> DeliveryResult:
    return DeliveryResult("pending", error, 500, next_at, pause)


def raw_rows(engine: Any, sql: str) -> list[tuple[Any, ...]]:
    """The rows of `sql`, read straight from the engine's database (no store)."""
    if hasattr(engine, "path"):
        with contextlib.closing(sqlite3.connect(engine.path)) as conn:
            return conn.execute(sql).fetchall()
    import psycopg

    with psycopg.connect(engine.url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()
