"""The JSON API in process (runs, filters, replay, callbacks, health, metrics): the
real app and store (a temporary SQLite file) over httpx's ASGI transport."""

from __future__ import annotations

import pytest

from tests.conftest import InProcess, make_event

pytestmark = pytest.mark.anyio


async def finished(box: InProcess, project_id: str, **extra: str) -> dict[str, object]:
    """Post an event whose scripted agent behaves as `project_id` says; its final run."""
    response = await box.post(make_event(project_id=project_id, **extra))
    assert response.status_code == 202, response.text
    return await box.wait_status(response.json()["run_id"])


async def test_a_run_is_read_by_id_with_its_history(box: InProcess) -> None:
    run = await finished(box, "fail-1")
    assert run["status"] == "succeeded" and run["attempt"] == 2 and run["retry_count"] == 1
    assert run["callbacks"] == []
    full = await box.run(str(run["run_id"]), history=True)
    assert [a["attempt"] for a in full["attempts"]] == [1, 2]
    statuses = [step["status"] for step in full["history"]]
    assert statuses[0] == "accepted" and statuses[-1] == "succeeded"
    assert "failed_retryable" in statuses
    assert "attempts" not in run and "history" not in run  # only when asked


async def test_an_unknown_run_is_404(box: InProcess) -> None:
    response = await box.client.get("/runs/no-such-run")
    assert response.status_code == 404
    assert response.json()["error_code"] == "run_not_found"


async def test_runs_are_listed_newest_first_and_filtered(box: InProcess) -> None:
    ok = await finished(box, "ok")
    bad = await finished(box, "permanent")
    listed = (await box.client.get("/runs")).json()["runs"]
    assert [run["run_id"] for run in listed] == [bad["run_id"], ok["run_id"]]
    by_status = (await box.client.get("/runs", params={"status": "failed_permanent"})).json()
    assert [run["run_id"] for run in by_status["runs"]] == [bad["run_id"]]
    one = (await box.client.get("/runs", params={"limit": "1"})).json()["runs"]
    assert [run["run_id"] for run in one] == [bad["run_id"]]


async def test_runs_are_found_by_their_chain(box: InProcess) -> None:
    chained = await finished(box, "ok", correlation_id="chain-1")
    await finished(box, "ok")
    found = (await box.client.get("/runs", params={"correlation_id": "chain-1"})).json()
    assert [run["run_id"] for run in found["runs"]] == [chained["run_id"]]


@pytest.mark.parametrize("query", [{"status": "bogus"}, {"limit": "0"}, {"limit": "501"},
                                   {"limit": "ten"}, {"discarded": "maybe"},
                                   {"correlation_id": "x" * 257}])
async def test_a_bad_list_query_is_422(box: InProcess, query: dict[str, str]) -> None:
    response = await box.client.get("/runs", params=query)
    assert response.status_code == 422, response.text
    assert response.json()["error_code"] == "invalid_query"


async def test_a_replay_needs_the_admin_token(box: InProcess) -> None:
    dead = await finished(box, "always-fail")
    assert dead["status"] == "dead_lettered"
    run_id = str(dead["run_id"])
    async with box.anonymous() as anonymous:
        refused = await anonymous.post(f"/runs/{run_id}/replay")
    assert refused.status_code == 401
    assert refused.json()["error_code"] == "admin_token_required"
    wrong = await box.client.post(f"/runs/{run_id}/replay",
                                  headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401
    assert (await box.run(run_id))["replays"] == 0


async def test_a_dead_letter_is_replayed_as_the_same_run(box: InProcess) -> None:
    run_id = str((await finished(box, "always-fail"))["run_id"])
    bearer = {"Authorization": f"Bearer {box.token}"}
    replayed = await box.client.post(f"/runs/{run_id}/replay", headers=bearer)
    assert replayed.status_code == 202, replayed.text
    assert replayed.json()["run_id"] == run_id and replayed.json()["replays"] == 1
    again = await box.wait_status(run_id)
    assert again["status"] == "dead_lettered" and again["replays"] == 1


async def test_a_replay_of_a_success_or_of_nothing_is_refused(box: InProcess) -> None:
    ok = str((await finished(box, "ok"))["run_id"])
    bearer = {"Authorization": f"Bearer {box.token}"}
    conflict = await box.client.post(f"/runs/{ok}/replay", headers=bearer)
    assert conflict.status_code == 409
    assert conflict.json()["error_code"] == "not_replayable"
    missing = await box.client.post("/runs/no-such-run/replay", headers=bearer)
    assert missing.status_code == 404


async def test_callbacks_and_destinations_are_listed(box: InProcess) -> None:
    listed = await box.client.get("/callbacks", params={"state": "dead"})
    assert listed.status_code == 200 and listed.json() == {"callbacks": []}
    bad = await box.client.get("/callbacks", params={"state": "lost"})
    assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_query"
    destinations = await box.client.get("/callbacks/destinations")
    assert destinations.json() == {"destinations": []}


async def test_resuming_a_destination_is_checked(box: InProcess) -> None:
    path = "/callbacks/destinations/resume"
    async with box.anonymous() as anonymous:
        assert (await anonymous.post(path, json={"destination": "https://a.example"})
                ).status_code == 401
    bearer = {"Authorization": f"Bearer {box.token}"}
    bad = await box.client.post(path, json={"destination": "not a url"}, headers=bearer)
    assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_request"
    unknown = await box.client.post(path, json={"destination": "https://a.example"},
                                    headers=bearer)
    assert unknown.status_code == 404
    assert unknown.json()["error_code"] == "destination_not_found"


async def test_health_metrics_and_the_openapi_document(box: InProcess) -> None:
    await finished(box, "ok")
    health = await box.client.get("/healthz")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["engine"] == "sqlite"
    metrics = await box.client.get("/metrics")
    assert metrics.status_code == 200
    assert "agentbox_" in metrics.text
    document = (await box.client.get("/openapi.json")).json()
    assert "/webhooks/events" in document["paths"] and "/runs/{run_id}" in document["paths"]


async def test_an_unknown_path_is_a_json_404(box: InProcess) -> None:
    response = await box.client.get("/nothing-here")
    assert response.status_code == 404
    assert response.json()["error_code"] == "not_found"


# -- a project's exports (GET /exports) ------------------------------------------------------


async def test_a_project_s_exports_are_read_newest_first(box: InProcess) -> None:
    first = await finished(box, "Über Nacht")
    other = await finished(box, "ok")
    second = await finished(box, "Über Nacht")
    # Asked for as a Mac's file system spells it (decomposed): the same project.
    answer = await box.client.get("/exports", params={"project": "U\u0308ber Nacht"})
    assert answer.status_code == 200, answer.text
    exports = answer.json()["exports"]
    assert [e["run_id"] for e in exports] == [second["run_id"], first["run_id"]]
    assert {e["project"] for e in exports} == {"Über Nacht"}
    assert exports[0]["status"] == "succeeded" and exports[0]["finished_at"]
    assert exports[0]["result"] == second["result"]
    document = (await box.client.get("/openapi.json")).json()
    documented = set(document["components"]["schemas"]["ExportView"]["properties"])
    assert all(set(e) == documented for e in exports)
    one = (await box.client.get("/exports", params={"project": "Über Nacht", "limit": "1"}))
    assert [e["run_id"] for e in one.json()["exports"]] == [second["run_id"]]
    latest = (await box.client.get("/exports")).json()["exports"]
    assert [(e["project"], e["run_id"]) for e in latest] == [
        ("Über Nacht", second["run_id"]), ("ok", other["run_id"])]


async def test_a_project_without_exports_is_404_and_a_bad_query_422(box: InProcess) -> None:
    await finished(box, "ok")
    unknown = await box.client.get("/exports", params={"project": "nothing yet"})
    assert unknown.status_code == 404
    assert unknown.json()["error_code"] == "project_not_found"
    assert unknown.json()["message"] == "No export of a project named 'nothing yet' has " \
                                        "arrived yet."
    for unfit in ("a\nb", " ok", "ok\x00", "ok\u202e"):  # names no event may carry
        answer = await box.client.get("/exports", params={"project": unfit})
        assert answer.status_code == 404, unfit
        assert answer.json()["error_code"] == "project_not_found", unfit
    for query in ({"project": ""}, {"project": "x" * 257}, {"limit": "0"},
                  {"project": "ok", "limit": "many"}):
        bad = await box.client.get("/exports", params=query)
        assert bad.status_code == 422, query
        assert bad.json()["error_code"] == "invalid_query", query
