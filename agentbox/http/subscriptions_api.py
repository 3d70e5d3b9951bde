"""The subscriptions' routes (the engine's side is agentbox.engine.subscriptions).

    POST   /subscriptions               {url, event_types, secret, ttl_ms} -> 201
                                        (409 too_many_subscriptions past the limit)
    GET    /subscriptions               agents' current event types, and subscriptions
                                        (?limit=, ?cursor= the last page's next_cursor)
    POST   /subscriptions/{id}/refresh  {ttl_ms} (optional) -> 200
    DELETE /subscriptions/{id}          -> 204
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import time
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from agentbox.config import Settings, env_name
from agentbox.engine.agents import AgentRegistry
from agentbox.engine.callbacks import UrlProblem
from agentbox.engine.subscriptions import (
    CREATE_BODY,
    FIELDS,
    MAX_URL_CHARS,
    REFRESH_BODY,
    Invalid,
    Subscriptions,
    agent_sets,
    secret_hint,
    secret_of,
    topics_of,
)
from agentbox.http.access import small_body, token_required
from agentbox.http.errors import error_response
from agentbox.logs import get_logger
from agentbox.store import (
    StorageUnavailable,
    Store,
    SubscriptionNotFound,
    SubscriptionView,
    TooManySubscriptions,
)

log = get_logger("subscriptions")
DEFAULT_PAGE = 100  # subscriptions a GET lists when it names no limit
MAX_PAGE = 500
CURSOR = re.compile(r"sub_[0-9a-f]{1,64}")  # a subscription id: the last one listed


def new_subscription_id() -> str:
    """`sub_` and 24 hex digits, time-ordered (48 bits of milliseconds, 48 random
    bits): listed by id, subscriptions come in the order they were made."""
    return f"sub_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(6)}"


class SubscriptionsApi:
    """The routes; every one needs the admin token (401 admin_token_required)."""

    def __init__(self, store: Store, subscriptions: Subscriptions, registry: AgentRegistry,
                 settings: Settings, admin_token: str) -> None:
        self.store, self.subscriptions, self.registry = store, subscriptions, registry
        self.settings = settings
        self._admin_token = admin_token.encode()
        self.clock = subscriptions.clock

    def _authorised(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self._admin_token)

    async def create(self, request: Request) -> Response:
        if not self._authorised(request):
            return token_required()
        try:
            fields = await _json_object(request, CREATE_BODY)
            unknown = sorted(set(fields) - FIELDS)
            if unknown:
                raise Invalid("invalid_request", f"unknown fields: {', '.join(unknown)[:200]}; "
                              "send url, event_types, secret and ttl_ms.")
            url = self._url(fields.get("url"))
            topics = topics_of(fields.get("event_types"))
            secret = secret_of(fields.get("secret"))
            ttl = self._ttl(fields.get("ttl_ms"))
        except Invalid as exc:
            return error_response(422, exc.code, exc.message)
        try:
            view = await self.store.create_subscription(
                subscription_id=new_subscription_id(), url=url, topics=topics,
                secret=secret, secret_hint=secret_hint(secret),
                challenge=secrets.token_urlsafe(24), ttl=ttl, now=self.clock(),
                limit=self.settings.max_subscriptions)
        except TooManySubscriptions as exc:
            return error_response(
                409, "too_many_subscriptions",
                f"agentbox holds {exc.limit} subscriptions already, the most "
                f"{env_name('max_subscriptions')} allows: delete one you no longer need "
                "(DELETE /subscriptions/{id}), or raise the setting.")
        except StorageUnavailable:
            return _unavailable()
        self.subscriptions.wake()
        log.info("subscription created", extra={"subscription_id": view.id,
                                                "topics": topics})
        return JSONResponse(_shown(view), status_code=201)

    async def collection(self, request: Request) -> Response:
        """`/subscriptions`: one route for both methods, so that any other gets 405
        with an Allow header naming both."""
        return await (self.create(request) if request.method == "POST"
                      else self.list(request))

    async def list(self, request: Request) -> Response:
        if not self._authorised(request):
            return token_required()
        try:
            limit, cursor = _page(request)
        except Invalid as exc:
            return error_response(422, exc.code, exc.message)
        found = await self.store.subscriptions(self.clock(), limit + 1, after=cursor)
        shown = found[:limit]
        return JSONResponse({
            "agents": await agent_sets(self.store, self.registry),
            "subscriptions": [_shown(view) for view in shown],
            "next_cursor": shown[-1].id if len(found) > limit else None})

    async def refresh(self, request: Request) -> Response:
        if not self._authorised(request):
            return token_required()
        subscription_id = request.path_params["subscription_id"]
        try:
            fields = await _json_object(request, REFRESH_BODY, empty_ok=True)
            unknown = sorted(set(fields) - {"ttl_ms"})
            if unknown:
                raise Invalid("invalid_request", f"unknown fields: {', '.join(unknown)[:200]}; "
                              "a refresh takes only ttl_ms.")
            ttl = self._ttl(fields.get("ttl_ms"))
        except Invalid as exc:
            return error_response(422, exc.code, exc.message)
        try:
            view = await self.store.refresh_subscription(
                subscription_id, ttl, secrets.token_urlsafe(24), self.clock())
        except SubscriptionNotFound:
            return _not_found(subscription_id)
        except StorageUnavailable:
            return _unavailable()
        self.subscriptions.wake()
        return JSONResponse(_shown(view))

    async def delete(self, request: Request) -> Response:
        if not self._authorised(request):
            return token_required()
        subscription_id = request.path_params["subscription_id"]
        try:
            await self.store.delete_subscription(subscription_id, self.clock())
        except SubscriptionNotFound:
            return _not_found(subscription_id)
        except StorageUnavailable:
            return _unavailable()
        log.info("subscription deleted", extra={"subscription_id": subscription_id})
        return Response(status_code=204)

    def _url(self, value: Any) -> str:
        if not isinstance(value, str) or len(value) > MAX_URL_CHARS:
            raise Invalid("invalid_url", f"url must be an absolute https URL of at most "
                          f"{MAX_URL_CHARS} characters.")
        problem = self.subscriptions.policy.check(value)
        if problem is UrlProblem.MALFORMED:
            raise Invalid("invalid_url", "url must be an absolute https URL in ASCII (an "
                          "international host name in its xn-- form), without a fragment.")
        if problem is UrlProblem.CREDENTIALS:
            raise Invalid("url_not_allowed", "url must not carry credentials.")
        if problem is UrlProblem.NOT_ALLOWED:
            raise Invalid("url_not_allowed", "url must be https (to a public address); plain "
                          "http, or a loopback host, only for an origin listed in "
                          f"{env_name('subscription_allowed')}.")
        return value

    def _ttl(self, value: Any) -> float:
        """Seconds: ttl_ms within the configured bounds (absent: the longest)."""
        s = self.settings
        if value is None:
            return s.subscription_max_ttl_seconds
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON Schema's integer: 60000.0 is one
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise Invalid("invalid_ttl", "ttl_ms must be a positive integer (milliseconds); "
                          f"it is kept between {s.subscription_min_ttl_seconds * 1000:.0f} and "
                          f"{s.subscription_max_ttl_seconds * 1000:.0f}.")
        return min(max(value / 1000, s.subscription_min_ttl_seconds),
                   s.subscription_max_ttl_seconds)


def _page(request: Request) -> tuple[int, str | None]:
    """A list's `limit` (1 to MAX_PAGE) and `cursor` (the previous page's next_cursor)."""
    raw = request.query_params.get("limit", str(DEFAULT_PAGE))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and 1 <= int(raw) <= MAX_PAGE):
        raise Invalid("invalid_query", f"limit must be an integer from 1 to {MAX_PAGE}.")
    cursor = request.query_params.get("cursor")
    if cursor is not None and not CURSOR.fullmatch(cursor):
        raise Invalid("invalid_query", "cursor must be the next_cursor of the page before, "
                      "as agentbox gave it.")
    return int(raw), cursor


def _shown(view: SubscriptionView) -> dict[str, Any]:
    return view.model_dump(mode="json")


async def _json_object(request: Request, expected: str, empty_ok: bool = False
                       ) -> dict[str, Any]:
    """The request's JSON object; else Invalid, saying what the route takes (`expected`)."""
    try:
        raw = await small_body(request)
        if empty_ok and not raw:  # no body; a body of blanks is no JSON (422)
            return {}
        fields = json.loads(raw)
    except (ValueError, RecursionError, ClientDisconnect, UnicodeDecodeError):
        raise Invalid("invalid_request", expected) from None
    if not isinstance(fields, dict):
        raise Invalid("invalid_request", expected)
    return fields


def _not_found(subscription_id: str) -> Response:
    return error_response(404, "subscription_not_found",
                          f"No subscription has the id {subscription_id[:100]!r} (an expired "
                          "one has stopped: subscribe again).")


def _unavailable() -> Response:
    return error_response(503, "storage_unavailable", "The store cannot take writes.")

