"""Reads and views (every engine)."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentbox.events import parse_event
from agentbox.runs import RunStatus
from agentbox.store import (
    IngestParams,
    Outcome,
    RunNotFound,
    Store,
)
from agentbox.store.sqlite import MIGRATIONS, SQL, migrate, verify_database
from tests.store.conftest import Engine
from tests.store.support import (
    DEAD,
    LEASE,
    MAX_PENDING,
    PERMANENT,
    STATUSES,
    SUCCEEDED,
    T0,
    TTL,
    async_test,
    at,
    claim,
    claim_one,
    event_body,
    ingest,
    ingest_and_claim,
    ms,
    raw_rows,
    retryable,
)

# -- reads -------------------------------------------------------------------------------


@async_test
async def test_get_run_follows_the_run(store: Store, aio: Any) -> None:
    assert await store.get_run("run_missing") is None
    run = await ingest_and_claim(store, "e1")
    await store.finish(run.run_id, "w1", 1, retryable(T0 + 20), T0 + 5)
    second = await claim_one(store, "w2", now=T0 + 20)
    await store.finish(run.run_id, "w2", second.attempt, Outcome(RunStatus.SUCCEEDED,
                                                                 result=[1, 2]), T0 + 21)
    view = await store.get_run(run.run_id)
    assert view is not None
    expected = {
        "run_id": run.run_id, "status": "succeeded", "event_id": "e1",
        "event_type": "session.exported", "source": "studio", "agent": "mix_review",
        "retry_count": 1, "result": [1, 2], "error_code": None,
    }
    assert {k: view[k] for k in expected} == expected
    times = {k: at(view[k]) for k in ("accepted_at", "started_at", "updated_at", "completed_at")}
    assert times == {"accepted_at": ms(T0), "started_at": ms(T0), "updated_at": ms(T0 + 21),
                     "completed_at": ms(T0 + 21)}


@async_test
async def test_attempts_record_the_history(store: Store, aio: Any) -> None:
    assert await store.attempts("run_missing") == []
    run = await ingest_and_claim(store, "e1", "w1")
    assert [a["finished_at"] for a in await store.attempts(run.run_id)] == [None]
    await store.finish(run.run_id, "w1", 1, retryable(T0 + 10), T0 + 1.5)
    await claim_one(store, "w2", now=T0 + 10)
    await store.finish(run.run_id, "w2", 2, SUCCEEDED, T0 + 12)
    attempts = await store.attempts(run.run_id)
    assert [(a["attempt"], a["worker"], a["outcome"], a["error_code"]) for a in attempts] == [
        (1, "w1", "failed_retryable", "timeout"), (2, "w2", "succeeded", None)]
    assert [(at(a["started_at"]), at(a["finished_at"])) for a in attempts] == [
        (ms(T0), ms(T0 + 1.5)), (ms(T0 + 10), ms(T0 + 12))]
    assert [a["duration_ms"] for a in attempts] == [ms(1500), ms(2000)]


def test_runs_by_state_are_read_from_the_kept_counts(tmp_path: Path) -> None:
    """/healthz, the status page and the metrics count runs by state: on SQLite from the
    counts the writer keeps with every write (version 11: SqliteStore.run_counts), not
    from the status index's entry of every run (8 ms at 30,000 runs), and find the
    oldest waiting run in one step of the waiting runs' index; no table of counts is
    written with each commit."""
    conn = sqlite3.connect(tmp_path / "plan.sqlite3")
    migrate(conn, tmp_path / "plan.sqlite3")
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + SQL["status_counts"])]
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert not any(step.startswith("SCAN r") or "runs_status" in step for step in plan), plan
    assert any("SEARCH runs USING INDEX runs_waiting" in step for step in plan), plan
    assert "run_counts" not in tables and not {"run_counts_insert", "run_counts_update"} & tables


def test_the_text_search_reads_the_runs_it_names_in_order_and_stops_at_the_page(
        tmp_path: Path) -> None:
    """On SQLite the runs a search's text names are looked up by run id, newest first,
    from the list of their ids (no sort of them all): a page of 50 of a project's 100
    runs reads 50 runs, on a store of any size."""
    conn = sqlite3.connect(tmp_path / "plan.sqlite3")
    migrate(conn, tmp_path / "plan.sqlite3")
    sql = SQL["search_runs"].replace("{fields}", "").replace(
        "{where}", SQL["search_runs.text"].replace("{text}", ""))
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql,
                                           {"text": "x", "limit": 50})]
    conn.close()
    assert plan[0] == "SEARCH r USING PRIMARY KEY (run_id=?)", plan
    assert not any("TEMP B-TREE" in step or step.startswith("SCAN r") for step in plan), plan


def counted(engine: Engine) -> dict[str, int]:
    """The runs by state, counted one by one from the rows themselves."""
    found = dict.fromkeys(STATUSES, 0)
    for status, _, _ in engine.leases().values():
        found[status] += 1
    return found


def problems(engine: Engine) -> list[str]:
    """`agentbox verify`'s findings (among them: kept counts apart from the runs)."""
    if hasattr(engine, "path"):
        return verify_database(engine.path)
    from agentbox.store.postgres import verify_url

    return verify_url(engine.url)  # type: ignore[attr-defined]


@async_test
async def test_runs_by_state_are_kept_with_every_write_to_runs(
        engine: Engine, store: Store, aio: Any) -> None:
    """Each kind of write that changes a run's state (ingest, claim, outcome, replay,
    a lease lost, retention's removal) keeps the counts in its own transaction: after
    each, stats() reads what counting the runs finds, and verify finds nothing."""
    async def agree() -> dict[str, int]:
        runs: dict[str, int] = (await store.stats())["runs"]
        assert runs == counted(engine)
        assert problems(engine) == []
        return runs

    assert await agree() == dict.fromkeys(STATUSES, 0)
    await ingest(store, "two", agents=("a1", "a2"))
    assert (await agree())["accepted"] == 2
    first, second = (await claim(store, now=T0)).claimed
    assert (await agree())["processing"] == 2
    await store.finish(first.run_id, "w1", 1, retryable(T0 + 5), T0 + 1)
    await store.finish(second.run_id, "w1", 1, DEAD, T0 + 1)
    assert {k: v for k, v in (await agree()).items() if v} == {
        "failed_retryable": 1, "dead_lettered": 1}
    await store.replay(second.run_id, T0 + 2)
    assert {k: v for k, v in (await agree()).items() if v} == {
        "failed_retryable": 1, "accepted": 1}
    again = {c.run_id: c for c in (await claim(store, now=T0 + 5)).claimed}
    assert set(again) == {first.run_id, second.run_id}
    await store.finish(first.run_id, "w1", again[first.run_id].attempt, SUCCEEDED, T0 + 6)
    await store.finish(second.run_id, "w1", again[second.run_id].attempt, PERMANENT, T0 + 6)
    assert {k: v for k, v in (await agree()).items() if v} == {
        "succeeded": 1, "failed_permanent": 1}
    lost = await ingest_and_claim(store, "lost", now=T0 + 10)
    await claim_one(store, "w2", now=T0 + 10 + LEASE)  # reclaimed: processing again
    assert (await agree())["processing"] == 1
    ended = await claim(store, "w3", now=T0 + 10 + 2 * LEASE, max_attempts=2)
    assert [t.run_id for t in ended.transitions] == [lost.run_id]
    assert (await agree())["dead_lettered"] == 1
    step = await store.prune_finished(now=T0 + 10 * TTL, before=T0 + 10 * TTL, after=None,
                                      scan=100)
    assert step.removed["runs"] >= 2  # the succeeded and the failed run went
    assert (await agree())["succeeded"] == 0


def test_runs_by_state_are_counted_once_when_a_store_is_migrated(
        engine: Engine, make_store: Callable[[], Store], aio: Any) -> None:
    """A database of version 9 (no kept counts) gets them made from the runs it holds,
    and kept from then on."""
    store = make_store()

    async def write() -> None:
        ok = await ingest_and_claim(store, "ok")
        await store.finish(ok.run_id, "w1", 1, SUCCEEDED, T0 + 1)
        await ingest(store, "one")
        await store.close()

    aio(write())
    if not hasattr(engine, "path"):  # SQLite's writer keeps them (version 11): no table
        engine.drop_table("run_counts")
    engine.set_schema_version(9)
    assert problems(engine) == []  # verify reads a version 9 database as it is
    reopened = make_store()
    assert engine.schema()[0] == len(MIGRATIONS)
    runs = aio(reopened.stats())["runs"]
    assert runs == counted(engine) == {**dict.fromkeys(STATUSES, 0), "accepted": 1,
                                       "succeeded": 1}
    aio(ingest(reopened, "two"))
    assert aio(reopened.stats())["runs"]["accepted"] == 2 and problems(engine) == []




def test_each_state_is_one_kept_row_once_its_writers_are_gone(
        engine: Engine, make_store: Callable[[], Store], aio: Any) -> None:
    """PostgreSQL's writers each keep rows of their own (no instance waits on another's
    commit for a shared count); a store that opens folds those of writers that are
    gone into one row per state, so the rows stay few however often instances restart.
    SQLite's one writer counts them as it opens, and keeps them with each commit."""
    first = make_store()

    async def write() -> None:
        await ingest(first, "a", agents=("a1", "a2", "a3"))
        run = await claim_one(first)
        await first.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 1)
        await first.close()

    aio(write())
    if hasattr(engine, "path"):
        second = make_store()
        assert aio(second.stats())["runs"] == {**dict.fromkeys(STATUSES, 0), "accepted": 2,
                                               "succeeded": 1} == counted(engine)
        assert problems(engine) == []
        return
    # PostgreSQL: the closed store's backends end
    writers = {row[0] for row in raw_rows(engine, "SELECT writer FROM run_counts")} - {0}
    assert writers  # the closed store's writer kept rows of its own
    ask = ("SELECT count(*) FROM pg_stat_activity WHERE pid IN "
           f"({', '.join(str(int(w)) for w in writers)})")
    deadline = time.monotonic() + 30
    while raw_rows(engine, ask)[0][0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert raw_rows(engine, ask)[0][0] == 0, "the closed store's backends are still there"
    second = make_store()
    rows = raw_rows(engine, "SELECT status, runs FROM run_counts")
    assert sorted(status for status, _ in rows) == sorted({status for status, _ in rows})
    assert {status: runs for status, runs in rows if runs} == {"accepted": 2, "succeeded": 1}
    assert aio(second.stats())["runs"] == counted(engine) and problems(engine) == []


@async_test
async def test_stats_and_list_runs(store: Store, aio: Any) -> None:
    empty = await store.stats()
    assert empty["runs"] == dict.fromkeys(STATUSES, 0) and empty["active"] == 0
    assert await store.stats(finished=False) == {"active": 0,
                                                 "oldest_waiting_accepted_at": None}
    assert empty["oldest_waiting_accepted_at"] is None
    assert await store.next_due_at() is None
    ok = await ingest_and_claim(store, "ok", now=T0)
    await store.finish(ok.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    busy = await ingest_and_claim(store, "busy", now=T0 + 2)
    waiting = [(await ingest(store, f"w{i}", now=T0 + 3 + i)).runs[0].run_id for i in range(3)]
    stats = await store.stats()
    assert stats["runs"] == {**dict.fromkeys(STATUSES, 0), "succeeded": 1, "processing": 1,
                             "accepted": 3}
    assert stats["active"] == 4
    assert at(stats["oldest_waiting_accepted_at"]) == ms(T0 + 3)
    assert await store.stats(finished=False) == {key: stats[key] for key in (
        "active", "oldest_waiting_accepted_at")}  # the unfinished alone, read alike
    # Only membership and limits: "newest" may be judged by the engine's own clock.
    assert sorted(v["run_id"] for v in await store.list_runs("accepted", 10)) == sorted(waiting)
    two = await store.list_runs("accepted", 2)
    assert len(two) == 2 and {v["run_id"] for v in two} <= set(waiting)
    assert [v["run_id"] for v in await store.list_runs("processing", 10)] == [busy.run_id]
    everything = await store.list_runs(None, 10)
    assert sorted(v["run_id"] for v in everything) == sorted([*waiting, busy.run_id, ok.run_id])
    assert all(v["status"] in STATUSES for v in everything)
    assert await store.next_due_at() == ms(T0 + 3)


@async_test
async def test_the_text_search_pages_through_what_the_text_names_newest_first(
        store: Store, aio: Any) -> None:
    """The run list's search (q=): the runs whose run id, event id, correlation id or
    project the text is, newest run id first, `limit` at a time (`before`: the last run
    of the page before), with the other filters too; each page exactly what that
    definition picks from every run stored, however the engine finds them."""
    async def send(event_id: str, project: str, chain: str | None = None,
                   agents: tuple[str, ...] = ("mix_review",)) -> None:
        event: dict[str, Any] = {
            "schema_version": "v1", "event_id": event_id,
            "idempotency_key": f"studio:session.exported:{event_id}",
            "event_type": "session.exported", "source": "studio",
            "timestamp": "2026-07-27T15:42:00Z",
            "payload": {"project_id": project, "mix_url": "/m.wav"}}
        if chain is not None:
            event.update(correlation_id=chain, causation_id=chain, hop=1)
        body = json.dumps(event).encode()
        await store.ingest(IngestParams(event=parse_event(body), body=body, agents=agents,
                                        now=T0, ttl=TTL, max_pending=MAX_PENDING))

    for n in range(9):
        await send(f"alpha-{n}", "Alpha", agents=("mix_review", "other") if n % 3 else
                   ("mix_review",))
        await send(f"beta-{n}", "Beta", chain="chain-1" if n % 2 else None)
    await send("Alpha", "Beta")  # an event whose id is the other project's name
    for _ in range(7):  # some finish, so a state filter picks among them
        claimed = await claim_one(store)
        await store.finish(claimed.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    every = await store.list_runs(None, 1000)
    assert len(every) == 9 + 6 + 9 + 1

    def named(text: str, status: str | None = None) -> list[str]:
        return sorted((v["run_id"] for v in every
                       if text in (v["run_id"], v["event_id"], v["correlation_id"],
                                   v["project"])
                       and status in (None, v["status"])), reverse=True)

    texts = ["Alpha", "Beta", "chain-1", "beta-4", every[5]["run_id"], "nobody"]
    for text in texts:
        for status in (None, "succeeded", "accepted"):
            expected = named(text, status)
            found = [v["run_id"] for v in await store.search_runs(text=text, status=status,
                                                                  limit=1000)]
            assert found == expected, (text, status)
            paged: list[str] = []
            before = None
            while True:
                page = [v["run_id"] for v in await store.search_runs(
                    text=text, status=status, before=before, limit=4)]
                paged += page
                if len(page) < 4:
                    break
                before = page[-1]
            assert paged == expected, (text, status)
    assert len(named("Alpha")) == 9 + 6 + 1 and len(named("chain-1")) == 4
    assert named("Alpha", "succeeded") and named("Alpha", "accepted")


@async_test
async def test_runs_are_found_by_project_however_the_sender_spelled_it(
        store: Store, aio: Any) -> None:
    names = ["night_drive", "Night_Drive", "nightXdrive", "50% done", "50X done", "Über Nacht",
             'say "hi"', "back\\slash", "night-drive", "a/b & c"]

    def php_like(text: str) -> str:  # upper-case hex escapes, "/" escaped
        return re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(),
                      text).replace("/", "\\/")

    spellings: list[Callable[[dict[str, Any]], str]] = [
        lambda event: json.dumps(event, separators=(",", ":")),
        lambda event: json.dumps(event, ensure_ascii=False, separators=(", ", ": ")),
        lambda event: php_like(json.dumps(event)),
    ]
    runs: dict[str, set[str]] = {name: set() for name in names}
    for n, name in enumerate(names):
        for k, spell in enumerate(spellings):
            event_id = f"p{n}s{k}"
            body = spell({
                "schema_version": "v1", "event_id": event_id,
                "idempotency_key": f"studio:session.exported:{event_id}",
                "event_type": "session.exported", "source": "studio",
                "timestamp": "2026-07-27T15:42:00Z",
                "payload": {"project_id": name, "mix_url": "/m.wav",
                            "session_name": "a NUL \u0000 elsewhere"}}).encode()
            result = await store.ingest(IngestParams(
                event=parse_event(body), body=body, agents=["mix_review"], now=T0, ttl=TTL,
                max_pending=MAX_PENDING))
            runs[name].add(result.runs[0].run_id)
    # A plugin's free-text project may hold a NUL, which PostgreSQL's JSON refuses:
    # no search fails for it (what "nul" finds differs: SQLite ends the text at the
    # NUL, PostgreSQL matches nothing), and no other name finds it.
    event_id = "nul-project"
    valid = event_body(event_id)
    stored = valid.replace(b'"project_id": "p"', b'"project_id": "nul\\u0000"')
    assert stored != valid
    await store.ingest(IngestParams(event=parse_event(valid), body=stored,
                                    agents=["mix_review"], now=T0, ttl=TTL,
                                    max_pending=MAX_PENDING))
    assert len(await store.search_runs(filters={"project": "nul"})) <= 1
    assert await store.search_runs(text="nul\u0000") == []  # asked with a NUL: nothing
    assert await store.get_run("run_\u0000") is None
    with pytest.raises(RunNotFound):
        await store.replay("run_\u0000", T0)
    for name in names:
        found = {run["run_id"] for run in await store.search_runs(filters={"project": name})}
        assert found == runs[name], name  # exact: no wildcards, case counts, any spelling
        assert {run["run_id"] for run in await store.search_runs(text=name)} == runs[name]


