"""Subscriptions end to end: a real `agentbox serve` (uvicorn) and a real subscriber
HTTP server on 127.0.0.1. Deliveries are checked with agentbox.signing's own
Standard Webhooks verifier and the subscriber's secret; agents' subscription
changes survive a kill -9 and never land with a run that failed."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentbox.engine.subscriptions import Invalid, secret_of, topics_of
from agentbox.signing import SW_SIGNATURE_HEADER, SW_TIMESTAMP_HEADER, Verifier
from tests.conftest import Server, make_event, wait_until
from tests.support.callback_receiver import CallbackReceiver
from tests.support.subscriber import Request, Subscriber
from tests.test_callbacks import CALLBACK_SECRET

TOKEN = "subscriptions-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SUB_SECRET = "whsec_" + base64.b64encode(b"subscriber-secret-0123456789abcdef").decode()
TYPES = ["session.exported", "run.succeeded"]


@pytest.fixture
def subscriber() -> Iterator[Subscriber]:
    found = Subscriber()
    yield found
    found.close()


def settings_for(subscriber: Subscriber, **extra: str) -> dict[str, str]:
    return {"AGENTBOX_ADMIN_TOKEN": TOKEN,
            "AGENTBOX_SUBSCRIPTION_ALLOWED": subscriber.origin,
            "AGENTBOX_CALLBACK_RETRY_SCHEDULE": "0,1.2,1.2,1.2,1.2,1.2,1.2",
            "AGENTBOX_SUBSCRIPTION_SUSPEND_AFTER_FAILURES": "3",
            "AGENTBOX_SUBSCRIPTION_MIN_TTL_SECONDS": "0.5", **extra}


def subscribe(server: Server, url: str, types: list[str] | None = None,
              ttl_ms: int = 600_000) -> dict[str, Any]:
    response = server.client.post("/subscriptions", headers=AUTH, json={
        "url": url, "event_types": types or TYPES, "secret": SUB_SECRET, "ttl_ms": ttl_ms})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def listed(server: Server) -> dict[str, Any]:
    response = server.client.get("/subscriptions", headers=AUTH)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def state_of(server: Server, subscription_id: str) -> dict[str, Any] | None:
    found = [s for s in listed(server)["subscriptions"] if s["id"] == subscription_id]
    return found[0] if found else None


def signed_by_subscriber(request: Request) -> None:
    """Standard Webhooks, checked by agentbox.signing's verifier with the subscriber's
    secret (raises SignatureError otherwise)."""
    Verifier([SUB_SECRET], 300).verify(request.headers, request.body, time.time())


def deliveries(subscriber: Subscriber, path: str) -> Callable[[], list[Request]]:
    return lambda: subscriber.received(path, verification=False)


# -- the API --------------------------------------------------------------------------------


def test_the_api_needs_the_admin_token_and_refuses_each_bad_field(
        server_factory: Callable[..., Server], subscriber: Subscriber) -> None:
    server = server_factory(settings_for(subscriber)).start()
    good = {"url": subscriber.url("/echo"), "event_types": TYPES, "secret": SUB_SECRET,
            "ttl_ms": 60_000}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        client = server.anonymous  # not the server's user
        assert client.post("/subscriptions", json=good, headers=headers).status_code == 401
        assert client.get("/subscriptions", headers=headers).status_code == 401
        assert client.delete("/subscriptions/sub_x", headers=headers).status_code == 401
        assert client.post("/subscriptions/sub_x/refresh", headers=headers).status_code == 401
    unlisted = f"http://127.0.0.1:{subscriber.port + 1 if subscriber.port < 65535 else 1}/h"
    cases = [
        ({"url": "http://studio.example/hook"}, "url_not_allowed"),  # http, not loopback
        ({"url": unlisted}, "url_not_allowed"),  # loopback, not listed
        ({"url": "https://127.0.0.1/hook"}, "url_not_allowed"),
        ({"url": "https://10.0.0.1/hook"}, "url_not_allowed"),  # a private address, written out
        ({"url": "https://[fd00::1]/hook"}, "url_not_allowed"),
        ({"url": "https://user:pw@studio.example/h"}, "url_not_allowed"),
        ({"url": "ftp://studio.example/h"}, "invalid_url"),
        ({"url": 7}, "invalid_url"),
        ({"event_types": []}, "invalid_event_types"),
        ({"event_types": ["nope.never"]}, "invalid_event_types"),
        ({"event_types": ["run.finished"]}, "invalid_event_types"),
        ({"secret": "not-a-whsec-secret"}, "invalid_secret"),
        ({"secret": "whsec_!!!notbase64!!!"}, "invalid_secret"),
        ({"secret": "whsec_" + base64.b64encode(b"short").decode()}, "invalid_secret"),
        ({"ttl_ms": 0}, "invalid_ttl"), ({"ttl_ms": "60000"}, "invalid_ttl"),
        ({"ttl_ms": True}, "invalid_ttl"),
        ({"extra": 1}, "invalid_request"),
    ]
    for change, code in cases:
        response = server.client.post("/subscriptions", headers=AUTH, json={**good, **change})
        assert (response.status_code, response.json()["error_code"]) == (422, code), change
        assert SUB_SECRET not in response.text
        if "secret" in change:
            assert str(change["secret"]).removeprefix("whsec_") not in response.text
    for raw in (b"[1]", b"{", b"x" * 5000):
        response = server.client.post("/subscriptions", headers=AUTH, content=raw)
        assert (response.status_code, response.json()["error_code"]) == (422, "invalid_request")
    created = server.client.post("/subscriptions", headers=AUTH, json=good)
    assert created.status_code == 201
    body = created.json()
    for raw in (b"{", b"[1]", b"x" * 5000):  # a refresh's own words, not the create's
        broken = server.client.post(f"/subscriptions/{body['id']}/refresh", headers=AUTH,
                                    content=raw)
        assert (broken.status_code, broken.json()["error_code"]) == (422, "invalid_request")
        assert broken.json()["message"].startswith("A refresh takes"), broken.text
        assert "event_types" not in broken.json()["message"]
    extra = server.client.post(f"/subscriptions/{body['id']}/refresh", headers=AUTH,
                               json={"ttl_ms": 60_000, "url": "x"})
    assert extra.json()["message"] == "unknown fields: url; a refresh takes only ttl_ms."
    assert body["id"].startswith("sub_") and body["refresh_before"] < body["expires_at"]
    assert body["state"] == "pending_verification" and body["ttl_ms"] == 60_000
    assert SUB_SECRET not in created.text and SUB_SECRET[6:] not in created.text
    assert SUB_SECRET not in server.client.get("/subscriptions", headers=AUTH).text
    assert server.client.post("/subscriptions", headers=AUTH, json={
        **good, "ttl_ms": 10 ** 12}).json()["ttl_ms"] == 86_400_000  # kept within the bound
    assert server.client.delete(f"/subscriptions/{body['id']}", headers=AUTH).status_code == 204
    missing = server.client.delete(f"/subscriptions/{body['id']}", headers=AUTH)
    assert (missing.status_code, missing.json()["error_code"]) == (404, "subscription_not_found")
    assert server.client.post(f"/subscriptions/{body['id']}/refresh",
                              headers=AUTH).status_code == 404
    assert SUB_SECRET not in server.log_path.read_text()


# -- verification, delivery, signatures -------------------------------------------------------


def test_verified_subscribers_get_signed_events_and_the_others_nothing(
        server_factory: Callable[..., Server], subscriber: Subscriber) -> None:
    server = server_factory(settings_for(subscriber)).start()
    good = subscribe(server, subscriber.url("/echo"))
    wrong = subscribe(server, subscriber.url("/wrong"))
    redirected = subscribe(server, subscriber.url("/redirect"))
    (challenge,) = wait_until(lambda: subscriber.received("/echo", verification=True), 10,
                              "the verification challenge")
    signed_by_subscriber(challenge)
    assert challenge.headers["x-subscription-id"] == good["id"]
    assert set(challenge.document) == {"type", "challenge", "subscription_id"}
    wait_until(lambda: state_of(server, good["id"])["state"] == "active",  # type: ignore[index]
               10, "the subscription to be verified")

    response = server.post(make_event(project_id="ok"))
    assert response.status_code == 202
    run_id = response.json()["run_id"]
    server.wait_terminal(run_id)
    got = wait_until(lambda: len(deliveries(subscriber, "/echo")()) >= 2 and
                     deliveries(subscriber, "/echo")(), 10, "the event and run.succeeded")
    by_type = {r.document["type"]: r for r in got}
    assert set(by_type) == {"event", "run.succeeded"}
    for request in got:
        signed_by_subscriber(request)
        assert request.headers["x-subscription-id"] == good["id"]
        assert request.headers["webhook-id"] == request.document["notification_id"]
        assert "x-agent-signature" not in request.headers  # not the callbacks' secret
    event = by_type["event"].document
    assert (event["event_type"], event["run_ids"], event["event"]["payload"]["project_id"]) == (
        "session.exported", [run_id], "ok")
    assert by_type["run.succeeded"].document["run_id"] == run_id

    # A wrong echo never gets anything but challenges; it is suspended after 3.
    wait_until(lambda: state_of(server, wrong["id"])["state"] == "suspended",  # type: ignore[index]
               20, "the wrong echo to be suspended")
    assert state_of(server, wrong["id"])["last_error"] == "challenge_mismatch"  # type: ignore[index]
    assert len(subscriber.received("/wrong", verification=True)) == 3
    assert subscriber.received("/wrong", verification=False) == []
    # A redirect is an answer that is not 2xx: never followed, never verified.
    assert all(r.answered == 302 for r in subscriber.received("/redirect"))
    assert state_of(server, redirected["id"])["last_error"] == "http_302"  # type: ignore[index]
    assert len(subscriber.received("/echo")) == 3  # the one challenge and two deliveries
    shown = server.client.get("/subscriptions", headers=AUTH).text
    assert SUB_SECRET not in shown and SUB_SECRET not in server.log_path.read_text()
    page = server.client.get("/ui/callbacks").text  # the operator's page
    assert good["id"] in page and wrong["id"] in page and good["secret_hint"] in page
    assert SUB_SECRET not in page and SUB_SECRET[6:] not in page

    # Deleted: the next event and run owe it nothing.
    assert server.client.delete(f"/subscriptions/{good['id']}", headers=AUTH).status_code == 204
    after = server.post(make_event(project_id="ok")).json()["run_id"]
    server.wait_terminal(after)
    pending = server.client.get("/callbacks", params={"state": "pending"}).json()["callbacks"]
    assert not [c for c in pending if c["destination"] == f"subscription:{good['id']}"]
    assert len(deliveries(subscriber, "/echo")()) == 2


def test_retries_carry_a_fresh_timestamp_and_failures_suspend_until_a_refresh(
        server_factory: Callable[..., Server], subscriber: Subscriber) -> None:
    server = server_factory(settings_for(subscriber)).start()
    sub = subscribe(server, subscriber.url("/fail-1"), ["run.succeeded"])
    wait_until(lambda: state_of(server, sub["id"])["state"] == "active",  # type: ignore[index]
               10, "the subscription to be verified")
    server.wait_terminal(server.post(make_event(project_id="ok")).json()["run_id"])
    first, retry = wait_until(lambda: len(deliveries(subscriber, "/fail-1")()) >= 2 and
                              deliveries(subscriber, "/fail-1")(), 10, "a retried delivery")
    assert (first.answered, retry.answered) == (500, 200)
    assert first.headers["webhook-id"] == retry.headers["webhook-id"]
    assert int(retry.headers[SW_TIMESTAMP_HEADER]) > int(first.headers[SW_TIMESTAMP_HEADER])
    assert retry.headers[SW_SIGNATURE_HEADER] != first.headers[SW_SIGNATURE_HEADER]
    signed_by_subscriber(retry)

    subscriber.failing = True  # every delivery now fails: 3 in a row suspend it
    for _ in range(3):
        server.wait_terminal(server.post(make_event(project_id="ok")).json()["run_id"])
    wait_until(lambda: state_of(server, sub["id"])["state"] == "suspended",  # type: ignore[index]
               20, "the subscription to be suspended")
    view = state_of(server, sub["id"])
    assert view is not None and view["last_error"] == "http_500" and view["pending"] >= 3
    subscriber.failing = False
    seen = len(deliveries(subscriber, "/fail-1")())
    refreshed = server.client.post(f"/subscriptions/{sub['id']}/refresh", headers=AUTH,
                                   json={"ttl_ms": 600_000})
    assert refreshed.status_code == 200 and refreshed.json()["state"] == "pending_verification"
    # Verified again, what queued while it was suspended goes out.
    wait_until(lambda: state_of(server, sub["id"])["pending"] == 0,  # type: ignore[index]
               20, "the queue to drain after the refresh")
    assert len(deliveries(subscriber, "/fail-1")()) >= seen + 3
    again = server.client.post(f"/subscriptions/{sub['id']}/refresh", headers=AUTH,
                               json={"ttl_ms": 600_000})
    assert again.status_code == 200 and again.json()["state"] == "active"  # idempotent


def test_a_suspended_subscription_is_told_to_the_operator_as_one_its_refresh_resumes(
        server_factory: Callable[..., Server], subscriber: Subscriber) -> None:
    """Suspended by failed verifications or by failed deliveries: the operator's alert
    (the signed POST, the log line, the page's banner) says the subscriber's refresh
    resumes it, not `agentbox callbacks resume`, which refuses it and says the same."""
    operator = CallbackReceiver(CALLBACK_SECRET)
    try:
        server = server_factory(settings_for(
            subscriber, AGENTBOX_ALERT_URL=operator.url("/alerts"),
            AGENTBOX_CALLBACK_ALLOWED=operator.origin,
            AGENTBOX_CALLBACK_SECRET=CALLBACK_SECRET)).start()
        wrong = subscribe(server, subscriber.url("/wrong"), ["run.succeeded"])
        failing = subscribe(server, subscriber.url("/echo"), ["run.succeeded"])
        wait_until(lambda: state_of(server, failing["id"])["state"] == "active",  # type: ignore[index]
                   10, "the subscription to be verified")
        subscriber.failing = True
        for _ in range(3):
            server.wait_terminal(server.post(make_event(project_id="ok")).json()["run_id"])
        def suspended() -> bool:
            return all((state_of(server, sub["id"]) or {}).get("state") == "suspended"
                       for sub in (wrong, failing))
        wait_until(suspended, 20, "both subscriptions to be suspended")

        def alerts() -> dict[str, dict[str, Any]]:
            return {r.notification.get("subscription_id", ""): r.notification
                    for r in operator.delivered("/alerts")}
        told = wait_until(lambda: {wrong["id"], failing["id"]} <= set(alerts()) and alerts(),
                          20, "an alert for each suspended subscription")
        for sub in (wrong, failing):
            alert = told[sub["id"]]
            assert alert["alert"] == "callback_destination_paused"
            assert alert["destination"] == f"subscription:{sub['id']}"
            assert f"POST /subscriptions/{sub['id']}/refresh" in alert["resume"]
            assert "callbacks resume" not in alert["resume"]
        assert "verification failed: challenge_mismatch" in told[wrong["id"]]["reason"]
        assert "3 failures in a row" in told[failing["id"]]["reason"]

        log = server.log_path.read_text()
        for sub in (wrong, failing):
            (line,) = [line for line in log.splitlines()
                       if f"ALERT: subscription {sub['id']} suspended" in line]
            assert f"POST /subscriptions/{sub['id']}/refresh" in line
        page = server.client.get("/ui/runs").text  # the operations area's banner
        assert "2 subscription(s) suspended" in page
        assert "POST /subscriptions/{id}/refresh" in page
        assert "callback destination(s) paused" not in page
        refused = server.client.post("/callbacks/destinations/resume", headers=AUTH,
                                     json={"destination": f"subscription:{failing['id']}"})
        assert (refused.status_code, refused.json()["error_code"]) == (422, "invalid_request")
        assert f"POST /subscriptions/{failing['id']}/refresh" in refused.json()["message"]
    finally:
        operator.close()


def test_an_expired_subscription_stops(server_factory: Callable[..., Server],
                                       subscriber: Subscriber) -> None:
    server = server_factory(settings_for(subscriber)).start()
    sub = subscribe(server, subscriber.url("/echo"), ["run.succeeded"], ttl_ms=2500)
    wait_until(lambda: state_of(server, sub["id"])["state"] in ("active", "expired"),  # type: ignore[index]
               10, "the subscription to be verified")
    wait_until(lambda: state_of(server, sub["id"])["state"] == "expired",  # type: ignore[index]
               10, "the subscription to expire")
    server.wait_terminal(server.post(make_event(project_id="ok")).json()["run_id"])
    assert deliveries(subscriber, "/echo")() == []
    assert state_of(server, sub["id"])["pending"] == 0  # type: ignore[index]
    refused = server.client.post(f"/subscriptions/{sub['id']}/refresh", headers=AUTH)
    assert refused.status_code == 404


# -- agents -----------------------------------------------------------------------------------

AGENTS = ("session.exported=tests.support.agents:scripted,"
          "session.exported=tests.support.agents:subscribing")
SUBSCRIBING = "tests.support.agents:subscribing"


def agents_of_event(server: Server, project: str) -> list[str]:
    response = server.post(make_event(project_id=project))
    assert response.status_code == 202, response.text
    for run in response.json()["runs"]:
        server.wait_terminal(run["run_id"])
    return sorted(run["agent"] for run in response.json()["runs"])


def test_an_agent_unsubscribes_durably_and_only_with_a_success(
        server_factory: Callable[..., Server], subscriber: Subscriber) -> None:
    server = server_factory(settings_for(subscriber, AGENTBOX_AGENTS=AGENTS,
                                         AGENTBOX_MAX_RETRIES="1")).start()
    both = sorted(["tests.support.agents:scripted", SUBSCRIBING])
    assert agents_of_event(server, "unsubscribe-then-fail") == both  # its run dead-letters
    assert agents_of_event(server, "ok") == both  # so nothing changed
    (mine,) = [a for a in listed(server)["agents"] if a["agent"] == SUBSCRIBING]
    assert mine["event_types"] == ["session.exported"] and mine["changes"] == []

    assert agents_of_event(server, "unsubscribe") == both
    (mine,) = [a for a in listed(server)["agents"] if a["agent"] == SUBSCRIBING]
    assert mine["event_types"] == []
    assert [c["subscribed"] for c in mine["changes"]] == [False]
    assert "unsubscribed from session.exported" in server.client.get("/ui/callbacks").text
    server.kill9()
    server.start()
    assert agents_of_event(server, "ok") == ["tests.support.agents:scripted"]
    (mine,) = [a for a in listed(server)["agents"] if a["agent"] == SUBSCRIBING]
    assert mine["event_types"] == []


# -- the parsers --------------------------------------------------------------------------------


@given(st.binary(min_size=0, max_size=80))
def test_a_secret_is_a_whsec_of_24_to_64_bytes_and_never_echoed(key: bytes) -> None:
    secret = "whsec_" + base64.b64encode(key).decode()
    if 24 <= len(key) <= 64:
        assert secret_of(secret) == secret
    else:
        with pytest.raises(Invalid) as refused:
            secret_of(secret)
        assert secret[6:] not in refused.value.message or not key


@given(st.lists(st.text(max_size=30), max_size=5))
def test_topics_are_known_event_types_or_run_states(values: list[str]) -> None:
    known = {"session.exported", "mix.review_requested", "run.succeeded", "run.processing",
             "run.failed_retryable", "run.failed_permanent",
             "run.dead_lettered"}
    if values and all(v in known for v in values):
        assert topics_of(values) == sorted(set(values))
    elif any(v not in known for v in values) or not values:
        with pytest.raises(Invalid):
            topics_of(values)
