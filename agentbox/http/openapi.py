"""The OpenAPI document of the public API, served at `/openapi.json`.

Built from the same pydantic models that validate events and that the API
answers with (the store's views), so the document and the real answers cannot
disagree about the contract.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from agentbox.events import MAX_ID_LENGTH, PAYLOAD_MODELS, Envelope
from agentbox.runs import RunStatus
from agentbox.store import (
    DestinationView,
    NotificationView,
    ProjectExport,
    RunDetail,
    RunView,
    SubscriptionView,
)

REF = "#/components/schemas/{model}"


def _version() -> str:
    try:
        return version("agentbox")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "0"


class Rejected(BaseModel):
    """Every error answer."""

    status: str = Field(pattern="^rejected$")
    error_code: str
    message: str
    errors: list[dict[str, Any]] | None = None


class RunRefOut(BaseModel):
    run_id: str
    agent: str
    status: str
    status_url: str


class Accepted(BaseModel):
    """202 (stored) or 200 (a known duplicate: the first run's current status)."""

    status: str
    run_id: str
    duplicate: bool
    status_url: str
    runs: list[RunRefOut]


class RunList(BaseModel):
    runs: list[RunView]


class ExportView(BaseModel):
    """One export of a project (a run of an event naming it) as `GET /exports` shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    project: str
    agent: str
    status: str  # the run's status
    accepted_at: str  # ISO 8601, UTC
    finished_at: str | None  # ISO 8601, UTC, when terminal
    result: dict[str, Any] | None  # the agent's result (the review) when succeeded
    # Retention removed its run (GET /runs/{run_id} answers 404): what is here is all
    # that is kept of it.
    archived: bool = False

    @classmethod
    def of(cls, export: ProjectExport) -> ExportView:
        # Field by field from the store's dataclass: one added there and here is shown
        # without a third list of names to keep in step.
        return cls.model_validate(export, from_attributes=True)


class ExportList(BaseModel):
    exports: list[ExportView]


class Health(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: str


class Notifications(BaseModel):
    callbacks: list[NotificationView]


class Destinations(BaseModel):
    destinations: list[DestinationView]


class ResumeRequest(BaseModel):
    destination: str


class SubscriptionRequest(BaseModel):
    """`POST /subscriptions`: where to deliver, what (event types, or run states as
    `run.<state>`), the subscriber's Standard Webhooks secret, a suggested TTL."""

    model_config = ConfigDict(extra="forbid")
    url: str
    event_types: list[str]
    secret: str = Field(pattern="^whsec_")
    ttl_ms: int | None = Field(default=None, gt=0)


class RefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_ms: int | None = Field(default=None, gt=0)


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
    agents: list[AgentSet]
    subscriptions: list[SubscriptionView]


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=schema)}}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): _json("Rejected", "refused; see error_code") for code in codes}


def _limit() -> dict[str, Any]:
    return {"name": "limit", "in": "query", "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 500}}


def document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [Envelope, Rejected, Accepted, RunView, RunDetail, RunList,
                                     ExportView, ExportList, Health,
                                     Notifications, Destinations, ResumeRequest,
                                     SubscriptionRequest, RefreshRequest, SubscriptionView,
                                     Subscriptions,
                                     *PAYLOAD_MODELS.values()]
    _, schemas = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    signature_headers = [
        {"name": "X-Webhook-Timestamp", "in": "header", "required": False,
         "schema": {"type": "string"}, "description": "Unix seconds (agentbox scheme)"},
        {"name": "X-Webhook-Signature", "in": "header", "required": False,
         "schema": {"type": "string"},
         "description": "hex HMAC-SHA256(secret, timestamp + '.' + raw body)"},
    ]
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
                "parameters": signature_headers,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": REF.format(model="Envelope")}}}},
                "responses": {"202": _json("Accepted", "stored durably"),
                              "200": _json("Accepted", "a known duplicate"),
                              **_errors(400, 401, 403, 408, 413, 422, 429, 503)},
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
                                "schema": {"type": "string", "enum": ["true", "false"]},
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
                                        "schema": {"type": "string", "enum": ["1", "true"]}}],
                "responses": {"200": _json("RunDetail", "the run (with ?history=1: its "
                                                           "attempts and state changes)"),
                              **_errors(404)},
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
                "responses": {"200": {"description": "rows removed (or that would be) per "
                                                     "table", "content": {
                    "application/json": {"schema": {"type": "object"}}}},
                              **_errors(401, 422, 503)},
            }},
            "/exports": {"get": {
                "summary": "A project's exports over time; without project, each project's "
                           "latest",
                "parameters": [{"name": "project", "in": "query", "required": False,
                                "schema": {"type": "string", "minLength": 1,
                                           "maxLength": MAX_ID_LENGTH},
                                "description": "the project (payload.project_id, compared in "
                                               "Unicode NFC): its exports, newest first. "
                                               "Without it: the latest export of every "
                                               "project, newest first"}, _limit()],
                "responses": {"200": _json("ExportList", "exports, newest first"),
                              **_errors(404, 422)},
            }},
            "/runs/{run_id}/audio": {"get": {
                "summary": "The mix a finished mix review listened to (the page's player)",
                "description": "Only the file the run's own event named, never a path "
                               "the request names; byte ranges for seeking.",
                "parameters": [run_id, {"name": "Range", "in": "header", "required": False,
                                        "schema": {"type": "string"},
                                        "description": "bytes=first-last"}],
                "responses": {"200": {"description": "the whole file", "content": {
                                  "audio/*": {"schema": {"type": "string",
                                                         "format": "binary"}}}},
                              "206": {"description": "the range asked for", "content": {
                                  "audio/*": {"schema": {"type": "string",
                                                         "format": "binary"}}}},
                              "416": {"description": "a range past the end of the file"},
                              **_errors(404)},
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
                                  **_errors(401, 422, 503)},
                },
                "get": {
                    "summary": "Agents' current event types and every subscription (admin)",
                    "security": admin,
                    "responses": {"200": _json("Subscriptions", "oldest first"),
                                  **_errors(401)},
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
            "/healthz": {"get": {
                "summary": "Health",
                "responses": {"200": _json("Health", "healthy"),
                              "503": _json("Health", "the store cannot take writes")},
            }},
        },
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"admin": {"type": "http", "scheme": "bearer",
                                          "description": "agentbox token"}},
        },
    }
