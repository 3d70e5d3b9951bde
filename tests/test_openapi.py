"""schemathesis against a real agentbox server: for every operation of
/openapi.json, generated requests (valid and invalid) never get a 5xx, and every
answer conforms to the document (status code, content type, body schema)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.conftest import Server


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
            calls.append(case.operation.path)
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
                                      "/runs/{run_id}/replay", "/healthz"}
