"""The subscriptions' API in process: the limit on how many subscriptions agentbox
holds (AGENTBOX_MAX_SUBSCRIPTIONS: 409 too_many_subscriptions past it) and the list
by pages (limit, cursor, next_cursor). The real app and store over httpx's ASGI
transport; the subscriber's URL answers nothing (they stay pending verification)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, InProcess, in_process

pytestmark = pytest.mark.anyio

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ORIGIN = "http://127.0.0.1:9"  # the discard port: nothing answers the verification
SECRET = "whsec_" + "A" * 40


async def subscribe(box: InProcess) -> httpx.Response:
    return await box.client.post("/subscriptions", headers=AUTH, json={
        "url": f"{ORIGIN}/hook", "event_types": ["session.exported"], "secret": SECRET})


async def listed(box: InProcess, **query: str) -> dict[str, Any]:
    response = await box.client.get("/subscriptions", headers=AUTH, params=query)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_subscription_past_the_limit_is_refused_with_409(tmp_path: Any) -> None:
    async with in_process(tmp_path, AGENTBOX_SUBSCRIPTION_ALLOWED=ORIGIN,
                          AGENTBOX_MAX_SUBSCRIPTIONS="3") as box:
        made = [(await subscribe(box)).json()["id"] for _ in range(3)]
        refused = await subscribe(box)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error_code"] == "too_many_subscriptions"
        assert "AGENTBOX_MAX_SUBSCRIPTIONS" in refused.json()["message"]
        assert [s["id"] for s in (await listed(box))["subscriptions"]] == made
        gone = await box.client.delete(f"/subscriptions/{made[0]}", headers=AUTH)
        assert gone.status_code == 204
        assert (await subscribe(box)).status_code == 201  # room again


async def test_the_list_comes_in_pages_in_the_order_subscriptions_were_made(
        tmp_path: Any) -> None:
    async with in_process(tmp_path, AGENTBOX_SUBSCRIPTION_ALLOWED=ORIGIN) as box:
        made = [(await subscribe(box)).json()["id"] for _ in range(5)]
        whole = await listed(box)
        assert [s["id"] for s in whole["subscriptions"]] == made
        assert whole["next_cursor"] is None and whole["agents"]
        pages, cursor = [], None
        while True:
            page = await listed(box, limit="2", **({"cursor": cursor} if cursor else {}))
            pages.append([s["id"] for s in page["subscriptions"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == [made[0:2], made[2:4], made[4:5]]


@pytest.mark.parametrize("query", [{"limit": "0"}, {"limit": "501"}, {"limit": "ten"},
                                   {"cursor": "x"}, {"cursor": "sub_NOTHEX"}, {"cursor": ""}])
async def test_a_bad_page_query_is_422(box: InProcess, query: dict[str, str]) -> None:
    response = await box.client.get("/subscriptions", headers=AUTH, params=query)
    assert response.status_code == 422, response.text
    assert response.json()["error_code"] == "invalid_query"


@pytest.mark.parametrize("body", [b"\r", b"  \n", b"null", b"[]", b"{"])
async def test_a_refresh_whose_body_is_no_json_object_is_422_and_changes_nothing(
        tmp_path: Any, body: bytes) -> None:
    """No body at all is a refresh with the default time to live; blanks, or JSON
    that is no object, are refused (schemathesis sent a lone carriage return, and it
    was taken for no body)."""
    async with in_process(tmp_path, AGENTBOX_SUBSCRIPTION_ALLOWED=ORIGIN) as box:
        made = (await subscribe(box)).json()
        path = f"/subscriptions/{made['id']}/refresh"
        json_type = {**AUTH, "Content-Type": "application/json"}
        refused = await box.client.post(path, headers=json_type, content=body)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error_code"] == "invalid_request"
        assert (await listed(box))["subscriptions"][0]["expires_at"] == made["expires_at"]
        assert (await box.client.post(path, headers=AUTH)).status_code == 200


@pytest.mark.parametrize("body", [b"\r", b" ", b"[]"])
async def test_a_prune_whose_body_is_no_json_object_is_422(tmp_path: Any,
                                                           body: bytes) -> None:
    async with in_process(tmp_path) as box:
        refused = await box.client.post("/prune", content=body, headers={
            **AUTH, "Content-Type": "application/json"})
        assert refused.status_code == 422, refused.text
        dry = await box.client.post("/prune", headers=AUTH, json={"dry_run": True})
        assert dry.status_code == 200, dry.text
