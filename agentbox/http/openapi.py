"""The OpenAPI document of the public API, served at `/openapi.json`.

Built from the same pydantic models that validate events and that the API
answers with (the store's views), so the document and the real answers cannot
disagree about the contract.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from agentbox.engine.subscriptions import MAX_TOPICS, MAX_URL_CHARS
from agentbox.events import MAX_ID_LENGTH, PAYLOAD_MODELS, Envelope
from agentbox.http.access import SESSION_COOKIE
from agentbox.models import (
    Accepted,
    Destinations,
    ErrorAnswer,
    Health,
    LoginLink,
    Notifications,
    Pruned,
    RunDetail,
    RunList,
    RunView,
)
from agentbox.runs import RunStatus
from agentbox.signing import RECEIVER_PATH
from agentbox.store import SubscriptionView

REF = "#/components/schemas/{model}"
ERROR_ANSWER = "Rejected"  # the document's name for models.ErrorAnswer (its status)
_B64 = "[A-Za-z0-9+/]"
# whsec_ and the base64 (padded) of 24 to 64 bytes, as secret_of takes it.
SECRET_PATTERN = (f"^whsec_(?:(?:{_B64}{{4}}){{8,20}}(?:{_B64}{{2}}==|{_B64}{{3}}=)?"
                  f"|(?:{_B64}{{4}}){{21}}(?:{_B64}{{2}}==)?)$")


def _version() -> str:
    try:
        return version("agentbox")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "0"


class ResumeRequest(BaseModel):
    # An origin, as GET /callbacks/destinations lists them (the port, when given, 1-9999
    # here: the document's bound, not the server's).
    destination: str = Field(pattern=r"^https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[1-9][0-9]{0,3})?/?$")


class SubscriptionRequest(BaseModel):
    """`POST /subscriptions`: where to deliver, what (event types, or run states as
    `run.<state>`), the subscriber's Standard Webhooks secret, a suggested TTL."""

    model_config = ConfigDict(extra="forbid")
    # An absolute http(s) URL in ASCII without a fragment; whether its origin may be
    # called (https to a public address, or a listed loopback origin) is the
    # configuration's: 422 url_not_allowed otherwise.
    url: str = Field(pattern=r"^https?://[^\s/?#@]+(/[^\s#]*)?$", max_length=MAX_URL_CHARS)
    event_types: list[str] = Field(min_length=1, max_length=MAX_TOPICS)  # items: topics()
    secret: str = Field(pattern=SECRET_PATTERN)
    ttl_ms: int | None = Field(default=None, gt=0)


class RefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_ms: int | None = Field(default=None, gt=0)


class Notification(BaseModel):
    """A callback: one state change of a run, POSTed to the event's callback_url."""

    notification_id: str = Field(description="run_id:status:retry_count: the same change "
                                             "always has the same id; drop repeats")
    run_id: str
    event_id: str
    status: RunStatus
    retry_count: int
    result: dict[str, Any] | None
    error_code: str | None
    occurred_at: str


class Delivery(BaseModel):
    """What a subscription delivers: an event it subscribed to (`type` "event"), or a
    run's state change (`type` "run.<status>", with a callback's fields)."""

    model_config = ConfigDict(extra="allow")
    type: str
    notification_id: str
    occurred_at: str


class Verification(BaseModel):
    """The subscription's verification request: answer 200 with {"challenge": ...}."""

    type: str = Field(pattern="^subscription\\.verification$")
    challenge: str
    subscription_id: str


class AgentChange(BaseModel):
    event_type: str
    subscribed: bool
    run_id: str
    changed_at: str


class AgentSet(BaseModel):
    """An agent's current event types: the configuration's routing, changed by what
    the agent subscribed to and unsubscribed from."""

    agent: str
    event_types: list[str]
    changes: list[AgentChange]


class Subscriptions(BaseModel):
    """A page of subscriptions, in the order they were made; `next_cursor` (null on
    the last page) is the `cursor` that asks for the next one."""

    agents: list[AgentSet]
    subscriptions: list[SubscriptionView]
    next_cursor: str | None


# The receiver's request example: the engine's own, unless an app brings one of its
# event types (ApiPart.event_example).
EXAMPLE_EVENT = {
    "schema_version": "v1", "event_id": "evt-a81f",
    "idempotency_key": "build-bot:ping:evt-a81f",
    "event_type": "ping", "source": "build-bot",
    "timestamp": "2026-07-27T15:42:00Z",
    "payload": {"note": "hello"}}


def topics() -> list[str]:
    """What a subscription may ask for: the event types, and every state a run changes
    to as run.<state> (accepted is its event's ingest)."""
    return sorted([*PAYLOAD_MODELS, *(f"run.{s.value}" for s in RunStatus
                                      if s is not RunStatus.ACCEPTED)])


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=schema)}}}}


def _audio(description: str) -> dict[str, Any]:
    """Audio bytes, of the type the file has (audio/wav, audio/flac, ...): declared as
    audio/* and as application/octet-stream too, which client generators read as
    bytes (openapi-python-client leaves out an answer of a type it does not know)."""
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {"description": description,
            "content": {"audio/*": binary, "application/octet-stream": binary}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): _json(ERROR_ANSWER, "refused; see error_code") for code in codes}


def _limit() -> dict[str, Any]:
    return {"name": "limit", "in": "query", "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 500}}


@dataclass(frozen=True)
class ApiPart:
    """What an app adds to the document (App.api): its answers' models and its paths
    (written with json_answer, audio_answer, errors and limit_parameter)."""

    models: Sequence[type[BaseModel]] = ()
    paths: Mapping[str, Any] = field(default_factory=dict)
    # The fields the app adds to a run's view (its tables' `run_fields`): name -> JSON
    # schema, added to RunView's and RunDetail's properties.
    run_fields: Mapping[str, Any] = field(default_factory=dict)
    # An event of the app's to show as the receiver's request example (the first
    # app's that brings one; otherwise the engine's EXAMPLE_EVENT).
    event_example: Mapping[str, Any] | None = None


def document(parts: Sequence[ApiPart] = ()) -> dict[str, Any]:
    """The OpenAPI document: the engine's paths, then each app's (`parts`), each
    operation named and its access declared (`for_generators`)."""
    return for_generators(_document(parts))


def _document(parts: Sequence[ApiPart]) -> dict[str, Any]:
    models: list[type[BaseModel]] = [Envelope, ErrorAnswer, Accepted, RunView, RunDetail,
                                     RunList, Health, Pruned, LoginLink,
                                     Notifications, Destinations, ResumeRequest,
                                     SubscriptionRequest, RefreshRequest, SubscriptionView,
                                     Subscriptions, Notification, Delivery, Verification,
                                     *(m for part in parts for m in part.models),
                                     *PAYLOAD_MODELS.values()]
    _, schemas = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    schemas["$defs"][ERROR_ANSWER] = schemas["$defs"].pop(ErrorAnswer.__name__)
    for part in parts:
        for name, schema in part.run_fields.items():
            for run in (RunView.__name__, RunDetail.__name__):
                schemas["$defs"][run]["properties"].setdefault(name, schema)
    example = next((p.event_example for p in parts if p.event_example), EXAMPLE_EVENT)
    schemas["$defs"]["SubscriptionRequest"]["properties"]["event_types"]["items"] = {
        "type": "string", "enum": topics()}
    run_id = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
    admin: list[dict[str, list[str]]] = [{"admin": []}]
    subscription_id = {"name": "subscription_id", "in": "path", "required": True,
                       "schema": {"type": "string"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentbox", "version": _version(),
                 "description": "Signed webhooks in, durable agent runs out."},
        "paths": {
            "/webhooks/events": {"post": {
                "summary": "Deliver a signed event",
                "description": (
                    "Signed with a webhook secret by either scheme (the security schemes "
                    "say how): agentbox's, X-Webhook-Timestamp (Unix seconds) with "
                    "X-Webhook-Signature; or Standard Webhooks', webhook-id, "
                    "webhook-timestamp (Unix seconds) and webhook-signature. The timestamp "
                    "must be within AGENTBOX_SIGNATURE_MAX_AGE_SECONDS of the server's "
                    "clock; with both sets, X-Webhook-Signature decides. The body is "
                    "verified as the exact bytes sent, before it is parsed."),
                "security": [{"webhookSignature": []}, {"standardWebhooks": []}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": REF.format(model="Envelope")},
                    "example": example}}},
                "responses": {"202": _json("Accepted", "stored durably"),
                              "200": _json("Accepted", "a known duplicate"),
                              **_errors(400, 401, 403, 408, 413, 422, 429, 431, 503)},
            }},
            "/runs": {"get": {
                "summary": "The newest runs (of one chain, with correlation_id)",
                "parameters": [{"name": "status", "in": "query", "required": False,
                                "schema": {"type": "string",
                                           "enum": [s.value for s in RunStatus]}}, _limit(),
                               {"name": "correlation_id", "in": "query", "required": False,
                                "schema": {"type": "string", "minLength": 1,
                                           "maxLength": MAX_ID_LENGTH},
                                "description": "the runs of a chain: of the events carrying "
                                               "this correlation_id, and of the event whose "
                                               "event_id it is if that one carries none "
                                               "(the chain's first)"},
                               {"name": "discarded", "in": "query", "required": False,
                                "schema": {"type": "boolean"},
                                "description": "false: leave out dead letters discarded "
                                               "with a reason"},
                               {"name": "prefix", "in": "query", "required": False,
                                "schema": {"type": "string", "minLength": 1,
                                           "maxLength": MAX_ID_LENGTH,
                                           "pattern": "^[A-Za-z0-9_]+$"},
                                "description": "only the runs whose id starts so (what "
                                               "`agentbox show PREFIX` asks)"}],
                "responses": {"200": _json("RunList", "runs, newest first"), **_errors(422)},
            }},
            "/runs/{run_id}": {"get": {
                "summary": "One run",
                "parameters": [run_id, {"name": "history", "in": "query", "required": False,
                                        "schema": {"type": "boolean"},
                                        "description": "true (or 1): the run's attempts "
                                                       "and state changes as well"}],
                "responses": {"200": _json("RunDetail", "the run (with ?history=1: its "
                                                           "attempts and state changes)"),
                              **_errors(404, 422)},
            }},
            "/runs/{run_id}/replay": {"post": {
                "summary": "Replay a dead-lettered or failed run (admin)",
                "security": admin, "parameters": [run_id],
                "responses": {"202": _json("RunView", "back to accepted"),
                              **_errors(401, 404, 409, 410, 503)},
            }},
            "/prune": {"post": {
                "summary": "A retention pass now, or (dry_run) what it would remove (admin)",
                "security": admin,
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"type": "object", "properties": {
                        "dry_run": {"type": "boolean", "default": False}}}}}},
                "responses": {"200": _json("Pruned", "rows removed (or that would be) per "
                                                     "table"),
                              **_errors(401, 422, 503)},
            }},
            "/callbacks": {"get": {
                "summary": "Callback notifications and their delivery",
                "parameters": [{"name": "state", "in": "query", "required": False,
                                "schema": {"type": "string",
                                           "enum": ["pending", "delivered", "dead"]}},
                               _limit()],
                "responses": {"200": _json("Notifications", "newest first"), **_errors(422)},
            }},
            "/callbacks/destinations": {"get": {
                "summary": "Callback destinations",
                "responses": {"200": _json("Destinations", "every destination")},
            }},
            "/callbacks/destinations/resume": {"post": {
                "summary": "Resume a paused destination (admin)", "security": admin,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": REF.format(model="ResumeRequest")}}}},
                "responses": {"200": {"description": "resumed", "content": {
                    "application/json": {"schema": {"type": "object"}}}},
                              **_errors(401, 404, 422, 503)},
            }},
            "/subscriptions": {
                "post": {
                    "summary": "Subscribe a program to event types or run states (admin)",
                    "security": admin,
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": REF.format(model="SubscriptionRequest")}}}},
                    "responses": {"201": _json("SubscriptionView", "pending verification"),
                                  "409": _json(ERROR_ANSWER, "too_many_subscriptions: as many "
                                               "as AGENTBOX_MAX_SUBSCRIPTIONS allows exist"),
                                  **_errors(401, 422, 503)},
                },
                "get": {
                    "summary": "Agents' current event types and a page of subscriptions (admin)",
                    "security": admin,
                    "parameters": [
                        {**_limit(), "description": "subscriptions on the page (default 100)"},
                        {"name": "cursor", "in": "query", "required": False,
                         "description": "the next_cursor of the page before",
                         "schema": {"type": "string", "pattern": "^sub_[0-9a-f]{1,64}$"}}],
                    "responses": {"200": _json("Subscriptions", "in the order they were "
                                               "made; next_cursor asks for the next page"),
                                  **_errors(401, 422)},
                },
            },
            "/subscriptions/{subscription_id}": {"delete": {
                "summary": "Unsubscribe (admin)", "security": admin,
                "parameters": [subscription_id],
                "responses": {"204": {"description": "deleted"},
                              **_errors(401, 404, 503)},
            }},
            "/subscriptions/{subscription_id}/refresh": {"post": {
                "summary": "Extend a subscription; a suspended one is verified again (admin)",
                "security": admin, "parameters": [subscription_id],
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"$ref": REF.format(model="RefreshRequest")}}}},
                "responses": {"200": _json("SubscriptionView", "extended"),
                              **_errors(401, 404, 422, 503)},
            }},
            "/login-links": {"post": {
                "summary": "A one-time link that logs one browser in to the page (admin)",
                "description": "Open the url once, within expires_in_seconds; add "
                               "&next=PATH to show PATH once logged in (agentbox open "
                               "does this).",
                "security": admin,
                "responses": {"201": _json("LoginLink", "the link"), **_errors(401)},
            }},
            "/login-links/{link_id}": {"get": {
                "summary": "Whether a one-time login link was used yet (admin)",
                "description": "link_id: the first 32 hexadecimal digits of the SHA-256 of "
                               "the link's code (agentbox open waits for it before it "
                               "removes the file it gave the browser).",
                "security": admin,
                "parameters": [{"name": "link_id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the link's state", "content": {
                    "application/json": {"schema": {
                        "type": "object", "required": ["used"],
                        "properties": {"used": {"type": "boolean"}}}}}},
                    **_errors(401, 404)},
            }},
            "/healthz": {"get": {
                "summary": "Health", "security": [],
                "responses": {"200": _json("Health", "healthy"),
                              "503": _json("Health", "the store cannot take writes")},
            }},
            **{path: item for part in parts for path, item in part.paths.items()},
        },
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "admin": {"type": "http", "scheme": "bearer",
                          "description": "the admin token (`agentbox token`)"},
                "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE,
                            "description": "a browser's login session (a login link)"},
                "webhookSignature": {
                    "type": "apiKey", "in": "header", "name": "X-Webhook-Signature",
                    "description": "lowercase hex HMAC-SHA256(key, X-Webhook-Timestamp + '.' "
                                   "+ raw body); the key is the webhook secret's text (UTF-8), "
                                   "a whsec_ secret's too. Any active secret verifies."},
                "standardWebhooks": {
                    "type": "apiKey", "in": "header", "name": "webhook-signature",
                    "description": "Standard Webhooks: space-separated 'v1,' + base64("
                                   "HMAC-SHA256(key, webhook-id + '.' + webhook-timestamp + "
                                   "'.' + raw body)); the key is a whsec_ secret's base64-"
                                   "decoded tail, any other secret's text. Any active secret "
                                   "verifies."}},
        },
        "webhooks": _webhooks(),
    }


def _webhooks() -> dict[str, Any]:
    """What agentbox sends: callbacks, subscription deliveries and their verification."""
    agent = [{"name": "X-Agent-Timestamp", "in": "header", "required": True,
              "schema": {"type": "string"}, "description": "Unix seconds"},
             {"name": "X-Agent-Signature", "in": "header", "required": True,
              "schema": {"type": "string"},
              "description": "hex HMAC-SHA256(the current callback secret's text, "
                             "X-Agent-Timestamp + '.' + raw body)"}]
    standard = [{"name": "webhook-id", "in": "header", "required": True,
                 "schema": {"type": "string"}},
                {"name": "webhook-timestamp", "in": "header", "required": True,
                 "schema": {"type": "string"}},
                {"name": "webhook-signature", "in": "header", "required": True,
                 "schema": {"type": "string"},
                 "description": "one 'v1,<base64>' per active secret, space-separated: a "
                                "receiver holding any of them verifies"}]
    delivered = {"2XX": {"description": "delivered"},
                 "default": {"description": "not delivered: tried again by the retry "
                                            "schedule (410 pauses the destination)"}}

    def post(summary: str, model: str, parameters: list[dict[str, Any]],
             responses: dict[str, Any]) -> dict[str, Any]:
        return {"post": {"summary": summary, "parameters": parameters, "requestBody": {
            "required": True, "content": {"application/json": {"schema": {
                "$ref": REF.format(model=model)}}}}, "responses": responses}}

    return {
        "runCallback": post("A run's state change, to the event's callback_url (signed "
                            "with the callback secrets)", "Notification", agent + standard,
                            delivered),
        "subscriptionDelivery": post("An event or a run's state change, to a subscription's "
                                     "url (signed with its secret)", "Delivery",
                                     [*standard, {"name": "X-Subscription-Id", "in": "header",
                                                  "required": True,
                                                  "schema": {"type": "string"}}],
                                     delivered),
        "subscriptionVerification": post(
            "The subscription's challenge: answer 200 with {\"challenge\": <it>}",
            "Verification", standard, {"200": {"description": "verified", "content": {
                "application/json": {"schema": {"type": "object", "required": ["challenge"],
                                                "properties": {"challenge": {
                                                    "type": "string"}}}}}}}),
    }


# The operations' names, where the path and method alone would name them badly: what a
# generated client calls its functions (`client.list_runs`). The others are named by
# `operation_id`. A name, once given, stays: it is a generated client's API.
OPERATION_IDS = {
    ("post", RECEIVER_PATH): "send_event",
    ("get", "/runs"): "list_runs",
    ("get", "/runs/{run_id}"): "get_run",
    ("post", "/runs/{run_id}/replay"): "replay_run",
    ("post", "/prune"): "prune",
    ("get", "/callbacks"): "list_callbacks",
    ("get", "/callbacks/destinations"): "list_callback_destinations",
    ("post", "/callbacks/destinations/resume"): "resume_callback_destination",
    ("post", "/subscriptions"): "create_subscription",
    ("get", "/subscriptions"): "list_subscriptions",
    ("delete", "/subscriptions/{subscription_id}"): "delete_subscription",
    ("post", "/subscriptions/{subscription_id}/refresh"): "refresh_subscription",
    ("post", "/login-links"): "create_login_link",
    ("get", "/healthz"): "get_health",
}
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# Who may call an operation that says nothing of it: the admin token, or a login
# session (a browser's); without either, 401 (http.access).
TOKEN_OR_SESSION: list[dict[str, list[str]]] = [{"admin": []}, {"session": []}]


def operation_id(method: str, path: str) -> str:
    """An operation's name from its method and path, snake_case:
    `get /projects/{project}/reference` is `get_projects_project_reference`."""
    words = [method, *(part.strip("{}") for part in path.split("/") if part)]
    return re.sub(r"[^a-z0-9]+", "_", "_".join(words).lower()).strip("_")


def for_generators(found: dict[str, Any]) -> dict[str, Any]:
    """The document as client generators need it: every operation with a unique
    snake_case operationId, and every one the admin token (or a session) opens
    declaring so, with its 401."""
    named: dict[str, str] = {}
    for path, item in found["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            name = operation.setdefault(
                "operationId", OPERATION_IDS.get((method, path)) or operation_id(method, path))
            if name in named:
                raise ValueError(f"operationId {name} of {method} {path} is "
                                 f"{named[name]}'s already")
            named[name] = f"{method} {path}"
            security = operation.setdefault("security", TOKEN_OR_SESSION)
            if security:
                operation["responses"].setdefault(
                    "401", _json(ERROR_ANSWER, "admin_token_required: no admin token or session, "
                                               "or a wrong one"))
    return found


# For apps' parts of the document (App.api): the same pieces the engine's paths use.
json_answer, audio_answer, errors, limit_parameter = _json, _audio, _errors, _limit
