"""`POST /webhooks/events` in process: the real app and store (a temporary SQLite
file) over httpx's ASGI transport. The fast tier's check of the receiver's
answers; tests/test_server.py checks them again through a real socket."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path

import pytest

from agentbox.signing import sign_headers
from tests.conftest import SECRET, InProcess, encode, in_process, make_event

pytestmark = pytest.mark.anyio


async def no_runs(box: InProcess) -> bool:
    """Nothing was stored (a refusal must leave no record behind)."""
    response = await box.client.get("/runs")
    return response.status_code == 200 and response.json()["runs"] == []


async def test_a_signed_event_is_accepted_and_runs_to_succeeded(box: InProcess) -> None:
    response = await box.post(make_event(project_id="ok"))
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["duplicate"] is False and body["status"] in ("accepted", "processing")
    assert body["status_url"] == f"/runs/{body['run_id']}"
    assert [run["run_id"] for run in body["runs"]] == [body["run_id"]]
    run = await box.wait_status(body["run_id"])
    assert run["status"] == "succeeded"
    assert run["result"] == {"project_id": "ok", "attempt": 1}


async def test_a_second_delivery_is_a_200_duplicate_of_the_first_run(box: InProcess) -> None:
    event = make_event(project_id="ok")
    first = (await box.post(event)).json()
    await box.wait_status(first["run_id"])
    again = await box.post(event)
    assert again.status_code == 200, again.text
    assert again.json()["duplicate"] is True
    assert again.json()["run_id"] == first["run_id"]
    assert again.json()["status"] == "succeeded"
    assert len((await box.client.get("/runs")).json()["runs"]) == 1


async def test_a_wrong_secret_is_signature_invalid(box: InProcess) -> None:
    response = await box.post(make_event(), secret="not-the-secret")
    assert response.status_code == 401
    assert response.json()["error_code"] == "signature_invalid"
    assert await no_runs(box)


async def test_an_unsigned_event_is_signature_missing(box: InProcess) -> None:
    response = await box.client.post("/webhooks/events", content=encode(make_event()),
                                     headers={"Content-Type": "application/json"})
    assert response.status_code == 401
    assert response.json()["error_code"] == "signature_missing"
    assert await no_runs(box)


async def test_old_future_and_garbled_timestamps_are_refused(box: InProcess) -> None:
    now = int(time.time())
    for timestamp in (now - 301, now + 301):
        response = await box.post(make_event(), timestamp=timestamp)
        assert response.status_code == 401
        assert response.json()["error_code"] == "signature_expired"
    body = encode(make_event())
    garbled = {**sign_headers(SECRET, body, now), "X-Webhook-Timestamp": "soon"}
    response = await box.client.post("/webhooks/events", content=body, headers=garbled)
    assert response.status_code == 401
    assert response.json()["error_code"] == "timestamp_invalid"
    assert await no_runs(box)


async def test_a_body_changed_after_signing_is_refused(box: InProcess) -> None:
    event = make_event()
    headers = sign_headers(SECRET, encode(event), int(time.time()))
    changed = encode({**event, "source": "elsewhere"})
    response = await box.client.post("/webhooks/events", content=changed, headers=headers)
    assert response.status_code == 401
    assert response.json()["error_code"] == "signature_invalid"


async def test_standard_webhooks_headers_are_accepted(box: InProcess) -> None:
    body, ts, msg_id = encode(make_event()), str(int(time.time())), "msg_1"
    mac = hmac.new(SECRET.encode(), f"{msg_id}.{ts}.".encode() + body, hashlib.sha256)
    response = await box.client.post("/webhooks/events", content=body, headers={
        "webhook-id": msg_id, "webhook-timestamp": ts,
        "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode()})
    assert response.status_code == 202, response.text


async def test_a_body_over_the_limit_is_413_before_it_is_read(tmp_path: Path,
                                                              anyio_backend: str) -> None:
    async with in_process(tmp_path, AGENTBOX_MAX_BODY_BYTES="600") as box:
        event = make_event(payload={"project_id": "x" * 700, "mix_url": "/tmp/mix.wav"})
        response = await box.post(event)
        assert response.status_code == 413
        assert response.json()["error_code"] == "body_too_large"
        assert "AGENTBOX_MAX_BODY_BYTES" in response.json()["message"]
        assert await no_runs(box)


async def test_an_invalid_event_is_422_with_each_field_error(box: InProcess) -> None:
    event = make_event()
    del event["source"]
    event["unexpected"] = 1
    response = await box.post(event)
    assert response.status_code == 422
    body = response.json()
    assert body["error_code"] == "invalid_event"
    found = {(tuple(error["loc"]), error["type"]) for error in body["errors"]}
    assert found == {(("source",), "missing"), (("unexpected",), "extra_forbidden")}
    assert await no_runs(box)


async def test_json_that_is_not_json_is_422(box: InProcess) -> None:
    response = await box.post(b"{not json")
    assert response.status_code == 422
    assert response.json()["errors"][0]["type"] == "json_invalid"


async def test_an_unknown_event_type_is_422_naming_the_known_ones(box: InProcess) -> None:
    response = await box.post(make_event(event_type="nope.thing"))
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["loc"] == ["event_type"] and "session.exported" in error["msg"]


async def test_a_callback_to_an_origin_not_allowed_is_403(box: InProcess) -> None:
    response = await box.post(make_event(callback_url="https://elsewhere.example/hook"))
    assert response.status_code == 403
    assert response.json()["error_code"] == "callback_not_allowed"
    with_credentials = await box.post(
        make_event(callback_url="https://user:pw@elsewhere.example/hook"))
    assert with_credentials.status_code == 403
    assert "credentials" in with_credentials.json()["message"]
    assert "user:pw" not in with_credentials.text  # credentials are never echoed
    assert await no_runs(box)


async def test_a_callback_url_that_is_no_url_is_a_field_error(box: InProcess) -> None:
    response = await box.post(make_event(callback_url="ftp://host/x"))
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["callback_url"]


async def test_an_allowed_callback_origin_is_accepted(tmp_path: Path, anyio_backend: str) -> None:
    async with in_process(tmp_path, AGENTBOX_CALLBACK_ALLOWED="https://hooks.example") as box:
        response = await box.post(make_event(callback_url="https://hooks.example/done"))
        assert response.status_code == 202, response.text


async def test_admission_refuses_past_max_pending_with_retry_after(
        tmp_path: Path, anyio_backend: str) -> None:
    async with in_process(tmp_path, AGENTBOX_MAX_PENDING="1") as box:
        first = await box.post(make_event(project_id="sleep-5"))
        assert first.status_code == 202
        refused = await box.post(make_event())
        assert refused.status_code == 429
        assert refused.json()["error_code"] == "too_many_pending"
        assert refused.headers["Retry-After"].isdigit()


async def test_other_methods_on_the_receiver_are_405(box: InProcess) -> None:
    response = await box.client.get("/webhooks/events")
    assert response.status_code == 405
    assert response.json()["error_code"] == "method_not_allowed"
