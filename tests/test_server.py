"""End to end: a real `agentbox serve` process on 127.0.0.1, a real HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from agentbox.http.app import create_app
from agentbox.http.receiver import INTERNAL_ERROR_MESSAGE
from agentbox.signing import sign_headers, standard_signature
from tests.conftest import (
    SECRET,
    Server,
    encode,
    in_process_settings,
    make_event,
    wait_until,
)


def test_signed_event_runs_to_succeeded(server: Server) -> None:
    response = server.post(make_event(project_id="ok"))
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "accepted" and body["duplicate"] is False
    assert body["status_url"] == f"/runs/{body['run_id']}"
    run = server.wait_terminal(body["run_id"])
    assert run["status"] == "succeeded"
    assert run["result"] == {"project_id": "ok", "attempt": 1}
    assert run["retry_count"] == 0 and run["error_code"] is None
    for field in ("event_id", "event_type", "source", "agent", "accepted_at", "started_at",
                  "updated_at", "completed_at"):
        assert run[field], field


def test_fifty_concurrent_deliveries_make_one_run(server: Server) -> None:
    event = make_event(project_id="sleep-0.2")
    with ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(lambda _: server.post(event), range(50)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(202) == 1 and codes.count(200) == 49, codes
    run_ids = {r.json()["run_id"] for r in responses}
    assert len(run_ids) == 1
    assert all(r.json()["duplicate"] is True for r in responses if r.status_code == 200)
    server.wait_terminal(run_ids.pop())
    starts = [j for j in server.journal_lines() if j["kind"] == "start"]
    assert len(starts) == 1


def test_duplicate_reports_the_first_runs_current_status(server: Server) -> None:
    event = make_event(project_id="ok")
    first = server.post(event).json()
    server.wait_terminal(first["run_id"])
    again = server.post(event)
    assert again.status_code == 200
    assert again.json()["run_id"] == first["run_id"]
    assert again.json()["status"] == "succeeded" and again.json()["duplicate"] is True


def test_replayed_old_timestamp_is_refused(server: Server) -> None:
    response = server.post(make_event(), timestamp=int(time.time()) - 301)
    assert response.status_code == 401
    assert response.json()["error_code"] == "signature_expired"
    future = server.post(make_event(), timestamp=int(time.time()) + 301)
    assert future.status_code == 401
    # Its small body was there: read and dropped, so the connection is not closed on
    # unread bytes (which the kernel turns into a reset that can beat the 401 home).
    assert response.headers.get("connection") != "close"


def test_reserialised_body_fails_the_signature(server: Server) -> None:
    event = make_event()
    body = encode(event)
    headers = {"Content-Type": "application/json", "X-Webhook-Timestamp": str(int(time.time()))}
    from agentbox.signing import hex_signature
    headers["X-Webhook-Signature"] = hex_signature(SECRET.encode(),
                                                   headers["X-Webhook-Timestamp"], body)
    pretty = json.dumps(event, indent=2).encode()
    response = server.client.post("/webhooks/events", content=pretty, headers=headers)
    assert response.status_code == 401
    assert response.json()["error_code"] == "signature_invalid"
    assert server.client.get("/runs").json()["runs"] == []


def test_wrong_secret_and_missing_headers_are_refused(server: Server) -> None:
    assert server.post(make_event(), secret="not-the-secret").status_code == 401
    response = server.client.post("/webhooks/events", content=encode(make_event()))
    assert response.status_code == 401
    assert response.json() == {"status": "rejected", "error_code": "signature_missing",
                               "message": response.json()["message"]}


def test_standard_webhooks_headers_are_accepted(server_factory) -> None:  # type: ignore[no-untyped-def]
    secret = "whsec_YWdlbnRib3gtdmVjdG9yLWtleS0wMTIzNDU2Nzg5YWI="
    server = server_factory({"AGENTBOX_WEBHOOK_SECRET": f"old-secret,{secret}"}).start()
    import base64
    body = encode(make_event())
    ts = str(int(time.time()))
    sig = standard_signature(base64.b64decode(secret[6:]), "msg_1", ts, body)
    response = server.client.post("/webhooks/events", content=body, headers={
        "webhook-id": "msg_1", "webhook-timestamp": ts,
        "webhook-signature": f"v1,bm90LXRoaXMtb25l {sig}"})
    assert response.status_code == 202, response.text
    assert server.post(make_event(), secret="old-secret").status_code == 202  # rotation


def test_agent_failing_twice_then_succeeding(server: Server) -> None:
    run_id = server.post(make_event(project_id="fail-2")).json()["run_id"]
    run = server.wait_terminal(run_id)
    assert run["status"] == "succeeded"
    assert run["retry_count"] == 2
    history = server.client.get(f"/runs/{run_id}", params={"history": "1"}).json()
    assert [a["outcome"] for a in history["attempts"]] == [
        "failed_retryable", "failed_retryable", "succeeded"]


def test_agent_always_failing_is_dead_lettered(server: Server) -> None:
    run_id = server.post(make_event(project_id="always-fail")).json()["run_id"]
    run = server.wait_terminal(run_id)
    assert run["status"] == "dead_lettered"
    assert run["retry_count"] == 3  # AGENTBOX_MAX_RETRIES defaults to 3
    assert run["error_code"] == "agent_retryable_error"
    starts = [j for j in server.journal_lines() if j["run_id"] == run_id and j["kind"] == "start"]
    assert len(starts) == 4


def test_permanent_error_and_invalid_output(server: Server) -> None:
    permanent = server.post(make_event(project_id="permanent")).json()["run_id"]
    bad = server.post(make_event(project_id="bad-output")).json()["run_id"]
    assert server.wait_terminal(permanent)["error_code"] == "scripted_permanent"
    run = server.wait_terminal(bad)
    assert run["status"] == "failed_permanent"
    assert run["error_code"] == "invalid_agent_output"
    assert run["retry_count"] == 0


def test_replay_of_a_dead_letter_keeps_the_run_id(server: Server) -> None:
    run_id = server.post(make_event(project_id="always-fail")).json()["run_id"]
    server.wait_terminal(run_id)
    refused = server.anonymous.post(f"/runs/{run_id}/replay")
    assert refused.status_code == 401
    token = (server.home / "config" / "agentbox" / "admin_token").read_text().strip()
    response = server.client.post(f"/runs/{run_id}/replay",
                                  headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 202
    run = server.wait_terminal(run_id)
    assert run["run_id"] == run_id and run["status"] == "dead_lettered"
    assert run["replays"] == 1
    starts = [j for j in server.journal_lines() if j["run_id"] == run_id and j["kind"] == "start"]
    assert len(starts) == 8  # a fresh retry budget after the replay


def test_timeout_is_retried(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory({"AGENTBOX_RUN_TIMEOUT_SECONDS": "0.2",
                             "AGENTBOX_MAX_RETRIES": "1"}).start()
    run = server.wait_terminal(server.post(make_event(project_id="sleep-5")).json()["run_id"])
    assert run["status"] == "dead_lettered" and run["error_code"] == "timeout"
    assert run["retry_count"] == 1


def test_bad_input_gets_exact_codes_and_stores_nothing(server: Server) -> None:
    too_big = make_event(project_id="x" * 10)
    too_big["payload"]["mix_url"] = "/" + "m" * (1024 * 1024)
    assert server.post(too_big).status_code == 413
    invalid = make_event()
    invalid["payload"]["unexpected"] = 1
    response = server.post(invalid)
    assert response.status_code == 422
    assert response.json()["error_code"] == "invalid_event"
    assert ["payload", "unexpected"] in [e["loc"] for e in response.json()["errors"]]
    assert server.post(b"{not json").status_code == 422
    assert server.post(b"").status_code == 422
    naive = make_event(timestamp="2026-07-27T15:42:00")
    assert server.post(naive).status_code == 422
    wrong_key = make_event()
    wrong_key["idempotency_key"] = "other:key"
    assert server.post(wrong_key).status_code == 422
    assert server.post(make_event(event_type="nope.unknown")).status_code == 422
    assert server.post(make_event(schema_version="v2")).status_code == 422
    assert server.client.get("/runs").json()["runs"] == []
    assert server.client.get("/webhooks/events").status_code == 405
    missing = server.client.get("/runs/run_nope")
    assert missing.status_code == 404 and missing.json()["error_code"] == "run_not_found"


def test_callback_allowlist(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory({"AGENTBOX_CALLBACK_ALLOWED":
                             "https://studio.example,http://127.0.0.1:9000"}).start()

    def post(url: str) -> httpx.Response:
        return server.post(make_event(callback_url=url))

    assert post("https://studio.example/hooks").status_code == 202
    assert post("https://studio.example:443/x").status_code == 202
    assert post("http://127.0.0.1:9000/cb").status_code == 202
    for refused in ("https://evil.example/x", "http://studio.example/x",
                    "https://user:pw@studio.example/x", "http://127.0.0.1:9001/x",
                    "http://localhost:9000/x", "https://studio.example:8443/x"):
        response = post(refused)
        assert response.status_code == 403, refused
        assert response.json()["error_code"] == "callback_not_allowed"
    assert post("not a url").status_code == 422


def test_admission_limit_answers_429_with_retry_after(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory({"AGENTBOX_MAX_PENDING": "2"}).start()
    accepted = [server.post(make_event(project_id="sleep-1")) for _ in range(2)]
    assert [r.status_code for r in accepted] == [202, 202]
    refused = server.post(make_event(project_id="ok"))
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) > 0
    for r in accepted:
        server.wait_terminal(r.json()["run_id"])
    assert server.post(make_event()).status_code == 202


def test_several_agents_for_one_event_type(server_factory) -> None:  # type: ignore[no-untyped-def]
    agents = ("session.exported=tests.support.agents:scripted,"
              "session.exported=tests.support.agents:second")
    server = server_factory({"AGENTBOX_AGENTS": agents}).start()
    body = server.post(make_event(project_id="ok")).json()
    assert len(body["runs"]) == 2 and body["run_id"] == body["runs"][0]["run_id"]
    results = [server.wait_terminal(r["run_id"]) for r in body["runs"]]
    assert {r["agent"] for r in results} == {"tests.support.agents:scripted",
                                            "tests.support.agents:second"}
    assert all(r["status"] == "succeeded" for r in results)


@pytest.mark.slow  # agentbox serve subprocesses, without the fixture
def test_bad_configuration_refuses_to_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT
    for name, value in [("AGENTBOX_LEASE_SECONDS", "0"), ("AGENTBOX_MAX_RETRIES", "-1"),
                        ("AGENTBOX_RETRY_BASE_SECONDS", "soon"),
                        ("AGENTBOX_AGENTS", "session.exported=tests.support.agents:not_async"),
                        ("AGENTBOX_AGENTS", "session.exported=no.such.module:agent")]:
        result = subprocess.run(
            [sys.executable, "-m", "agentbox", "serve", "--port", "1"],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), name: value,
                 "XDG_CONFIG_HOME": str(tmp_path), "AGENTBOX_DATA_DIR": str(tmp_path / "d"),
                 "AGENTBOX_WEBHOOK_SECRET": "s3cr3t-value"},
            capture_output=True, text=True, timeout=30)
        assert result.returncode != 0
        assert "AGENTBOX_" in result.stderr, result.stderr
        assert "s3cr3t-value" not in result.stderr + result.stdout


@pytest.mark.slow  # agentbox serve subprocesses, without the fixture
def test_secret_is_generated_on_first_start_and_never_logged(tmp_path: Path) -> None:
    server = Server(tmp_path)
    del server.env["AGENTBOX_WEBHOOK_SECRET"]
    try:
        server.start()
        secret_file = tmp_path / "config" / "agentbox" / "webhook_secret"
        secret = secret_file.read_text().strip()
        assert len(secret) >= 32 and secret_file.stat().st_mode & 0o777 == 0o600
        assert server.post(make_event(), secret=secret).status_code == 202
        assert server.post(make_event(), secret=SECRET).status_code == 401
    finally:
        server.close()
    log = server.log_path.read_text()
    assert str(secret_file) in log
    assert secret not in log


def test_sigterm_lets_a_running_agent_finish(server: Server) -> None:
    run_id = server.post(make_event(project_id="sleep-0.5")).json()["run_id"]
    wait_until(lambda: server.run(run_id)["status"] == "processing", 10, "the run to start")
    # uvicorn re-raises SIGTERM once it has shut down cleanly, so -15 is a clean exit too.
    assert server.stop() in (0, -signal.SIGTERM)
    log = server.log_path.read_text()
    assert "waiting for running agents" in log and "agentbox stopped" in log
    server.start()
    run = server.wait_terminal(run_id, timeout=1)  # already terminal: no lease to wait for
    assert run["status"] == "succeeded" and run["retry_count"] == 0
    assert len([j for j in server.journal_lines() if j["kind"] == "start"]) == 1


def test_redelivery_after_the_ttl_is_a_new_run(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory({"AGENTBOX_IDEMPOTENCY_TTL_SECONDS": "0.5",
                             "AGENTBOX_MAINTENANCE_INTERVAL_SECONDS": "0.2"}).start()
    event = make_event(project_id="ok")
    first = server.post(event).json()["run_id"]
    assert server.post(event).status_code == 200
    time.sleep(0.6)  # the TTL itself is what is being tested: let it pass
    second = server.post(event)
    assert second.status_code == 202 and second.json()["run_id"] != first


def test_one_json_log_line_per_state_change(server: Server) -> None:
    run_id = server.post(make_event(project_id="fail-1")).json()["run_id"]
    server.wait_terminal(run_id)

    def changes() -> list[dict[str, object]]:
        lines = [json.loads(line) for line in server.log_path.read_text().splitlines()
                 if line.startswith("{")]
        return [line for line in lines if line.get("run_id") == run_id
                and line.get("msg") == "run state changed"]

    found = wait_until(lambda: len(changes()) == 4 and changes(), 5, "four log lines")
    assert [(c["status"], c["attempt"]) for c in found] == [
        ("processing", 1), ("failed_retryable", 1), ("processing", 2), ("succeeded", 2)]
    for line in found:
        for field in ("event_id", "event_type", "source", "agent", "ts"):
            assert line[field], field
    assert "duration_ms" in found[1] and "duration_ms" in found[3]
    assert SECRET not in server.log_path.read_text()


def test_a_bug_in_the_receiver_answers_500_and_says_so_in_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process, to plant the bug: the receiver serves its path outside Starlette's
    middleware, so it must answer a failure itself, as the app's other routes do."""
    def broken(body: bytes) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr("agentbox.http.receiver.parse_event", broken)
    app = create_app(in_process_settings(tmp_path), admin_token="t")
    body = encode(make_event())

    async def scenario() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return await client.post("/webhooks/events", content=body, headers={
                    "Content-Type": "application/json",
                    **sign_headers(SECRET, body, int(time.time()))})

    response = asyncio.run(scenario())
    assert response.status_code == 500
    assert response.json() == {"status": "rejected", "error_code": "internal_error",
                               "message": INTERNAL_ERROR_MESSAGE}
    assert "planted" not in response.text
    assert any(record.getMessage() == "unhandled error" and record.exc_info
               for record in caplog.records)


def raw_exchange(server: Server, head: bytes, body: bytes = b"",
                 expect_continue: bool = False) -> bytes:
    """One request on a raw socket; the whole answer (the server closes after it)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(head)
        if expect_continue:
            assert conn.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n")
        # A server that answers before reading all (a 413) may reset the connection
        # once it closes: what it answered is what counts.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            conn.sendall(body)
            while chunk := conn.recv(65536):
                answer += chunk
    return answer


def signed_head(body: bytes, *lines: str) -> bytes:
    headers = {"Host": "127.0.0.1", "Content-Type": "application/json", "Connection": "close",
               **sign_headers(SECRET, body, int(time.time()))}
    text = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"POST /webhooks/events HTTP/1.1\r\n{text}{''.join(lines)}\r\n".encode()


def test_chunked_bodies_and_expect_100_continue_are_read_like_any_other(
        server: Server) -> None:
    body = encode(make_event())
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 40]), body[i:i + 40])
                       for i in range(0, len(body), 40)) + b"0\r\n\r\n"
    answer = raw_exchange(server, signed_head(body, "Transfer-Encoding: chunked\r\n"), chunked)
    assert answer.startswith(b"HTTP/1.1 202 "), answer[:200]
    run_id = json.loads(answer.split(b"\r\n\r\n", 1)[1])["run_id"]
    assert server.wait_terminal(run_id)["status"] == "succeeded"

    body = encode(make_event())
    answer = raw_exchange(server, signed_head(body, "Expect: 100-continue\r\n",
                                              f"Content-Length: {len(body)}\r\n"),
                          body, expect_continue=True)
    assert answer.startswith(b"HTTP/1.1 202 "), answer[:200]

    # Streamed without a length, a body one byte over AGENTBOX_MAX_BODY_BYTES (1 MiB)
    # is refused as that byte arrives.
    big = b"1\r\n{\r\n" + b"%x\r\n%s\r\n" % (64 * 1024, b" " * 64 * 1024) * 16 + b"0\r\n\r\n"
    answer = raw_exchange(server, signed_head(b"{", "Transfer-Encoding: chunked\r\n"), big)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"error_code":"body_too_large"' in answer
