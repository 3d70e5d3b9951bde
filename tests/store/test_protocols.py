"""The store by consumer: `Store` is the union of small protocols, each with its
conformance tests in this folder (`CONFORMANCE` says which files), run against every
engine. The calls that no topic's file made are exercised here, by protocol."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from agentbox.store import (
    IngestStore,
    OutboxStore,
    OutcomeStore,
    ReadStore,
    RetentionStore,
    Store,
    SubscriptionStore,
)
from tests.store.support import (
    DEAD,
    SUCCEEDED,
    T0,
    async_test,
    ingest,
    ingest_and_claim,
    take,
)

HERE = Path(__file__).parent
PROTOCOLS = (IngestStore, OutcomeStore, OutboxStore, ReadStore, RetentionStore,
             SubscriptionStore)
# Each protocol's conformance tests: every one of its methods is called in them.
CONFORMANCE: dict[type, tuple[str, ...]] = {
    IngestStore: ("test_ingest.py", "test_claims.py", "test_state_machine.py"),
    OutcomeStore: ("test_outcomes.py", "test_emitted.py", "test_protocols.py"),
    OutboxStore: ("test_outbox.py", "test_protocols.py"),
    ReadStore: ("test_reads.py", "test_outbox.py", "test_ingest.py", "test_retention.py",
                "test_protocols.py"),
    RetentionStore: ("test_retention.py", "test_ingest.py", "test_protocols.py"),
    SubscriptionStore: ("test_subscriptions.py",),
}
DAY = 86_400.0


def methods(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items()
            if inspect.isfunction(value) and not name.startswith("_")}


def called(files: tuple[str, ...]) -> set[str]:
    """Every attribute called in these test files (`store.claim(...)` gives claim)."""
    found: set[str] = set()
    for name in files:
        for node in ast.walk(ast.parse((HERE / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                found.add(node.func.attr)
    return found


def test_store_is_the_union_of_the_protocols_and_its_life_cycle() -> None:
    declared = set().union(*(methods(protocol) for protocol in PROTOCOLS))
    own = {"open", "close", "probe", "look_around", "add_tables", "description"}
    assert sum(len(methods(protocol)) for protocol in PROTOCOLS) == len(declared)  # disjoint
    assert Store.__abstractmethods__ == (declared | own) - {"probe", "look_around"}
    for protocol in PROTOCOLS:
        assert issubclass(Store, protocol) and 2 <= len(methods(protocol)) <= 12


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_every_method_of_a_protocol_is_called_by_its_conformance_tests(protocol: type
                                                                        ) -> None:
    files = CONFORMANCE[protocol]
    assert all((HERE / name).is_file() for name in files)
    assert methods(protocol) - called(files) == set()


@async_test
async def test_each_engine_answers_every_protocol(store: Store, aio: Any) -> None:
    for protocol in PROTOCOLS:
        assert isinstance(store, protocol), protocol.__name__


# -- calls no topic's file made --------------------------------------------------------


@async_test
async def test_an_alert_is_queued_once_per_id(store: Store, aio: Any) -> None:
    run_id = (await ingest(store, "e1")).runs[0].run_id
    url = "https://ops.example/alerts"
    assert await store.queue_alert("alert-1", run_id, url, b'{"a":1}', T0) is True
    assert await store.queue_alert("alert-1", run_id, url, b'{"a":2}', T0) is False
    queued = [n for n in await store.list_notifications("pending", 10)
              if n.notification_id == "alert-1"]
    assert len(queued) == 1 and queued[0].destination == "https://ops.example:443"
    assert [n.notification_id for n in await take(store)] == ["alert-1"]


@async_test
async def test_a_discarded_dead_letter_says_why_and_when(store: Store, aio: Any) -> None:
    claimed = await ingest_and_claim(store, "e1")
    assert await store.discarded(claimed.run_id) is None
    await store.finish(claimed.run_id, "w1", 1, DEAD, T0 + 1)
    await store.discard(claimed.run_id, "a test file", T0 + 2)
    found = await store.discarded(claimed.run_id)
    assert found is not None and found["reason"] == "a test file"
    assert found["at"].startswith("2026-07-25")


@async_test
async def test_finished_runs_are_counted_in_their_slice(store: Store, aio: Any) -> None:
    first = await ingest_and_claim(store, "e1")
    await store.finish(first.run_id, "w1", 1, SUCCEEDED, T0 + 5)
    second = await ingest_and_claim(store, "e2", now=T0 + 20)
    await store.finish(second.run_id, "w1", 1, SUCCEEDED, T0 + 25)
    assert await store.finished_counts(T0, 10.0, 4) == [1, 0, 1, 0]
    assert await store.finished_counts(T0 + 100, 10.0, 2) == [0, 0]


@async_test
async def test_retention_steps_called_one_by_one(store: Store, aio: Any) -> None:
    claimed = await ingest_and_claim(store, "e1")
    await store.finish(claimed.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    now = T0 + 10 * DAY
    await store.prune_idempotency_keys(now, 100)
    preview = await store.prune_preview(now=now, before=T0 + 2, bodies_before=T0 + 2)
    assert preview["runs"] == 1 and preview["events"] == 1
    assert await store.prune_preview(now=now, before=T0, bodies_before=T0) == {
        name: 0 for name in preview}
    kept = await store.remove_bodies(now=now, before=T0 + 2, after=None, scan=10)
    assert kept.removed == {"bodies": 1} and kept.examined == 1
    step = await store.prune_finished(now=now, before=T0 + 2, after=None, scan=10)
    assert step.removed["runs"] == 1 and step.removed["events"] == 1
    assert await store.get_run(claimed.run_id) is None
    assert await store.reclaim_space(10) >= 0
