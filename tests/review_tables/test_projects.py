"""Projects: the event's project kept at ingest (the review's run_projects), the run
view's `project` and the run search's filter (the review's run field and filters),
the latest export of each project and a project's exports (every engine). The
review's tables on a database an earlier release wrote: test_release_schema.py."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import pytest

from agentbox.archive.records import ProjectExport
from agentbox.events import parse_event
from agentbox.runs import RunStatus
from agentbox.store import IngestParams, Outcome, Store
from tests.store.support import (
    MAX_PENDING,
    T0,
    TTL,
    async_test,
    at,
    claim_one,
    history,
    ms,
)

DECOMPOSED = unicodedata.normalize("NFD", "Über Nacht")  # U + combining diaeresis
COMPOSED = unicodedata.normalize("NFC", "Über Nacht")


def export_body(event_id: str, project: str | None) -> bytes:
    """A session.exported event (its payload without project_id when None: not a
    valid event, only ever stored as another event's body)."""
    payload: dict[str, Any] = {"mix_url": f"/mixes/{event_id}.wav"}
    if project is not None:
        payload["project_id"] = project
    event_type = "session.exported"
    return json.dumps({
        "schema_version": "v1", "event_id": event_id,
        "idempotency_key": f"studio:{event_type}:{event_id}", "event_type": event_type,
        "source": "studio", "timestamp": "2026-07-27T15:42:00Z", "payload": payload,
    }).encode()


async def export(store: Store, event_id: str, project: str, *, now: float,
                 agents: tuple[str, ...] = ("mix_review",)) -> list[str]:
    body = export_body(event_id, project)
    result = await store.ingest(IngestParams(event=parse_event(body), body=body, agents=agents,
                                             now=now, ttl=TTL, max_pending=MAX_PENDING))
    return [ref.run_id for ref in result.runs]


async def succeed(store: Store, run_id: str, now: float, result: dict[str, Any]) -> None:
    claimed = await claim_one(store, now=now)
    assert claimed.run_id == run_id
    assert await store.finish(run_id, "w1", 1, Outcome(RunStatus.SUCCEEDED, result=result),
                              now + 1)


@async_test
async def test_the_run_view_carries_the_events_project_in_nfc(store: Store, aio: Any) -> None:
    [run_id] = await export(store, "e1", DECOMPOSED, now=T0)
    view = await store.get_run(run_id)
    assert view is not None and view.project == COMPOSED == view["project"]
    for name in (DECOMPOSED, COMPOSED):
        assert [r.run_id for r in await store.search_runs(filters={"project": name})] == [
            run_id]
    assert await store.search_runs(filters={"project": "über nacht"}) == []  # case counts
    assert await store.search_runs(filters={"project": "Über"}) == []  # no prefix match
    assert await store.search_runs(filters={"genre": "Über"}) == []  # no app's filter
    assert [r.project for r in await store.list_runs(None, 10)] == [COMPOSED]


@async_test
async def test_projects_answers_the_latest_export_of_each_project(
        store: Store, aio: Any) -> None:
    [a1] = await export(store, "a1", "night-drive", now=T0)
    await succeed(store, a1, T0 + 1, {"verdict": "pass"})
    [b1] = await export(store, "b1", "Über Nacht", now=T0 + 10)
    [a2] = await export(store, "a2", "night-drive", now=T0 + 20)
    found = await history(store).projects()
    assert [(p.project, p.run_id) for p in found] == [("night-drive", a2), ("Über Nacht", b1)]
    latest = found[0]
    assert isinstance(latest, ProjectExport)
    assert (latest.agent, latest.status, latest.finished_at, latest.result) == (
        "mix_review", "accepted", None, None)
    assert at(latest.accepted_at) == ms(T0 + 20)
    assert [p.project for p in await history(store).projects(limit=1)] == ["night-drive"]
    assert await history(store).projects(agent="loudness") == []


@async_test
async def test_project_exports_newest_first_with_the_previous_export(
        store: Store, aio: Any) -> None:
    [first] = await export(store, "x1", "night-drive", now=T0)
    await succeed(store, first, T0 + 1, {"integrated_lufs": -14.2})
    [second] = await export(store, "x2", "night-drive", now=T0 + 10)
    await export(store, "y1", "other", now=T0 + 15)
    [third] = await export(store, "x3", "night-drive", now=T0 + 20)
    exports = await history(store).project_exports("night-drive")
    assert [e.run_id for e in exports] == [third, second, first]
    done = exports[-1]
    assert done.status == "succeeded" and done.result == {"integrated_lufs": -14.2}
    assert at(done.finished_at) == ms(T0 + 2)
    previous = await history(store).project_exports("night-drive", agent="mix_review",
                                           status="succeeded", before_run_id=third, limit=1)
    assert [e.run_id for e in previous] == [first]
    assert [e.run_id for e in await history(store).project_exports(
        "night-drive", before_run_id=second)] == [first]
    assert await history(store).project_exports("night-drive", before_run_id=first) == []
    assert await history(store).project_exports("night-drive", agent="loudness") == []
    assert await history(store).project_exports("night") == []  # exact
    assert [e.run_id for e in await history(store).project_exports("night-drive", limit=2)] == [
        third, second]
    assert await history(store).project_exports("nul\u0000") == []  # never a failed query


@async_test
async def test_several_agents_each_have_their_exports(store: Store, aio: Any) -> None:
    runs = await export(store, "e1", "p", now=T0, agents=("mix_review", "loudness"))
    assert {e.run_id for e in await history(store).project_exports("p")} == set(runs)
    assert [e.agent for e in await history(store).project_exports("p", agent="loudness")] == [
        "loudness"]
    assert [p.agent for p in await history(store).projects(agent="loudness")] == ["loudness"]
    assert len(await history(store).projects()) == 1  # one per project


@pytest.mark.parametrize("project", ["night_drive", "50% done", 'say "hi"', "a/b & c"])
@async_test
async def test_a_project_is_compared_exactly(store: Store, aio: Any, project: str) -> None:
    [run_id] = await export(store, "e1", project, now=T0)
    await export(store, "e2", project.upper() + "x", now=T0 + 1)
    assert [e.run_id for e in await history(store).project_exports(project)] == [run_id]
    assert [r.run_id for r in await store.search_runs(text=project)] == [run_id]
