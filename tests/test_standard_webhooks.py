"""agentbox driven with the Standard Webhooks reference library (`standardwebhooks`, the
standard-webhooks project's own Python package), against a real server: events signed
with it are accepted for every active webhook secret, and callbacks and subscription
deliveries verify with it for every active secret."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.conftest import Server, encode, make_event, wait_until
from tests.support.callback_receiver import CallbackReceiver
from tests.support.subscriber import Subscriber
from tests.test_subscriptions import AUTH, SUB_SECRET, TOKEN

# Two webhook secrets in rotation: one in the standard's form, one from before it.
WEBHOOK_SECRETS = ("whsec_" + base64.b64encode(b"w" * 32).decode(), "plain-text-old-secret")
CALLBACK_SECRETS = tuple("whsec_" + base64.b64encode(bytes([i]) * 32).decode() for i in (7, 9))


def library(secret: str) -> Webhook:
    """The library with a secret as the docs tell a sender to hand it over: a whsec_
    secret as it is, a plain one as its bytes (the HMAC key is its text)."""
    return Webhook(secret) if secret.startswith("whsec_") else Webhook(secret.encode())


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    found = CallbackReceiver(CALLBACK_SECRETS[0])  # the current secret: it answers 2xx
    yield found
    found.close()


@pytest.fixture
def subscriber() -> Iterator[Subscriber]:
    found = Subscriber()
    yield found
    found.close()


@pytest.fixture
def rotating(server_factory: Callable[..., Server], receiver: CallbackReceiver,
             subscriber: Subscriber) -> Server:
    return server_factory({
        "AGENTBOX_WEBHOOK_SECRET": ",".join(WEBHOOK_SECRETS),
        "AGENTBOX_CALLBACK_SECRET": ",".join(CALLBACK_SECRETS),
        "AGENTBOX_CALLBACK_ALLOWED": receiver.origin,
        "AGENTBOX_SUBSCRIPTION_ALLOWED": subscriber.origin,
        "AGENTBOX_ADMIN_TOKEN": TOKEN,
    }).start()


def send_standard(server: Server, secret: str, event: dict[str, object]) -> str:
    body = encode(event)
    msg_id = f"msg_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    response = server.client.post("/webhooks/events", content=body, headers={
        "Content-Type": "application/json", "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": library(secret).sign(msg_id, now, body)})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def test_events_signed_by_the_library_with_every_active_secret_are_accepted(
        rotating: Server, receiver: CallbackReceiver) -> None:
    for secret in WEBHOOK_SECRETS:
        run_id = send_standard(rotating, secret, make_event(callback_url=receiver.url("/ok")))
        assert rotating.wait_terminal(run_id)["status"] == "succeeded"
    wrong = "whsec_" + base64.b64encode(b"x" * 32).decode()
    body = encode(make_event())
    now = datetime.now(UTC)
    refused = rotating.client.post("/webhooks/events", content=body, headers={
        "Content-Type": "application/json", "webhook-id": "m", "webhook-timestamp":
        str(int(now.timestamp())), "webhook-signature": library(wrong).sign("m", now, body)})
    assert refused.status_code == 401 and refused.json()["error_code"] == "signature_invalid"


def test_callbacks_verify_with_the_library_for_every_active_callback_secret(
        rotating: Server, receiver: CallbackReceiver) -> None:
    run_id = send_standard(rotating, WEBHOOK_SECRETS[0],
                           make_event(callback_url=receiver.url("/ok")))
    rotating.wait_terminal(run_id)
    delivered = wait_until(lambda: [r for r in receiver.delivered("/ok")
                                    if r.notification["status"] == "succeeded"], 20,
                           "the succeeded callback")
    for request in receiver.delivered("/ok"):
        for secret in CALLBACK_SECRETS:
            note = library(secret).verify(request.body, request.headers)
            assert note["run_id"] == run_id
        with pytest.raises(WebhookVerificationError):
            library("whsec_" + base64.b64encode(b"z" * 32).decode()).verify(
                request.body, request.headers)
    assert delivered


def test_subscription_deliveries_verify_with_the_library(
        rotating: Server, subscriber: Subscriber) -> None:
    created = rotating.client.post("/subscriptions", headers=AUTH, json={
        "url": subscriber.url("/echo"), "event_types": ["session.exported"],
        "secret": SUB_SECRET, "ttl_ms": 600_000})
    assert created.status_code == 201, created.text
    wait_until(lambda: subscriber.received("/echo", verification=True), 20,
               "the verification request")
    wait_until(lambda: next(s for s in rotating.client.get(
        "/subscriptions", headers=AUTH).json()["subscriptions"])["state"] == "active", 20,
        "the subscription to be active")
    send_standard(rotating, WEBHOOK_SECRETS[1], make_event(event_id=f"sub-{time.time_ns()}"))
    wait_until(lambda: subscriber.received("/echo", verification=False), 20, "a delivery")
    for request in subscriber.received("/echo"):
        document = library(SUB_SECRET).verify(request.body, request.headers)
        assert document["type"] in ("subscription.verification", "event")


def test_generated_and_rotated_secrets_work_with_the_library(
        server_factory: Callable[..., Server]) -> None:
    """`agentbox serve` makes the webhook secret, `agentbox secret rotate` a second one:
    both are in the standard's form, and events the library signs with each are taken
    while they are active."""
    server = server_factory()
    del server.env["AGENTBOX_WEBHOOK_SECRET"]
    server.start()

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "agentbox", "secret", *args],
                              env=server.env, capture_output=True, text=True, timeout=60,
                              check=True)
        return done.stdout.strip()

    first = cli()
    cli("rotate")
    second = cli()
    assert first != second
    for secret in (first, second):
        assert secret.startswith("whsec_") and len(Webhook(secret)._whsecret) == 32
    # The receiver reads the secret file again when it changes (no restart).
    wait_until(lambda: server.client.post("/webhooks/events").status_code == 401
               and _accepted(server, second), 20, "the rotated secret to verify")
    assert _accepted(server, first)


def _accepted(server: Server, secret: str) -> bool:
    body = encode(make_event(event_id=f"gen-{time.time_ns()}"))
    now = datetime.now(UTC)
    response = server.client.post("/webhooks/events", content=body, headers={
        "Content-Type": "application/json", "webhook-id": "m1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign("m1", now, body)})
    return response.status_code == 202


def test_svix_header_names_are_accepted_and_the_senders_id_is_kept(server: Server) -> None:
    """Svix's libraries sign as Standard Webhooks under svix-* names (refused as
    signature_missing before); the sender's own id is stored with the event, shown as
    the run's webhook_id (null for a sender that sent none) and logged."""
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    server.stop()
    server.env["AGENTBOX_WEBHOOK_SECRET"] = secret
    server.start()
    body = encode(make_event())
    msg_id = f"msg_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    answer = server.client.post("/webhooks/events", content=body, headers={
        "Content-Type": "application/json", "svix-id": msg_id,
        "svix-timestamp": str(int(now.timestamp())),
        "svix-signature": library(secret).sign(msg_id, now, body)})
    assert answer.status_code == 202, answer.text
    run = server.run(answer.json()["run_id"])
    assert run["webhook_id"] == msg_id
    plain = server.post(make_event(), secret=secret)  # agentbox's hex scheme: no id
    assert server.run(plain.json()["run_id"])["webhook_id"] is None
    wait_until(lambda: f'"webhook_id": "{msg_id}"' in server.log_path.read_text(), 10,
               "the accepted event's line with the sender's id")


def test_either_complete_header_set_verifies_as_the_svix_library_signs_it(
        server: Server) -> None:
    """The Svix library's own signer, its svix-* set beside a wrong webhook-* set (a
    proxy's, a second signer's): taken, as the Svix libraries read svix-* first (it
    was 401: webhook-* decided). The other way round too; the id of the set that
    verified is the run's webhook_id; both within the same replay window."""
    from svix.webhooks import Webhook as SvixWebhook

    secret = "whsec_" + base64.b64encode(b"x" * 32).decode()
    server.stop()
    server.env["AGENTBOX_WEBHOOK_SECRET"] = secret
    server.start()
    now = datetime.now(UTC)

    def sets(body: bytes, good: str, at: datetime = now) -> dict[str, str]:
        stamp = str(int(at.timestamp()))
        signed = SvixWebhook(secret).sign(f"msg_{good}", at, body.decode())
        wrong = Webhook("whsec_" + base64.b64encode(b"y" * 32).decode()).sign(
            "msg_other", at, body)
        named = {"svix": signed, "webhook": wrong} if good == "svix" else {
            "webhook": signed, "svix": wrong}
        return {"Content-Type": "application/json",
                **{f"{p}-id": f"msg_{good}" if p == good else "msg_other" for p in named},
                **{f"{p}-timestamp": stamp for p in named},
                **{f"{p}-signature": sig for p, sig in named.items()}}

    for good in ("svix", "webhook"):
        body = encode(make_event())
        answer = server.client.post("/webhooks/events", content=body,
                                    headers=sets(body, good))
        assert answer.status_code == 202, (good, answer.text)
        assert server.run(answer.json()["run_id"])["webhook_id"] == f"msg_{good}"
    body = encode(make_event())
    stale = server.client.post("/webhooks/events", content=body, headers=sets(
        body, "svix", datetime.fromtimestamp(now.timestamp() - 3600, UTC)))
    assert stale.status_code == 401 and stale.json()["error_code"] == "signature_expired"
    neither = {**sets(body, "svix"), "svix-signature": "v1,AAAA"}
    refused = server.client.post("/webhooks/events", content=body, headers=neither)
    assert refused.status_code == 401 and refused.json()["error_code"] == "signature_invalid"
