"""The storage refusing writes: 503, nothing half-written, and recovery by itself.

The fault is real: SQLite's max_page_count makes the real database file "full"
(SQLITE_FULL), exactly what a full disk gives, without filling a disk.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from agentbox.config import load_settings
from agentbox.http.app import create_app
from agentbox.signing import sign_headers
from agentbox.store.sqlite import SqliteStore
from tests.conftest import ADMIN_TOKEN, SECRET, TEST_AGENT, Server, encode, make_event


async def post(client: httpx.AsyncClient, event: dict[str, Any]) -> httpx.Response:
    body = encode(event)
    return await client.post("/webhooks/events", content=body,
                             headers=sign_headers(SECRET, body, int(time.time())))


Scenario = Callable[[httpx.AsyncClient, sqlite3.Connection], Awaitable[None]]


def run_in_app(tmp_path: Path, scenario: Scenario) -> None:
    """Run `scenario(client, the store's real writer connection)` against an app in
    this process. Its agents take their time: no outcome is written between a
    refusal and the health check (a small write may still fit, and a durable one
    vouches for health)."""
    settings = load_settings(environ={"AGENTBOX_DATA_DIR": str(tmp_path / "data"),
                                      "AGENTBOX_WEBHOOK_SECRET": SECRET,
                                      "AGENTBOX_CALLBACK_SECRET": "callback-secret",
                                      "AGENTBOX_AGENTS": "session.exported=" + TEST_AGENT,
                                      "AGENTBOX_SHUTDOWN_GRACE_SECONDS": "0.2"},
                             overrides={"config_dir": tmp_path / "config"})
    app = create_app(settings, admin_token=ADMIN_TOKEN)

    async def run() -> None:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            store: SqliteStore = app.state.store
            assert store._conn is not None
            await scenario(client, store._conn)

    asyncio.run(run())


def test_full_storage_answers_503_and_recovers(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, conn: sqlite3.Connection) -> None:
        assert (await post(client, make_event(project_id="sleep-30"))).status_code == 202
        # the writer's file is "full": it may not grow
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        accepted = []
        for _ in range(1000):  # the pages left fill up within a few events
            big = make_event(project_id="sleep-30")
            big["payload"]["mix_url"] = "/" + "m" * 2000
            refused = await post(client, big)
            if refused.status_code != 202:
                break
            accepted.append(refused.json()["run_id"])
        assert refused.status_code == 503, refused.text
        assert refused.json()["error_code"] == "storage_unavailable"
        assert int(refused.headers["Retry-After"]) > 0
        health = await client.get("/healthz")
        assert health.status_code == 503 and "full" in health.json()["reason"], health.text
        runs = (await client.get("/runs", params={"limit": 500})).json()["runs"]
        assert big["event_id"] not in {r["event_id"] for r in runs}
        assert set(accepted) <= {r["run_id"] for r in runs}
        conn.execute("PRAGMA max_page_count = 1073741823")
        assert (await post(client, big)).status_code == 202
        assert (await client.get("/healthz")).status_code == 200

    run_in_app(tmp_path, scenario)


def test_a_read_only_database_answers_503_and_recovers(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, conn: sqlite3.Connection) -> None:
        first = await post(client, make_event(project_id="sleep-30"))
        assert first.status_code == 202
        # the writer may no longer write at all
        conn.execute("PRAGMA query_only = 1")
        lost = make_event(project_id="sleep-30")
        refused = await post(client, lost)
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["Retry-After"]) > 0
        health = await client.get("/healthz")
        assert health.status_code == 503 and "readonly" in health.json()["reason"]
        assert "Events cannot be stored" in (await client.get("/")).text
        conn.execute("PRAGMA query_only = 0")
        again = await post(client, make_event(project_id="sleep-30"))
        assert again.status_code == 202
        assert (await client.get("/healthz")).status_code == 200
        runs = (await client.get("/runs", params={"limit": 500})).json()["runs"]
        ids = {r["run_id"] for r in runs}
        assert {first.json()["run_id"], again.json()["run_id"]} <= ids
        assert lost["event_id"] not in {r["event_id"] for r in runs}

    run_in_app(tmp_path, scenario)


def test_a_database_file_removed_before_anything_was_counted(
        server_factory: Callable[..., Server]) -> None:
    """Nothing read the run counts before the removal (the counts' connection was
    opened on first use: a 500 on the page and /metrics, and a new empty file)."""
    server = server_factory().start(ready_path="/openapi.json")
    database = server.home / "data" / "agentbox.sqlite3"
    assert database.exists()
    database.unlink()
    page = server.client.get("/")
    assert page.status_code == 200, page.text
    assert "Events cannot be stored" in page.text and "removed" in page.text
    assert server.client.get("/metrics").status_code == 200
    health = server.client.get("/healthz")
    assert health.status_code == 503 and "removed" in health.json()["reason"]
    assert server.post(make_event()).status_code == 503
    assert not database.exists()  # nothing made a new, empty one in its place


def test_a_removed_data_directory_answers_503_not_202(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory().start()
    assert server.post(make_event()).status_code == 202
    shutil.rmtree(server.home / "data")
    response = server.post(make_event())
    assert response.status_code == 503, response.text
    assert response.json()["error_code"] == "storage_unavailable"
    assert response.headers["retry-after"]
    health = server.client.get("/healthz")
    assert health.status_code == 503 and "removed" in health.json()["reason"]
    page = server.client.get("/").text
    assert "Events cannot be stored" in page and "removed" in page
