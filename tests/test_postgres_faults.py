"""PostgreSQL refusing writes under a running server, and the database password.

A real `agentbox serve` on a real PostgreSQL database: when the database turns
read-only (as a full or failing server does: every write is refused), the
receiver answers 503 with Retry-After and stores nothing, /healthz and the page
say why, the log says so once, and once writes are allowed again it recovers by
itself (and says so). The password
in AGENTBOX_DATABASE_URL appears in no log line, answer or error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.conftest import ROOT, Server, make_event, wait_until
from tests.postgres import database_name

pytestmark = pytest.mark.postgres
PASSWORD = "db-password-7c1f0e9a"  # the test server trusts local users: any password works
CANNOT = '"msg": "the store cannot take writes'  # the log lines that say when and until when
AGAIN = '"msg": "the store takes writes again"'


def with_password(url: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def set_read_only(admin_url: str, url: str, read_only: bool) -> None:
    """Make the database refuse writes (or take them again), then cut agentbox's
    connections so that the new setting applies to every connection it makes."""
    name = database_name(url)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if read_only:
            conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        else:
            conn.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND application_name LIKE 'agentbox%%'", (name,))


def test_a_read_only_database_answers_503_and_recovers(
        server_factory: Callable[..., Server], postgres_admin_url: str,
        postgres_url: str) -> None:
    url = with_password(postgres_url)
    server = server_factory({"AGENTBOX_DATABASE_URL": url}).start()
    first = server.post(make_event())
    assert first.status_code == 202, first.text

    set_read_only(postgres_admin_url, postgres_url, True)
    refused = server.post(make_event())
    assert refused.status_code == 503, refused.text
    assert refused.json()["error_code"] == "storage_unavailable"
    assert int(refused.headers["retry-after"]) > 0
    # Refused again after reconnecting: the new connection is read-only too.
    lost = make_event()
    assert server.post(lost).status_code == 503
    health = server.client.get("/healthz")
    assert health.status_code == 503
    assert "read-only" in health.json()["reason"] or "ReadOnly" in health.json()["reason"]
    assert "Events cannot be stored" in server.client.get("/").text

    assert server.log_path.read_text().count(CANNOT) == 1  # said once, not per request

    set_read_only(postgres_admin_url, postgres_url, False)
    again = wait_until(lambda: (r := server.post(make_event())).status_code == 202 and r,
                       20, "writes to be taken again")
    wait_until(lambda: server.client.get("/healthz").status_code == 200, 20, "health")
    wait_until(lambda: server.post(make_event()).status_code == 202
               and AGAIN in server.log_path.read_text(), 20, "the log to say so", interval=0.2)
    assert server.log_path.read_text().count(CANNOT) == 1
    for run_id in (first.json()["run_id"], again.json()["run_id"]):
        assert server.wait_terminal(run_id)["status"] == "succeeded"
    runs = server.client.get("/runs", params={"limit": 500}).json()["runs"]
    assert lost["event_id"] not in {run["event_id"] for run in runs}  # nothing half-written

    outputs = [server.client.get(path).text for path in
               ("/healthz", "/metrics", "/", "/runs", "/ui/dead-letters", "/ui/callbacks")]
    server.stop()
    outputs.append(server.log_path.read_text())
    assert "postgresql" in server.log_path.read_text()  # the URL is logged, redacted
    for text in outputs:
        assert PASSWORD not in text


def cli_env(tmp_path: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")},
            "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "AGENTBOX_DATA_DIR": str(tmp_path / "data")}


def agentbox(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], env=cli_env(tmp_path),
                          capture_output=True, text=True, timeout=60)


def test_verify_checks_a_postgresql_store_read_only(tmp_path: Path, postgres_url: str) -> None:
    assert agentbox(tmp_path, "migrate", "--database-url", postgres_url).returncode == 0
    clean = agentbox(tmp_path, "verify", "--database-url", postgres_url)
    assert clean.returncode == 0 and clean.stdout.strip().endswith(": ok"), clean.stdout
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # damage: an event, no run
        conn.execute("INSERT INTO events (event_id, idempotency_key, event_type, source, "
                     "received_at, body) VALUES ('orphan', 'k', 't', 's', 0, '\\x00')")
    damaged = agentbox(tmp_path, "verify", "--database-url", postgres_url)
    assert damaged.returncode == 1
    assert "events without any run: orphan" in damaged.stdout


def test_cli_errors_never_show_the_database_password(tmp_path: Path) -> None:
    free = "postgresql://agentbox:" + PASSWORD + "@127.0.0.1:1/agentbox"  # nothing listens
    for command in (["migrate", "--database-url", free], ["verify", "--database-url", free],
                    ["serve", "--port", "1", "--database-url", free]):
        done = agentbox(tmp_path, *command)
        assert done.returncode != 0, command
        assert PASSWORD not in done.stdout + done.stderr, command
        assert "127.0.0.1" in done.stderr and "***" in done.stderr, done.stderr


def test_an_unreachable_database_answers_503_on_every_read(
        server_factory: Callable[..., Server], postgres_admin_url: str,
        postgres_url: str) -> None:
    server = server_factory({"AGENTBOX_DATABASE_URL": postgres_url}).start()
    run_id = server.post(make_event()).json()["run_id"]
    name = database_name(postgres_url)
    with psycopg.connect(postgres_admin_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s", (name,))
    try:
        for path in ("/runs", f"/runs/{run_id}", "/callbacks", "/callbacks/destinations",
                     "/healthz"):
            answer = server.client.get(path)
            assert answer.status_code == 503, (path, answer.text)
        answer = server.client.get("/runs")
        assert answer.json()["error_code"] == "storage_unavailable"
        assert int(answer.headers["retry-after"]) > 0
        assert server.post(make_event()).status_code == 503
    finally:
        with psycopg.connect(postgres_admin_url, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
    wait_until(lambda: server.client.get("/healthz").status_code == 200, 30, "recovery")
    assert server.wait_terminal(run_id)["status"] == "succeeded"
    assert server.post(make_event()).status_code == 202
