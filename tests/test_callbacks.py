"""Callbacks end to end: a real agentbox process delivers signed notifications from
its outbox to real receivers on 127.0.0.1 (tests/support/callback_receiver.py),
which check the signatures with their own code."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Server, make_event, wait_until
from tests.support.callback_receiver import CallbackReceiver

CALLBACK_SECRET = "whsec_Y2FsbGJhY2stdGVzdC1rZXktMDEyMzQ1Njc4OWFiY2RlZg=="
FAST_SCHEDULE = "0,0.05,0.05,0.05,0.05,0.05"


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    found = CallbackReceiver(CALLBACK_SECRET)
    yield found
    found.close()


@pytest.fixture
def start(server_factory: Callable[..., Server], receiver: CallbackReceiver
          ) -> Callable[..., Server]:
    def make(**env: str) -> Server:
        return server_factory({
            "AGENTBOX_CALLBACK_ALLOWED": receiver.origin,
            "AGENTBOX_CALLBACK_SECRET": CALLBACK_SECRET,
            "AGENTBOX_CALLBACK_RETRY_SCHEDULE": FAST_SCHEDULE,
            **env,
        }).start()
    return make


def post(server: Server, receiver: CallbackReceiver, path: str, project: str = "ok") -> str:
    response = server.post(make_event(project_id=project, callback_url=receiver.url(path)))
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def callbacks_of(server: Server, run_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = server.run(run_id)["callbacks"]
    return found


def wait_callbacks(server: Server, run_id: str, count: int, state: str, timeout: float = 20
                   ) -> list[dict[str, Any]]:
    def settled() -> list[dict[str, Any]] | None:
        found = callbacks_of(server, run_id)
        return found if len(found) == count and all(c["state"] == state for c in found) else None
    result: list[dict[str, Any]] = wait_until(
        settled, timeout, f"{count} callbacks of {run_id} to be {state}")
    return result


def wait_delivered(server: Server, receiver: CallbackReceiver, expected: set[str],
                   timeout: float = 60) -> None:
    try:
        wait_until(lambda: set(receiver.delivered_ids()) >= expected, timeout,
                   "every notification to be delivered after the restart")
    except AssertionError as exc:
        state = server.client.get("/callbacks", params={"limit": 500}).json()
        raise AssertionError(f"{exc}\noutbox: {json.dumps(state, indent=1)}\nlog:\n"
                             + server.log_path.read_text()[-5000:]) from None


def test_every_state_change_is_delivered_signed_and_in_order(
        start: Callable[..., Server], receiver: CallbackReceiver) -> None:
    server = start()
    run_id = post(server, receiver, "/ok", project="fail-1")
    expected = [f"{run_id}:processing:0", f"{run_id}:failed_retryable:0",
                f"{run_id}:processing:1", f"{run_id}:succeeded:1"]
    wait_until(lambda: receiver.delivered_ids() == expected, 20, "four callbacks in order")
    run = server.run(run_id)
    for got in receiver.delivered():
        body = got.body
        note = got.notification
        # compact JSON with sorted keys, exactly the pinned fields
        assert body == json.dumps(note, sort_keys=True, separators=(",", ":")).encode()
        assert sorted(note) == ["error_code", "event_id", "notification_id", "occurred_at",
                                "result", "retry_count", "run_id", "status"]
        assert note["run_id"] == run_id and note["event_id"] == run["event_id"]
        assert got.headers["webhook-id"] == note["notification_id"]
        assert got.headers["x-agent-timestamp"] == got.headers["webhook-timestamp"]
        assert abs(int(got.headers["x-agent-timestamp"]) - got.at) < 60
        assert got.headers["content-type"] == "application/json"
    notes = [r.notification for r in receiver.delivered()]
    assert [n["status"] for n in notes] == ["processing", "failed_retryable", "processing",
                                            "succeeded"]
    assert [n["retry_count"] for n in notes] == [0, 0, 1, 1]
    assert notes[1]["error_code"] == "agent_retryable_error"
    assert notes[3]["result"] == {"project_id": "fail-1", "attempt": 2}
    assert notes[3]["error_code"] is None
    shown = wait_callbacks(server, run_id, 4, "delivered")
    assert [c["notification_id"] for c in shown] == expected
    metrics = server.client.get("/metrics").text
    assert 'agentbox_callback_deliveries_total{outcome="delivered"} 4.0' in metrics
    assert all(c["attempts"] == 1 and c["last_error"] is None for c in shown)
    assert all(c["destination"] == receiver.origin for c in shown)


def test_a_failing_receiver_gets_the_notification_again_until_it_takes_it(
        start: Callable[..., Server], receiver: CallbackReceiver) -> None:
    server = start()
    run_id = post(server, receiver, "/fail-2")
    shown = wait_callbacks(server, run_id, 2, "delivered")
    assert all(c["attempts"] == 3 for c in shown)
    assert all(c["last_error"] == "http_500" and c["last_status_code"] == 200 for c in shown)
    first = f"{run_id}:processing:0"
    tries = [r for r in receiver.requests("/fail-2") if r.notification_id == first]
    assert [r.answered for r in tries] == [500, 500, 200]
    # The signature is made at each attempt: the timestamps need not repeat, but each verifies.
    assert all(r.answered != 401 for r in tries)
    # succeeded waited for processing to be delivered first
    assert receiver.delivered_ids() == [first, f"{run_id}:succeeded:0"]


def test_a_notification_that_exhausts_the_schedule_is_kept_as_a_dead_callback(
        start: Callable[..., Server], receiver: CallbackReceiver) -> None:
    server = start(AGENTBOX_CALLBACK_RETRY_SCHEDULE="0,0.05,0.05")
    run_id = post(server, receiver, "/status-500")
    shown = wait_callbacks(server, run_id, 2, "dead")
    assert all(c["attempts"] == 3 and c["last_error"] == "http_500" for c in shown)
    assert len(receiver.requests("/status-500")) == 6
    listed = server.client.get("/callbacks", params={"state": "dead"}).json()["callbacks"]
    assert {c["notification_id"] for c in listed} == {c["notification_id"] for c in shown}
    assert "scripted status" not in json.dumps(listed)  # bodies are never kept
    assert server.client.get("/callbacks", params={"state": "lost"}).status_code == 422


def test_redirects_are_not_followed(start: Callable[..., Server],
                                    receiver: CallbackReceiver) -> None:
    server = start(AGENTBOX_CALLBACK_RETRY_SCHEDULE="0,0.05")
    run_id = post(server, receiver, "/redirect")
    shown = wait_callbacks(server, run_id, 2, "dead")
    assert all(c["last_error"] == "http_302" for c in shown)
    assert receiver.requests("/ok") == []
    assert len(receiver.requests("/redirect")) == 4


def test_retry_after_on_429_is_honoured(start: Callable[..., Server],
                                        receiver: CallbackReceiver) -> None:
    # The schedule alone would try again after 0.1 s; the receiver asked for 2.
    server = start(AGENTBOX_CALLBACK_RETRY_SCHEDULE="0,0.1")
    run_id = post(server, receiver, "/retry-after-2")
    wait_callbacks(server, run_id, 2, "delivered", timeout=20)
    first = [r for r in receiver.requests() if r.notification_id == f"{run_id}:processing:0"]
    assert [r.answered for r in first] == [429, 200]
    waited = first[1].at - first[0].at
    assert 1.9 <= waited < 10, waited


def test_a_hanging_receiver_times_out(start: Callable[..., Server],
                                      receiver: CallbackReceiver) -> None:
    server = start(AGENTBOX_CALLBACK_TIMEOUT_SECONDS="0.3",
                   AGENTBOX_CALLBACK_RETRY_SCHEDULE="0,0.05")
    run_id = post(server, receiver, "/hang-2")
    shown = wait_callbacks(server, run_id, 2, "dead", timeout=30)
    assert all(c["last_error"] == "timeout" and c["last_status_code"] is None for c in shown)


def test_a_large_response_body_is_not_a_problem(start: Callable[..., Server],
                                                receiver: CallbackReceiver) -> None:
    server = start()
    run_id = post(server, receiver, "/big")
    wait_callbacks(server, run_id, 2, "delivered")


def test_410_pauses_the_destination_until_it_is_resumed(
        start: Callable[..., Server], receiver: CallbackReceiver, tmp_path: Path) -> None:
    server = start()
    gone = post(server, receiver, "/gone-once")
    wait_until(lambda: _destination(server, receiver.origin).get("state") == "paused", 20,
               "the destination to be paused")
    destination = _destination(server, receiver.origin)
    assert "410" in destination["paused_reason"]
    # Queued notifications wait, none is dropped: a new run's callbacks stay pending.
    waiting = post(server, receiver, "/ok")
    server.wait_terminal(waiting)
    wait_until(lambda: len(callbacks_of(server, waiting)) == 2, 10, "two queued notifications")
    assert all(c["state"] == "pending" for c in callbacks_of(server, gone) +
               callbacks_of(server, waiting))
    assert receiver.requests("/ok") == []
    # Resuming needs the admin token.
    refused = server.anonymous.post("/callbacks/destinations/resume",
                                    json={"destination": receiver.origin})
    assert refused.status_code == 401
    done = subprocess.run(
        [sys.executable, "-m", "agentbox", "callbacks", "resume", receiver.origin,
         "--url", server.url], env=server.env, cwd=ROOT, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 0, done.stderr
    assert "active" in done.stdout
    wait_callbacks(server, gone, 2, "delivered")
    wait_callbacks(server, waiting, 2, "delivered")
    assert receiver.delivered_ids("/gone-once")[0] == f"{gone}:processing:0"
    unknown = server.client.post(
        "/callbacks/destinations/resume", json={"destination": "https://nowhere.example"},
        headers={"Authorization": f"Bearer {_token(server)}"})
    assert unknown.status_code == 404


def test_a_destination_that_keeps_failing_is_paused(
        start: Callable[..., Server], receiver: CallbackReceiver) -> None:
    server = start(AGENTBOX_CALLBACK_PAUSE_AFTER_FAILURES="3",
                   AGENTBOX_CALLBACK_RETRY_SCHEDULE="0,0.05,0.05,0.05,0.05,0.05,0.05")
    run_id = post(server, receiver, "/flaky-3")
    wait_until(lambda: _destination(server, receiver.origin).get("state") == "paused", 20,
               "the destination to be paused")
    destination = _destination(server, receiver.origin)
    assert destination["consecutive_failures"] == 3
    assert destination["paused_reason"] == "3 failures in a row"
    (first,) = [c for c in callbacks_of(server, run_id) if c["status"] == "processing"]
    assert first["state"] == "pending" and first["attempts"] == 3
    response = server.client.post(
        "/callbacks/destinations/resume", json={"destination": receiver.origin},
        headers={"Authorization": f"Bearer {_token(server)}"})
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "active"
    wait_callbacks(server, run_id, 2, "delivered")
    assert _destination(server, receiver.origin)["consecutive_failures"] == 0


def test_undelivered_notifications_survive_kill_9(
        start: Callable[..., Server], receiver: CallbackReceiver) -> None:
    receiver.outage = True
    # Not paused by the outage (20 failures in a row, which a slow machine reaches
    # before the kill): this test is about the kill; pausing has its own tests.
    server = start(AGENTBOX_CALLBACK_RETRY_SCHEDULE="0" + ",0.2" * 50,
                   AGENTBOX_CALLBACK_PAUSE_AFTER_FAILURES="1000")
    run_ids = [post(server, receiver, "/ok") for _ in range(10)]
    for run_id in run_ids:
        server.wait_terminal(run_id)
    wait_until(lambda: all(len(callbacks_of(server, r)) == 2 for r in run_ids), 20,
               "every notification to be queued")
    wait_until(lambda: len(receiver.requests()) >= 10, 20, "deliveries to be failing")
    server.kill9()
    receiver.outage = False
    server.start()
    expected = {f"{r}:{s}:0" for r in run_ids for s in ("processing", "succeeded")}
    wait_delivered(server, receiver, expected)
    for run_id in run_ids:
        wait_callbacks(server, run_id, 2, "delivered")


def test_notifications_in_flight_at_kill_9_are_delivered_after_restart(
        start: Callable[..., Server], receiver: CallbackReceiver) -> None:
    server = start()
    run_ids = [post(server, receiver, "/hang-1") for _ in range(4)]
    wait_until(lambda: len(receiver.requests()) >= 1 or any(
        c["sending"] for r in run_ids for c in callbacks_of(server, r)), 20,
        "a delivery to be in flight")
    server.kill9()
    server.start()
    # A run cut short by the kill runs again as attempt 2: its notifications say so.
    expected = set()
    for run_id in run_ids:
        run = server.wait_terminal(run_id)
        retries = run["retry_count"]
        expected |= {f"{run_id}:processing:{n}" for n in range(retries + 1)}
        expected.add(f"{run_id}:succeeded:{retries}")
    wait_delivered(server, receiver, expected)
    assert {c["notification_id"] for r in run_ids for c in callbacks_of(server, r)} == expected


def test_events_without_a_callback_url_queue_nothing(start: Callable[..., Server],
                                                     receiver: CallbackReceiver) -> None:
    server = start()
    response = server.post(make_event(project_id="ok"))
    run = server.wait_terminal(response.json()["run_id"])
    assert server.run(run["run_id"])["callbacks"] == []
    assert server.client.get("/callbacks").json()["callbacks"] == []


def test_cli_verifies_a_captured_callback(start: Callable[..., Server],
                                          receiver: CallbackReceiver, tmp_path: Path) -> None:
    server = start()
    run_id = post(server, receiver, "/ok")
    wait_callbacks(server, run_id, 2, "delivered")
    got = receiver.delivered()[0]
    body_file = tmp_path / "body.json"
    body_file.write_bytes(got.body)

    def verify(*extra: str, body: Path = body_file) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentbox", "callbacks", "verify", str(body), *extra],
            env=server.env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    agent_headers = ["-H", f"X-Agent-Timestamp: {got.headers['x-agent-timestamp']}",
                     "-H", f"X-Agent-Signature: {got.headers['x-agent-signature']}"]
    ok = verify(*agent_headers)
    assert ok.returncode == 0, ok.stderr
    assert got.notification_id in ok.stdout
    standard = verify("-H", f"webhook-id: {got.headers['webhook-id']}",
                      "-H", f"webhook-timestamp: {got.headers['webhook-timestamp']}",
                      "-H", f"webhook-signature: {got.headers['webhook-signature']}")
    assert standard.returncode == 0, standard.stderr
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(got.body.replace(b"processing", b"succeeded"))
    bad = verify(*agent_headers, body=tampered)
    assert bad.returncode == 1 and "signature_invalid" in bad.stderr
    assert CALLBACK_SECRET not in bad.stderr + bad.stdout


def test_callback_secret_is_generated_in_standard_webhooks_form(
        server_factory: Callable[..., Server], receiver: CallbackReceiver) -> None:
    server = server_factory({"AGENTBOX_CALLBACK_ALLOWED": receiver.origin}).start()
    shown = subprocess.run([sys.executable, "-m", "agentbox", "secret", "--callback"],
                           env=server.env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    secret = shown.stdout.strip()
    assert secret.startswith("whsec_") and len(secret) > 40
    assert (server.home / "config" / "agentbox" / "callback_secret").read_text().strip() == secret
    assert secret not in server.log_path.read_text()
    receiver.secret = secret
    run_id = post(server, receiver, "/ok")
    wait_callbacks(server, run_id, 2, "delivered")


def _destination(server: Server, origin: str) -> dict[str, Any]:
    for found in server.client.get("/callbacks/destinations").json()["destinations"]:
        if found["destination"] == origin:
            return dict(found)
    return {}


def _token(server: Server) -> str:
    done = subprocess.run([sys.executable, "-m", "agentbox", "token"], env=server.env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done.stdout.strip()



def test_bad_input_to_the_callbacks_api_gets_clear_errors(
        start: Callable[..., Server], receiver: CallbackReceiver) -> None:
    server = start()
    for limit in ("\u00b9", "0", "501", "-1", "1" * 50, "x"):
        response = server.client.get("/callbacks", params={"limit": limit})
        assert response.status_code == 422, (limit, response.text)
        assert server.client.get("/runs", params={"limit": limit}).status_code == 422
    auth = {"Authorization": f"Bearer {_token(server)}"}
    for body in (b"", b"not json", b"[]", b'{"destination": 5}', b'{"other": 1}',
                 b'{"destination": "https://\\ud800.example"}', b"[" * 100_000,
                 b'{"destination": "' + b"x" * 10_000 + b'"}', b'{"destination": "garbage"}',
                 b'{"destination": "ftp://files.example"}', b'{"destination": "https://"}'):
        response = server.client.post("/callbacks/destinations/resume", content=body,
                                      headers=auth)
        assert response.status_code == 422, (body[:40], response.text)
        assert response.json()["error_code"] == "invalid_request"
    for url in ("https://bücher.example/cb", "https://ok.example/a\u0000",
                "https://ok.example/a\nb"):  # no control characters: NUL, newlines
        refused = server.post(make_event(callback_url=url))
        assert refused.status_code == 422, (url, refused.text)
        assert refused.json()["errors"][0]["loc"] == ["callback_url"]


def test_operator_alerts_for_dead_letters_and_paused_destinations(
        server_factory: Callable[..., Server], receiver: CallbackReceiver) -> None:
    operator = CallbackReceiver(CALLBACK_SECRET)
    try:
        server = server_factory({
            "AGENTBOX_CALLBACK_ALLOWED": f"{receiver.origin},{operator.origin}",
            "AGENTBOX_CALLBACK_SECRET": CALLBACK_SECRET,
            "AGENTBOX_CALLBACK_RETRY_SCHEDULE": FAST_SCHEDULE,
            "AGENTBOX_ALERT_URL": operator.url("/alerts"),
        }).start()
        dead = server.post(make_event(project_id="always-fail")).json()["run_id"]
        server.wait_terminal(dead, timeout=30)
        wait_until(lambda: operator.delivered("/alerts"), 20, "the dead-letter alert")
        alert = operator.delivered("/alerts")[0].notification
        assert alert["alert"] == "run_dead_lettered" and alert["run_id"] == dead
        assert alert["notification_id"] == f"alert:{dead}:dead_lettered:3"
        post(server, receiver, "/gone-once")  # pauses the callback destination
        wait_until(lambda: any(r.notification["alert"] == "callback_destination_paused"
                               for r in operator.delivered("/alerts")), 20, "the pause alert")
        paused = [r.notification for r in operator.delivered("/alerts")][-1]
        assert paused["destination"] == receiver.origin and "410" in paused["reason"]
    finally:
        operator.close()


def test_an_alert_url_outside_the_allowlist_refuses_to_start(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_ALERT_URL": "https://ops.example/hook"})
    with pytest.raises(AssertionError) as failed:
        server.start()
    assert "AGENTBOX_ALERT_URL" in str(failed.value)
