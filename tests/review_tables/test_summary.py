"""Each project's kept summary (the review's version 4, project_summary): the latest
export and the number of exports the home page and GET /exports read, kept right by
every change to what a project shows (a new export, a rename, a merge, a removal,
retention), on every engine. It is held against the same answer read the slow way,
from every export (the `projects` and `project_exports` statements)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentbox.archive.history import ADMITTED, History
from agentbox.config import SECONDS_PER_DAY, Settings
from agentbox.engine.retention import Retention
from agentbox.events import parse_event
from agentbox.store import IngestParams, Store
from tests.review_tables.test_projects import MAX_PENDING, TTL, export, export_body, succeed
from tests.store.support import T0, async_test, history

DAY = SECONDS_PER_DAY


async def summary(found: History) -> list[tuple[str, str, int]]:
    """(project, latest run, exports) of every project, by the summary, newest first."""
    return [(p.latest.project, p.latest.run_id, p.exports)
            for p in await found.latest(limit=500)]


async def counted(found: History) -> list[tuple[str, str, int]]:
    """The same, read from every export (no summary)."""
    rows = await found.tables.slow_rows("projects", agent=None, limit=500)
    return [(row["project"], row["run_id"],
             len(await found.project_exports(row["project"], limit=10_000))) for row in rows]


async def agrees(found: History) -> list[tuple[str, str, int]]:
    kept = await summary(found)
    assert kept == await counted(found)
    assert await found.count_projects() == len(kept)
    return kept


@async_test
async def test_the_summary_follows_exports_renames_merges_removals_and_retention(
        store: Store, aio: Any) -> None:
    found = history(store)
    assert await agrees(found) == []
    [a1] = await export(store, "a1", "Night Drive", now=T0)
    await succeed(store, a1, T0 + 1, {"verdict": "pass"})
    [b1] = await export(store, "b1", "Heros Rite", now=T0 + 10)
    [a2] = await export(store, "a2", "Night Drive", now=T0 + 20)
    [c1] = await export(store, "c1", "junk", now=T0 + 30)
    assert await agrees(found) == [("junk", c1, 1), ("Night Drive", a2, 2),
                                   ("Heros Rite", b1, 1)]

    await found.move("Heros Rite", "Heroes Rite")  # a rename
    [b2] = await export(store, "b2", "Heros Rite", now=T0 + 40)  # sent under the old name
    assert await agrees(found) == [("Heroes Rite", b2, 2), ("junk", c1, 1),
                                   ("Night Drive", a2, 2)]

    await found.move("Heroes Rite", "Night Drive")  # a merge: the older latest stays behind
    assert await agrees(found) == [("Night Drive", b2, 4), ("junk", c1, 1)]

    await found.remove_project("junk", T0 + 50)
    assert await agrees(found) == [("Night Drive", b2, 4)]
    [c2] = await export(store, "c2", "junk", now=T0 + 60)  # its name starts anew
    assert await agrees(found) == [("junk", c2, 1), ("Night Drive", b2, 4)]

    now = T0 + 40 * DAY
    [a3] = await export(store, "a3", "Night Drive", now=now)
    settings = Settings(retention_days=30.0, body_retention_days=7.0,
                        idempotency_ttl_seconds=DAY)
    report = await Retention(store, settings, lambda: now, rest_ratio=0.0).prune()
    assert report.removed["project_exports"] >= 1  # the finished run a1 is kept as an export
    assert await agrees(found) == [("Night Drive", a3, 5), ("junk", c2, 1)]
    [latest] = await found.latest(limit=1)
    assert latest.latest.run_id == a3 and not latest.latest.archived
    assert latest.position[1] == a3


@async_test
async def test_a_page_of_projects_by_name_and_after_a_position(store: Store, aio: Any) -> None:
    found = history(store)
    names = [f"Song {n}" for n in range(7)] + ["Über Nacht", "night drive"]
    for n, name in enumerate(names):
        await export(store, f"e{n}", name, now=T0 + n)
    seen: list[str] = []
    after = None
    while True:
        page = await found.latest(limit=2, after=after)
        seen += [p.latest.project for p in page]
        if len(page) < 2:
            break
        after = page[-1].position
    assert seen == names[::-1]  # every project once, in the order of their latest export
    assert [p.latest.project for p in await found.latest(limit=9, name="NIGHT")] == [
        "night drive"]  # ASCII letters in either case
    assert [p.latest.project for p in await found.latest(limit=9, name="Über")] == [
        "Über Nacht"]
    assert await found.count_projects("song") == 7
    assert await found.count_projects("nothing like it") == 0
    assert await found.latest(limit=9, name="a\x00b") == []  # PostgreSQL cannot be asked
    assert await found.latest(limit=9, after=(T0, "run\x00")) == []


@async_test
async def test_one_write_batch_of_many_projects_names_and_a_rejudgment(
        store: Store, aio: Any) -> None:
    """The summary is brought up to date once per write batch (queries.sql:
    keep_runs): events of several projects stored in one transaction, one under a
    project's former name and one a re-judgment, count as each does alone."""
    found = history(store)
    [a1] = await export(store, "a1", "Night Drive", now=T0)
    await found.move("Night Drive", "Night Drive II")  # "Night Drive" is a former name now

    async def rejudgment(event_id: str, project: str) -> None:
        body = json.loads(export_body(event_id, project))
        body["source"] = "agentbox.rejudge"
        body["idempotency_key"] = f"agentbox.rejudge:session.exported:{event_id}"
        raw = json.dumps(body).encode()
        await store.ingest(IngestParams(event=parse_event(raw), body=raw, agents=("mix_review",),
                                        now=T0 + 10, ttl=TTL, max_pending=MAX_PENDING))

    # gathered: they share the writer's next transaction
    batch = await asyncio.gather(
        export(store, "b1", "Heros Rite", now=T0 + 10),
        export(store, "a2", "Night Drive", now=T0 + 10),
        export(store, "b2", "Heros Rite", now=T0 + 10),
        export(store, "c1", "junk", now=T0 + 10),
        rejudgment("r1", "junk"))
    [b1], [a2], [b2], [c1] = batch[:4]
    kept = await summary(found)  # the re-judgment listed with junk's exports, not counted
    assert {row[0]: row[2] for row in kept} == {"Night Drive II": 2, "Heros Rite": 2, "junk": 1}
    latest = {row[0]: row[1] for row in kept}
    assert latest["Night Drive II"] == a2 != a1
    assert latest["Heros Rite"] == max(b1, b2) and latest["junk"] == c1


@async_test
async def test_a_file_that_is_not_audio_leaves_its_project_and_is_dismissed(
        store: Store, aio: Any) -> None:
    """Noted as no audio (the review's version 7): no export of its project, its latest
    and count made again without it; listed until dismissed, once."""
    found = history(store)
    [a1] = await export(store, "a1", "Night Drive", now=T0)
    [a2] = await export(store, "a2", "Night Drive", now=T0 + 10)  # a text file, say
    [n1] = await export(store, "n1", "notes", now=T0 + 20)  # a project of it alone
    assert await agrees(found) == [("notes", n1, 1), ("Night Drive", a2, 2)]
    assert await found.note_not_audio(a2, T0 + 30) == "Night Drive"
    assert await found.note_not_audio(n1, T0 + 31) == "notes"
    assert await found.note_not_audio(n1, T0 + 32) is None  # noted once
    assert await found.missed_not_audio() == []  # no run failed as no audio, unnoted
    assert await agrees(found) == [("Night Drive", a1, 1)]
    assert [e.run_id for e in await found.project_exports("Night Drive")] == [a1]
    assert await found.not_audio() == [n1, a2]
    assert await found.dismiss_not_audio(n1, T0 + 40)
    assert not await found.dismiss_not_audio(n1, T0 + 41)  # dismissed already
    assert not await found.dismiss_not_audio(a1, T0 + 41)  # never listed
    assert await found.not_audio() == [a2]
    [a3] = await export(store, "a3", "Night Drive", now=T0 + 50)
    assert await agrees(found) == [("Night Drive", a3, 2)]
    assert await found.unnote_not_audio(a2) == "Night Drive"  # replayed: audio after all
    assert await found.unnote_not_audio(a2) is None
    assert await agrees(found) == [("Night Drive", a3, 3)]
    assert await found.not_audio() == []


@async_test
async def test_the_bytes_an_admission_read_are_kept_with_the_run(store: Store, aio: Any
                                                                 ) -> None:
    """The review's version 6: what renders.identify noted of an event's file is kept
    with its run in the ingest's transaction (Schema.keeps), taken once."""
    found = history(store)
    ADMITTED.note("studio:session.exported:d1", 1234, "ab" * 32)
    [d1] = await export(store, "d1", "Night Drive", now=T0)
    [d2] = await export(store, "d2", "Night Drive", now=T0 + 1)  # nothing noted of it
    assert await found.admitted_digest(d1) == (1234, "ab" * 32)
    assert await found.admitted_digest(d2) is None
    assert ADMITTED.take("studio:session.exported:d1") is None
    assert [e.project for e in await found.project_exports("Night Drive")] == [
        "Night Drive"] * 2
