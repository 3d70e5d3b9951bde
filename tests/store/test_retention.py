"""Retention (every engine): finished runs go after their period with what hangs
off them, raw bodies earlier; nothing unfinished, undecided or needed by a
project's history goes; the idempotency window holds; SQLite gives the space
back; pruning beside ingest, claims and deliveries makes progress and never
deadlocks. Real databases, a fake clock moved by hand."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentbox.archive.history import SCHEMA as HISTORY
from agentbox.config import SECONDS_PER_DAY, Settings
from agentbox.engine.retention import Retention
from agentbox.events import parse_event
from agentbox.runs import RunStatus
from agentbox.store import (
    BodyRemoved,
    DeliveryResult,
    IngestParams,
    NotReplayable,
    Outcome,
    Store,
)
from agentbox.store.sqlite import SqliteStore, verify_database
from tests.store.conftest import ENGINES, Engine, engine_params, prepare_engine
from tests.store.support import (
    DEAD,
    HOOK,
    MAX_ATTEMPTS,
    MAX_PENDING,
    PERMANENT,
    T0,
    async_test,
    claim_one,
    history,
    ingest,
    raw_rows,
    retryable,
)

DAY = SECONDS_PER_DAY
NOW = T0 + 100 * DAY  # when the property test prunes
RETENTION_DAYS, BODY_DAYS = 30.0, 7.0
FAR = NOW + 1000 * DAY  # a retry time, or a lease's end, that never comes
LONG_LEASE = 2000 * DAY
FINISHED = ("succeeded", "failed_permanent", "retrying", "dead", "discarded", "replayed")
UNFINISHED = ("accepted", "processing")
CALLBACKS = (None, "delivered", "dead", "pending")


def retention(store: Store, now: float, days: float = RETENTION_DAYS,
              body_days: float = BODY_DAYS) -> Retention:
    return Retention(store, Settings(retention_days=days, body_retention_days=body_days),
                     lambda: now, rest_ratio=0.0)


def export_body(event_id: str, project: str, callback: bool, pad: int = 0) -> bytes:
    payload: dict[str, Any] = {"mix_url": f"/mixes/{event_id}.wav" + "x" * pad,
                               "project_id": project}
    event: dict[str, Any] = {
        "schema_version": "v1", "event_id": event_id,
        "idempotency_key": f"studio:session.exported:{event_id}",
        "event_type": "session.exported", "source": "studio",
        "timestamp": "2026-07-27T15:42:00Z", "payload": payload}
    if callback:
        event["callback_url"] = HOOK
    return json.dumps(event).encode()


def export(body: bytes, now: float, ttl: float, max_pending: int = MAX_PENDING
           ) -> IngestParams:
    """An export's ingest, for the mix_review agent."""
    return IngestParams(event=parse_event(body), body=body, agents=["mix_review"], now=now,
                        ttl=ttl, max_pending=max_pending)


# -- a raw look at the database: the test's own oracle, in Python ------------------------------


@dataclass
class Snapshot:
    runs: dict[str, tuple[int, str, float | None]]  # run_id -> (event_pk, status, completed)
    discarded: dict[str, float]
    outbox: dict[str, list[str]]  # run_id -> delivery states
    keys: dict[int, float]  # event_pk -> its own claim's end
    events: dict[int, bool]  # pk -> body still there
    attempts: set[tuple[str, int]]
    history: dict[str, int]




def snapshot(engine: Engine) -> Snapshot:
    outbox: dict[str, list[str]] = {}
    for run_id, state in raw_rows(engine, "SELECT run_id, state FROM outbox"):
        outbox.setdefault(run_id, []).append(state)
    history: dict[str, int] = {}
    for (run_id,) in raw_rows(engine, "SELECT run_id FROM run_history"):
        history[run_id] = history.get(run_id, 0) + 1
    return Snapshot(
        runs={r: (pk, s, c) for r, pk, s, c in raw_rows(
            engine, "SELECT run_id, event_pk, status, completed_at FROM runs")},
        discarded=dict(raw_rows(engine, "SELECT run_id, at FROM discarded_runs")),
        outbox=outbox,
        keys={pk: until for pk, until in raw_rows(
            engine, "SELECT e.pk, k.expires_at FROM events e JOIN idempotency_keys k "
                    "ON k.key = e.idempotency_key AND k.event_pk = e.pk")},
        events={pk: removed is None for pk, removed in raw_rows(
            engine, "SELECT pk, body_removed_at FROM events")},
        attempts={(r, a) for r, a in raw_rows(engine, "SELECT run_id, attempt FROM attempts")},
        history=history)


def finished_before(snap: Snapshot, run_id: str, before: float) -> bool:
    _, status, completed = snap.runs[run_id]
    if completed is None or completed >= before:
        return False
    if status in ("succeeded", "failed_permanent"):
        return True
    return status == "dead_lettered" and snap.discarded.get(run_id, FAR) < before


def expected(snap: Snapshot, now: float, before: float,
             bodies_before: float) -> tuple[set[str], set[int], set[int]]:
    """(runs that go, events that go, events whose body goes), by the documented rules."""
    going = {run_id for run_id, (pk, _, _) in snap.runs.items()
             if finished_before(snap, run_id, before)
             and "pending" not in snap.outbox.get(run_id, [])
             and snap.keys.get(pk, now) <= now}
    runs_of: dict[int, list[str]] = {}
    for run_id, (pk, _, _) in snap.runs.items():
        runs_of.setdefault(pk, []).append(run_id)
    events_going = {pk for pk, runs in runs_of.items() if set(runs) <= going}
    bodies = {pk for pk, runs in runs_of.items()
              if pk not in events_going and snap.events[pk]
              and all(finished_before(snap, r, bodies_before) for r in runs)}
    return going, events_going, bodies


# -- random histories --------------------------------------------------------------------------

event_plans = st.lists(st.fixed_dictionaries({
    "finals": st.lists(st.sampled_from(FINISHED + UNFINISHED), min_size=1, max_size=2),
    "age_days": st.floats(0, 80),
    "decided_after_days": st.floats(0, 80),  # a discard, this long after the failure
    "callback": st.sampled_from(CALLBACKS),
    "project": st.sampled_from(("alpha", "beta")),
    "ttl_days": st.sampled_from((1.0, 45.0)),  # 45: a claim that outlives retention
}), min_size=1, max_size=12)


async def build(store: Store, plans: list[dict[str, Any]]) -> dict[str, str]:
    """Store each planned event and take its runs to their planned states; the
    callbacks' planned fates are given after. Returns run_id -> its callback plan."""
    # Finished first, oldest first; then the ones left processing, then accepted ones
    # (a claim takes every due run: none may be waiting when a finished one is claimed).
    def finals_of(plan: dict[str, Any]) -> list[str]:
        """An event's runs are claimed together: unfinished ones are all alike."""
        finals: list[str] = plan["finals"]
        unfinished = [f for f in finals if f in UNFINISHED]
        return [unfinished[0]] * len(finals) if unfinished else finals

    def rank(item: tuple[int, dict[str, Any]]) -> tuple[int, float]:
        first = finals_of(item[1])[0]
        return {"accepted": 2, "processing": 1}.get(first, 0), -item[1]["age_days"]

    fates: dict[str, str] = {}
    for number, plan in sorted(enumerate(plans), key=rank):
        finals = finals_of(plan)
        at = NOW - plan["age_days"] * DAY - number
        body = export_body(f"e{number}", plan["project"], plan["callback"] is not None)
        agents = [f"agent{i}" for i in range(len(finals))]
        result = await store.ingest(IngestParams(
            event=parse_event(body), body=body, agents=agents, now=at,
            ttl=plan["ttl_days"] * DAY, max_pending=MAX_PENDING))
        runs = [ref.run_id for ref in result.runs]
        for run_id in runs:
            fates[run_id] = plan["callback"] or ""
        if finals[0] == "accepted":
            continue
        claimed = await store.claim("w1", len(runs), at, LONG_LEASE, MAX_ATTEMPTS)
        assert sorted(c.run_id for c in claimed.claimed) == sorted(runs)
        for run_id, final in zip(runs, finals, strict=True):
            await finish_as(store, run_id, final, at, plan)
    return fates


async def finish_as(store: Store, run_id: str, final: str, at: float,
                    plan: dict[str, Any]) -> None:
    outcomes = {"succeeded": Outcome(RunStatus.SUCCEEDED, result={"run": run_id}),
                "failed_permanent": PERMANENT, "retrying": retryable(FAR)}
    if final == "processing":
        return
    if final in outcomes:
        assert await store.finish(run_id, "w1", 1, outcomes[final], at + 1)
        return
    assert await store.finish(run_id, "w1", 1, DEAD, at + 1)
    if final == "discarded":
        decided = min(at + 2 + plan["decided_after_days"] * DAY, NOW - 1)
        await store.discard(run_id, "not worth it", decided)
    elif final == "replayed":  # a dead letter replayed, then it succeeded
        await store.discard(run_id, "looked at", at + 2)
        await store.replay(run_id, at + 3)
        again = await claim_one(store, now=at + 3)
        assert again.run_id == run_id
        assert await store.finish(run_id, "w1", 2, Outcome(RunStatus.SUCCEEDED,
                                                           result={"run": run_id}), at + 4)


async def settle_callbacks(store: Store, fates: dict[str, str]) -> None:
    """Deliver, dead-letter or leave pending each run's callbacks, as planned."""
    while True:
        taken, _ = await store.claim_notifications("d1", 100, NOW - 10, 5.0)
        chosen = [n for n in taken if fates[n.run_id] in ("delivered", "dead")]
        if not chosen:
            return
        for n in chosen:
            state = "delivered" if fates[n.run_id] == "delivered" else "dead"
            await store.record_delivery(n, "d1", DeliveryResult(state, "http_500"
                                        if state == "dead" else None), NOW - 10, 1000)


async def history_of_projects(store: Store) -> Any:
    """Everything the project pages and the comparison read, in one value."""
    latest = await history(store).projects()
    found: dict[str, Any] = {"latest": latest,
                             "per_agent": [await history(store).projects(agent=f"agent{i}")
                                           for i in range(2)]}
    for project in ("alpha", "beta"):
        exports = await history(store).project_exports(project, limit=500)
        found[project] = exports
        found[project, "succeeded"] = await history(store).project_exports(
            project, status="succeeded")
        found[project, "previous"] = [await history(store).project_exports(
            project, agent=e.agent, status="succeeded", before_run_id=e.run_id, limit=1)
            for e in exports]
    return found


def problems(engine: Engine) -> list[str]:
    if hasattr(engine, "path"):
        return verify_database(engine.path)
    from agentbox.store.postgres import verify_url

    return verify_url(engine.url)  # type: ignore[attr-defined]


@contextlib.contextmanager
def fresh_engine(request: pytest.FixtureRequest, name: str, directory: Path) -> Iterator[Engine]:
    harness = ENGINES[name](directory)
    try:
        yield harness
    finally:
        harness.dispose()


@pytest.mark.parametrize("engine_name", engine_params())
def test_retention_removes_exactly_what_is_due_over_random_histories(
        request: pytest.FixtureRequest, engine_name: str, tmp_path: Path) -> None:
    prepare_engine(request, engine_name)
    counter = iter(range(10**6))

    @settings(max_examples=25 if engine_name == "sqlite" else 12, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(plans=event_plans, prune_days=st.sampled_from((0.0, 10.0, 40.0)))
    def check(plans: list[dict[str, Any]], prune_days: float) -> None:
        directory = tmp_path / str(next(counter))
        directory.mkdir()
        with fresh_engine(request, engine_name, directory) as engine:
            asyncio.run(one_history(engine, plans, NOW + prune_days * DAY))

    check()


async def one_history(engine: Engine, plans: list[dict[str, Any]], now: float) -> None:
    store = engine.new_store()
    store.add_tables(HISTORY)  # the review's line migrated as it opens, as a server's is
    await store.open()
    try:
        fates = await build(store, plans)
        await settle_callbacks(store, fates)
        before_prune = snapshot(engine)
        projects_before = await history_of_projects(store)
        keeper = retention(store, now)
        going, events_going, bodies_going = expected(
            before_prune, now, *keeper.cutoffs(now))
        preview = await keeper.prune(dry_run=True)
        report = await keeper.prune()
        after = snapshot(engine)
        # Nothing unfinished, undecided or still claimed went; everything due did.
        assert set(after.runs) == set(before_prune.runs) - going
        assert set(after.events) == set(before_prune.events) - events_going
        blanked = {pk for pk, body in after.events.items() if not body}
        assert blanked == {pk for pk, body in before_prune.events.items()
                           if not body} | bodies_going
        # What hangs off a run went with it, and only then.
        assert {a for a in before_prune.attempts if a[0] not in going} == after.attempts
        assert {r: n for r, n in before_prune.history.items() if r not in going} \
            == after.history
        assert {r: s for r, s in before_prune.outbox.items() if r not in going} == after.outbox
        assert {r for r in before_prune.discarded if r not in going} == set(after.discarded)
        # The dry run said what the pass did, table by table.
        counts = {"runs": len(going), "events": len(events_going),
                  "bodies": len(bodies_going)}
        for table, rows in counts.items():
            assert preview.removed[table] == report.removed.get(table, 0) == rows, table
        assert preview.removed["attempts"] == report.removed.get("attempts", 0)
        assert preview.removed["outbox"] == report.removed.get("outbox", 0)
        # A project's history reads the same; the store is whole; a second pass is idle.
        assert await history_of_projects(store) == projects_before
        assert problems(engine) == []
        # The runs by state, kept with each write (removals too), are the runs counted.
        counted = dict.fromkeys((s.value for s in RunStatus), 0)
        for _, status, _ in after.runs.values():
            counted[status] += 1
        assert (await store.stats())["runs"] == counted
        again = await keeper.prune()
        assert not any(again.removed.values())
    finally:
        await store.close()


# -- the idempotency window, bodies, replays ----------------------------------------------


@async_test
async def test_a_duplicate_within_the_idempotency_window_still_finds_its_run(
        store: Store, aio: Any) -> None:
    ttl = 10 * DAY
    body = export_body("dup", "alpha", False)
    first = await store.ingest(export(body, T0, ttl))
    claimed = await claim_one(store, now=T0)
    assert await store.finish(claimed.run_id, "w1", 1,
                              Outcome(RunStatus.SUCCEEDED, result={}), T0 + 1)
    # Retention shorter than the claim (a window widened after the fact): the run stays.
    early = await retention(store, T0 + 5 * DAY, days=1.0, body_days=1.0).prune()
    assert early.removed.get("runs", 0) == 0
    again = await store.ingest(export(body, T0 + 5 * DAY, ttl))
    assert again.duplicate and [r.run_id for r in again.runs] == [first.runs[0].run_id]
    # Past the window and the retention: the run goes, and the key is free again.
    late = await retention(store, T0 + 12 * DAY, days=1.0, body_days=1.0).prune()
    assert late.removed["runs"] == 1 and late.removed["idempotency_keys"] == 1
    assert await store.get_run(first.runs[0].run_id) is None
    fresh = await store.ingest(export(body, T0 + 12 * DAY, ttl))
    assert not fresh.duplicate and fresh.runs[0].run_id != first.runs[0].run_id


@async_test
async def test_a_run_whose_body_is_gone_still_shows_and_refuses_a_replay(
        store: Store, aio: Any) -> None:
    body = export_body("gone", "alpha", False)
    result = await store.ingest(export(body, T0, 60))
    run_id = result.runs[0].run_id
    await claim_one(store, now=T0)
    assert await store.finish(run_id, "w1", 1, PERMANENT, T0 + 1)
    report = await retention(store, T0 + 10 * DAY).prune()
    assert report.removed["bodies"] == 1 and report.removed.get("runs", 0) == 0
    view = await store.get_run(run_id)
    assert view is not None and view.status == "failed_permanent" and view.project == "alpha"
    event = await store.event_of(run_id)
    assert event is not None and event["event_id"] == "gone" and event["body_removed_at"]
    assert "payload" not in event
    with pytest.raises(BodyRemoved) as refused:
        await store.replay(run_id, T0 + 10 * DAY)
    assert isinstance(refused.value, NotReplayable) and "body was removed" in str(refused.value)
    assert (await store.get_run(run_id)).status == "failed_permanent"  # type: ignore[union-attr]


@async_test
async def test_an_undecided_dead_letter_stays_then_goes_after_its_discard(
        store: Store, aio: Any) -> None:
    run_id = (await ingest(store, "dl", now=T0)).runs[0].run_id
    await claim_one(store, now=T0)
    assert await store.finish(run_id, "w1", 1, DEAD, T0 + 1)
    assert (await retention(store, T0 + 100 * DAY).prune()).removed.get("runs", 0) == 0
    assert await store.event_of(run_id) is not None  # its body too: it may be replayed
    assert "payload" in (await store.event_of(run_id) or {})
    await store.discard(run_id, "noise", T0 + 100 * DAY)
    assert (await retention(store, T0 + 120 * DAY).prune()).removed.get("runs", 0) == 0
    assert (await retention(store, T0 + 131 * DAY).prune()).removed["runs"] == 1


# -- space, plans, concurrency --------------------------------------------------------------


def test_sqlite_gives_the_space_back(tmp_path: Path) -> None:
    path = tmp_path / "agentbox.db"

    async def main() -> tuple[int, int, int, int]:
        store = SqliteStore(path)
        store.add_tables(HISTORY)
        await store.open()
        for n in range(1500):
            body = export_body(f"big{n}", f"p{n % 10}", False, pad=2000)
            await store.ingest(export(body, T0 + n, 60, max_pending=10**6))
        done = 0
        while done < 1500:
            claimed = await store.claim("w1", 500, T0 + 2000, 60, MAX_ATTEMPTS)
            for run in claimed.claimed:
                await store.finish(run.run_id, "w1", 1,
                                   Outcome(RunStatus.SUCCEEDED, result={}), T0 + 2001)
            done += len(claimed.claimed)
        pages_before = page_count(path)
        report = await retention(store, T0 + 40 * DAY).prune()
        free_left = report.free_pages
        await store.close()
        return pages_before, page_count(path), report.removed["runs"], free_left

    pages_before, pages_after, removed, free_left = asyncio.run(main())
    assert removed == 1500
    assert free_left == 0
    assert pages_after < pages_before / 5, (pages_before, pages_after)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM project_exports").fetchone()[0] == 1500
    assert verify_database(path) == []


def page_count(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("PRAGMA page_count").fetchone()[0])


def test_an_existing_database_is_made_shrinkable_once_at_open(tmp_path: Path) -> None:
    path = tmp_path / "agentbox.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:  # as an older agentbox made it
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("CREATE TABLE leftover (x)")
    store = SqliteStore(path)

    async def cycle() -> None:
        await store.open()
        await store.close()

    asyncio.run(cycle())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL


@pytest.mark.postgres
def test_postgres_prune_steps_walk_indexes_not_the_tables(postgres_url: str) -> None:
    import psycopg

    from agentbox.store.postgres import SQL

    async def seed() -> None:
        from agentbox.store.postgres import PostgresStore

        store = PostgresStore(postgres_url)
        await store.open()
        await store.close()

    asyncio.run(seed())
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO events (event_id, idempotency_key, event_type, source, received_at,
                                body)
            SELECT 'e' || n, 'k' || n, 't', 's', n, '\\x7b7d'::bytea
            FROM generate_series(1, 20000) n""")
        conn.execute("""
            INSERT INTO runs (run_id, event_pk, ordinal, agent, status, accepted_at,
                              updated_at, completed_at)
            SELECT 'r' || lpad(pk::text, 8, '0'), pk, 0, 'a', 'succeeded', received_at,
                   received_at, received_at + 1 FROM events""")
        conn.execute("ANALYZE")
        params: dict[str, Any] = {"before": 100.0, "after_at": 50.0, "after_id": "",
                                  "after_pk": 0, "scan": 100, "now": 1e9}
        for name, table, index in (("prune_scan", "runs", "runs_completed"),
                                   ("body_scan", "events", "events_with_body")):
            plan = "\n".join(row[0] for row in conn.execute(
                "EXPLAIN " + SQL[name], params).fetchall())
            assert f"Seq Scan on {table}" not in plan and index in plan, plan


@pytest.mark.parametrize("engine_name", engine_params())
def test_prune_beside_ingest_claims_and_deliveries_makes_progress(
        request: pytest.FixtureRequest, engine_name: str, tmp_path: Path) -> None:
    """Two stores (two instances on PostgreSQL; one on SQLite, whose file one
    process serves) ingest, claim, finish and deliver callbacks while retention
    prunes everything finished as it goes, all within a deadline: no deadlock,
    nothing stuck."""
    prepare_engine(request, engine_name)
    with fresh_engine(request, engine_name, tmp_path) as engine:
        asyncio.run(asyncio.wait_for(race(engine), 120))


async def race(engine: Engine) -> None:
    stores = [engine.new_store() for _ in range(1 if engine.single_process else 2)]
    for store in stores:
        await store.open()
    stop = asyncio.Event()
    done = {"ingested": 0, "finished": 0, "delivered": 0, "pruned": 0}

    def clock() -> float:
        return time.time()

    async def ingest_loop(store: Store, name: str) -> None:
        n = 0
        while not stop.is_set():
            body = export_body(f"{name}-{n}", f"p{n % 7}", n % 3 == 0)
            await store.ingest(IngestParams(event=parse_event(body), body=body,
                                            agents=["a", "b"], now=clock(), ttl=0.5,
                                            max_pending=10**6))
            done["ingested"] += 1
            n += 1

    async def work_loop(store: Store, owner: str) -> None:
        while not stop.is_set():
            claimed = await store.claim(owner, 20, clock(), 30, MAX_ATTEMPTS)
            for run in claimed.claimed:
                outcome = Outcome(RunStatus.SUCCEEDED, result={"n": 1})
                if await store.finish(run.run_id, owner, run.attempt, outcome, clock()):
                    done["finished"] += 1
            taken, _ = await store.claim_notifications(owner, 20, clock(), 30)
            for n in taken:
                await store.record_delivery(n, owner, DeliveryResult("delivered"), clock(),
                                            1000)
                done["delivered"] += 1
            await asyncio.sleep(0)

    async def prune_loop(store: Store) -> None:
        keeper = Retention(store, Settings(retention_days=1e-5, body_retention_days=1e-5),
                           clock, rest_ratio=0.0)
        while not stop.is_set():
            report = await keeper.prune()
            done["pruned"] += report.removed.get("runs", 0)
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(coro) for coro in (
        *(ingest_loop(s, f"i{i}") for i, s in enumerate(stores)),
        *(work_loop(s, f"w{i}") for i, s in enumerate(stores)),
        prune_loop(stores[-1]))]
    try:
        deadline = time.monotonic() + 90
        while done["pruned"] < 300 and time.monotonic() < deadline:
            for task in tasks:
                if task.done():
                    task.result()  # a failure (a deadlock would be one) ends the test
            await asyncio.sleep(0.1)
        assert done["pruned"] >= 300, done
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for store in stores:
            await store.close()
    assert done["ingested"] > 300 and done["finished"] > 300 and done["delivered"] > 0, done
    assert problems(engine) == []

