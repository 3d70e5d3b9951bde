"""The agentbox command against a real server, as an export script would use it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import Server, make_event


def agentbox(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], env=server.env,
                          capture_output=True, text=True, timeout=60, cwd=server.home)


def test_send_then_follow_the_run(server: Server) -> None:
    sent = agentbox(server, "send", "--url", server.url, "--source", "daw", "--event-id",
                    "mix-1", "session.exported", "project_id=ok", "mix_url=/mixes/a.wav")
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    assert answer["status"] == "accepted"
    run = server.wait_terminal(answer["run_id"])
    assert run["event_id"] == "mix-1" and run["source"] == "daw"
    again = agentbox(server, "send", "--url", server.url, "--source", "daw", "--event-id",
                     "mix-1", "session.exported", "project_id=ok", "mix_url=/mixes/a.wav")
    assert again.returncode == 0 and json.loads(again.stdout)["duplicate"] is True
    listed = agentbox(server, "runs", "--url", server.url)
    assert answer["run_id"] in listed.stdout and "succeeded" in listed.stdout
    shown = json.loads(agentbox(server, "show", answer["run_id"], "--url", server.url).stdout)
    assert [h["status"] for h in shown["history"]] == ["accepted", "processing", "succeeded"]


def test_send_refused_event_exits_non_zero(server: Server) -> None:
    sent = agentbox(server, "send", "--url", server.url, "session.exported", "project_id=ok")
    assert sent.returncode == 1
    assert json.loads(sent.stdout)["error_code"] == "invalid_event"


def test_send_a_prepared_file(server: Server, tmp_path: Path) -> None:
    event = tmp_path / "event.json"
    event.write_text(json.dumps(make_event(project_id="ok")))
    sent = agentbox(server, "send", "--url", server.url, "--file", str(event))
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert server.wait_terminal(json.loads(sent.stdout)["run_id"])["status"] == "succeeded"


def test_dead_letters_and_replay(server: Server) -> None:
    sent = agentbox(server, "send", "--url", server.url, "session.exported",
                    "project_id=always-fail", "mix_url=/m.wav")
    run_id = json.loads(sent.stdout)["run_id"]
    server.wait_terminal(run_id)
    assert run_id in agentbox(server, "dead-letters", "--url", server.url).stdout
    replayed = agentbox(server, "replay", run_id, "--url", server.url)
    assert replayed.returncode == 0, replayed.stderr
    assert server.wait_terminal(run_id)["replays"] == 1
    missing = agentbox(server, "replay", "run_missing", "--url", server.url)
    assert missing.returncode != 0 and "404" in missing.stderr


def test_secret_and_token(server: Server) -> None:
    assert agentbox(server, "secret").stdout.strip() == "integration-test-secret"
    token = agentbox(server, "token").stdout.strip()
    assert token == (server.home / "config" / "agentbox" / "admin_token").read_text().strip()


def test_unreachable_server_is_a_clear_error(server: Server) -> None:
    sent = agentbox(server, "send", "--url", "http://127.0.0.1:9", "session.exported",
                    "project_id=ok", "mix_url=/m.wav")
    assert sent.returncode != 0 and "cannot reach agentbox" in sent.stderr


def test_verify_reports_ok_and_finds_damage(server: Server) -> None:
    run_id = server.post(make_event()).json()["run_id"]
    server.wait_terminal(run_id)
    ok = agentbox(server, "verify")
    assert ok.returncode == 0 and ok.stdout.strip().endswith(": ok"), ok.stdout + ok.stderr
    server.stop()
    import sqlite3
    conn = sqlite3.connect(server.home / "data" / "agentbox.sqlite3")
    conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    conn.execute("INSERT INTO outbox (notification_id, run_id, status, destination, url, body,"
                 " created_at, ready) VALUES ('x:processing:0', 'x', 'processing', 'o', 'u',"
                 " '{}', 0, 1)")
    conn.commit()
    conn.close()
    damaged = agentbox(server, "verify")
    assert damaged.returncode == 1
    assert "events without any run" in damaged.stdout
    assert "callback notifications whose run is missing: x:processing:0" in damaged.stdout
