"""The OpenAPI document against a real agentbox server: Schemathesis with all its
checks finds nothing (valid and invalid requests, every answer as documented), and
the document describes the contract, the fields of a run and what agentbox sends
(callbacks, subscription deliveries) as its webhooks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, SECRET, InProcess, Server, make_event
from tests.support.callback_receiver import CallbackReceiver
from tests.test_callbacks import CALLBACK_SECRET, receiver

__all__ = ["receiver"]  # the callback receiver fixture, shared with test_callbacks
SUPPORT = Path(__file__).parent / "support"
TOKEN = "schemathesis-admin-token"
EXAMPLES = 25  # per operation and phase: the run stays within a minute or two
MAX_SECONDS = 240  # a bound, not an expectation (about half a minute here)


@pytest.mark.timeout(MAX_SECONDS + 60)
def test_schemathesis_finds_nothing_with_all_its_checks(server_factory: Any) -> None:
    """Schemathesis's own CLI, every check (status codes, content types, bodies and
    headers as documented, positive data accepted, negative data refused, the Allow
    header, missing auth refused, ...), every phase (examples, coverage, fuzzing,
    stateful), positive and negative data, against a real server. The receiver's
    requests are signed by tests/support/schemathesis_hooks.py; what JSON Schema cannot
    say is listed in tests/support/schemathesis.toml."""
    server = server_factory({"AGENTBOX_ADMIN_TOKEN": TOKEN}).start()
    st = Path(sys.executable).with_name("st")  # Schemathesis's CLI, beside this Python
    run = subprocess.run(
        [str(st), "--no-color", "--config-file", str(SUPPORT / "schemathesis.toml"), "run",
         server.url + "/openapi.json", "--checks", "all", "--max-examples", str(EXAMPLES),
         "--header", f"Authorization: Bearer {TOKEN}", "--request-timeout", "20"],
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
             "AGENTBOX_TEST_SIGNING_SECRET": SECRET},
        capture_output=True, text=True, timeout=MAX_SECONDS + 120, cwd=server.home)
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert "passed" in report and " failed" not in report.split("SUMMARY")[-1], report
    stored = server.client.get("/metrics").text  # the example event went through
    assert 'agentbox_events_accepted_total{event_type="session.exported"}' in stored


def test_the_document_describes_the_contract(server: Server) -> None:
    document = server.client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    envelope = document["components"]["schemas"]["Envelope"]
    assert "idempotency_key" in envelope["required"]
    assert envelope.get("additionalProperties") is False
    assert set(document["paths"]) >= {"/webhooks/events", "/runs", "/runs/{run_id}",
                                      "/runs/{run_id}/replay", "/runs/{run_id}/audio",
                                      "/healthz"}


def test_every_field_a_run_answers_with_is_documented_and_none_is_missing(
        server_factory: Any, receiver: CallbackReceiver) -> None:
    """The run views are the models the document is generated from: a real run with a
    callback, an attempt and a state change shows exactly the documented fields."""
    server = server_factory({"AGENTBOX_CALLBACK_ALLOWED": receiver.origin,
                             "AGENTBOX_CALLBACK_SECRET": CALLBACK_SECRET}).start()
    response = server.post(make_event(callback_url=receiver.url("/hook")))
    assert response.status_code == 202, response.text
    run_id = response.json()["run_id"]
    server.wait_terminal(run_id)
    schemas = server.client.get("/openapi.json").json()["components"]["schemas"]

    def documented(model: str) -> set[str]:
        return set(schemas[model]["properties"])

    full = server.client.get(f"/runs/{run_id}", params={"history": "1"}).json()
    assert set(full) == documented("RunDetail")
    for field, model in (("callbacks", "NotificationView"), ("attempts", "AttemptView"),
                         ("history", "HistoryEntry")):
        assert full[field], field  # one at least, so that its fields are checked
        assert all(set(item) == documented(model) for item in full[field]), field
    plain = server.client.get(f"/runs/{run_id}").json()
    assert set(plain) == documented("RunDetail") - {"attempts", "history"}
    listed = server.client.get("/runs").json()["runs"]
    assert listed and all(set(run) == documented("RunView") for run in listed)
    assert documented("RunView") == documented("RunDetail") - {"callbacks", "attempts",
                                                               "history", "body_removed_at"}
    assert full["body_removed_at"] is None  # retention has not removed its body
    assert full["project"] == "ok"  # the event's payload.project_id


def test_the_store_s_views_of_a_run_are_the_api_s_models() -> None:
    """A run, its attempts, state changes, callbacks and destinations are said once
    (agentbox.models: the shape the document and the client read); the store makes
    those, so nothing it reads can be lost or renamed on the way to the answer."""
    from agentbox import models
    from agentbox.store import views

    for name in ("RunView", "RunDetail", "AttemptView", "HistoryEntry", "NotificationView",
                 "DestinationView"):
        assert getattr(views, name) is getattr(models, name), name


# -- what Schemathesis found, pinned (in process) ------------------------------------------


@pytest.mark.anyio
async def test_the_server_does_what_the_document_says(box: InProcess) -> None:
    options = await box.client.request("OPTIONS", "/subscriptions")
    assert options.status_code == 405
    assert {"GET", "POST"} <= {m.strip() for m in options.headers["allow"].split(",")}
    run_id = (await box.post(make_event(hop=0.0))).json()["run_id"]  # 0.0 is an integer
    assert (await box.client.get(f"/runs/{run_id}?history=AAA")).status_code == 422
    for value in ("1", "true", "0", "false"):
        assert (await box.client.get(f"/runs/{run_id}?history={value}")).status_code == 200
    admin = {"Authorization": f"Bearer {box.token}"}
    refresh = await box.client.post("/subscriptions/sub_none/refresh", headers=admin,
                                    json={"ttl_ms": 60000.0})
    assert refresh.status_code == 404  # the ttl is taken; the subscription is not there
    for url in ("http://[", "https://[::1", "https://studio.example:99999/hook"):
        refused = await box.client.post("/subscriptions", headers=admin, json={
            "url": url, "event_types": ["session.exported"],
            "secret": "whsec_" + "A" * 32, "ttl_ms": 60000})
        assert refused.status_code == 422 and refused.json()["error_code"] == "invalid_url"
        bad = await box.post(make_event(callback_url=url))  # it was a 500
        assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_event"


def test_the_document_describes_what_agentbox_sends_and_how_it_is_signed() -> None:
    from agentbox.apps import api_document, load_apps
    from agentbox.config import Settings

    found = api_document(load_apps(Settings()))
    assert set(found["webhooks"]) == {"runCallback", "subscriptionDelivery",
                                      "subscriptionVerification"}
    callback = found["webhooks"]["runCallback"]["post"]
    assert {p["name"] for p in callback["parameters"]} >= {
        "X-Agent-Signature", "webhook-id", "webhook-timestamp", "webhook-signature"}
    schemes = found["components"]["securitySchemes"]
    assert schemes["standardWebhooks"]["name"] == "webhook-signature"
    assert schemes["webhookSignature"]["name"] == "X-Webhook-Signature"
    receiver = found["paths"]["/webhooks/events"]["post"]
    assert receiver["security"] == [{"webhookSignature": []}, {"standardWebhooks": []}]
    assert "webhook-id" in receiver["description"]
