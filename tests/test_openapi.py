"""schemathesis against a real agentbox server: for every operation of
/openapi.json, generated requests (valid and invalid) never get a 5xx, and every
answer conforms to the document (status code, content type, body schema)."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.conftest import Server, make_event
from tests.support.callback_receiver import CallbackReceiver
from tests.test_callbacks import CALLBACK_SECRET, receiver

__all__ = ["receiver"]  # the callback receiver fixture, shared with test_callbacks


def test_the_api_keeps_to_its_document(server: Server) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    calls = []
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            calls.append((case.method, case.operation.path))
            case.call_and_validate()  # no 5xx; status, content type and body as documented

        check()
    assert len(set(calls)) == len(operations) and len(calls) >= 100


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
