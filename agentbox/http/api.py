"""The JSON API beside the receiver: runs, their history, replay, callbacks, health."""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from agentbox.addresses import origin_of
from agentbox.engine.callbacks import SUBSCRIPTION_DESTINATION, CallbackDeliverer, how_to_resume
from agentbox.engine.dispatcher import Dispatcher
from agentbox.engine.metrics import Metrics
from agentbox.engine.retention import Retention
from agentbox.events import MAX_ID_LENGTH
from agentbox.http.access import small_body, token_required
from agentbox.http.errors import error_response
from agentbox.logs import get_logger
from agentbox.models import RunDetail, RunView
from agentbox.runs import RunStatus
from agentbox.store import (
    BodyRemoved,
    DestinationNotFound,
    NotReplayable,
    RunNotFound,
    StorageUnavailable,
    Store,
)

MAX_LIST_LIMIT = 500
DEFAULT_LIST_LIMIT = 50
NOTIFICATION_STATES = ("pending", "delivered", "dead")

log = get_logger("api")
HISTORY_VALUES = ("1", "true", "0", "false")  # ?history= of GET /runs/{run_id}


# `GET /runs?prefix=`: the runs whose id starts so. Ids sort by their bytes (SQLite's
# BINARY, PostgreSQL's COLLATE "C"), so those are the newest ids below the prefix
# followed by the greatest character: the keyset page the store already reads.
RUN_ID_PREFIX = re.compile(rf"[A-Za-z0-9_]{{1,{MAX_ID_LENGTH}}}")
AFTER_EVERY_ID = "\U0010ffff"

class RunsApi:
    def __init__(self, store: Store, dispatcher: Dispatcher,
                 deliverer: CallbackDeliverer, admin_token: str,
                 metrics: Metrics | None = None, instance_id: str = "") -> None:
        self.store = store
        self.instance_id = instance_id
        self._metrics = metrics or Metrics()
        self.dispatcher = dispatcher
        self.deliverer = deliverer
        self._admin_token = admin_token.encode()
        self.retention: Retention | None = None  # POST /prune's (set by the app)
        # Apps' readings of an event's payload: the file it names (a run's `file`).
        self.file_namers: list[Callable[[Mapping[str, Any]], str | None]] = []
        # Apps' word on a run id no run has (any more): where they kept it, or None.
        self.removed_notes: list[Callable[[str], Awaitable[str | None]]] = []

    async def get_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        run = await self.store.get_run(run_id)
        if run is None:
            return await self._not_found(run_id)
        history = request.query_params.get("history", "0")
        if history not in HISTORY_VALUES:
            return error_response(422, "invalid_query", "history must be 1 or true (with the "
                                  "run's attempts and state changes), or 0 or false")
        found = (await self._with_files([run]))[0].model_dump()
        event = await self.store.event_of(run_id)
        removed = event.get("body_removed_at") if isinstance(event, dict) else None
        found.update(callbacks=_dump(await self.store.notifications(run_id)),
                     body_removed_at=removed if isinstance(removed, str) else None)
        if history in ("1", "true"):
            found.update(attempts=_dump(await self.store.attempts(run_id)),
                         history=_dump(await self.store.history(run_id)))
            return JSONResponse(RunDetail.model_validate(found).model_dump(mode="json"))
        return JSONResponse(RunDetail.model_validate(found).model_dump(
            mode="json", exclude={"attempts", "history"}))

    async def list_runs(self, request: Request) -> Response:
        status = request.query_params.get("status")
        if status is not None and status not in {s.value for s in RunStatus}:
            return error_response(422, "invalid_query", f"unknown status {status[:40]!r}; "
                                  f"use one of {', '.join(s.value for s in RunStatus)}")
        limit = limit_of(request)
        if limit is None:
            return _bad_limit()
        chain = request.query_params.get("correlation_id")
        if chain is not None and not 1 <= len(chain) <= MAX_ID_LENGTH:
            return error_response(422, "invalid_query", "correlation_id must be 1 to "
                                  f"{MAX_ID_LENGTH} characters")
        discarded = request.query_params.get("discarded", "true")
        if discarded not in ("true", "false"):
            return error_response(422, "invalid_query", "discarded must be true or false")
        prefix = request.query_params.get("prefix")
        if prefix is not None and not RUN_ID_PREFIX.fullmatch(prefix):
            return error_response(422, "invalid_query", "prefix must be the start of a run id: "
                                  f"1 to {MAX_ID_LENGTH} letters, digits or _")
        if chain is None and discarded == "true" and prefix is None:
            found = await self.store.list_runs(status, limit)
        else:
            found = await self.store.search_runs(
                status=status, chain=chain, include_discarded=discarded == "true",
                before=None if prefix is None else prefix + AFTER_EVERY_ID, limit=limit)
            found = [run for run in found if run.run_id.startswith(prefix or "")]
        return JSONResponse({"runs": _dump(await self._with_files(found))})

    async def _with_files(self, runs: Sequence[RunView]) -> list[RunView]:
        """Each run with the name of the file its event names, as an app reads it
        (`file_namers`: the review's payload.mix_url), so that a run that was not
        reviewed (queued, retrying, dead-lettered) still says which export it is. One
        small read per run (GET /runs is no hot path)."""
        if not self.file_namers:
            return list(runs)
        named = []
        for run in runs:
            event = await self.store.event_of(run.run_id)
            payload = event.get("payload") if isinstance(event, dict) else None
            name = self._file_of(payload) if isinstance(payload, dict) else None
            named.append(run.model_copy(update={"file": name}) if name else run)
        return named

    async def list_callbacks(self, request: Request) -> Response:
        state = request.query_params.get("state")
        if state is not None and state not in NOTIFICATION_STATES:
            return error_response(422, "invalid_query", f"unknown state {state[:40]!r}; use "
                                  f"one of {', '.join(NOTIFICATION_STATES)}")
        limit = limit_of(request)
        if limit is None:
            return _bad_limit()
        return JSONResponse({"callbacks": _dump(await self.store.list_notifications(state,
                                                                                    limit))})

    async def destinations(self, request: Request) -> Response:
        return JSONResponse({"destinations": _dump(await self.store.destinations())})

    async def resume_destination(self, request: Request) -> Response:
        if not self._authorised(request):
            return token_required()
        try:
            body = json.loads(await small_body(request))
            given = body["destination"]
            if not isinstance(given, str) or not given.isascii():
                raise ValueError
            if given.startswith(SUBSCRIPTION_DESTINATION):  # not the operator's to resume
                return error_response(422, "invalid_request", f"{given[:200]} is a "
                                      f"subscription's: {how_to_resume(given[:200])}.")
            parts = urlsplit(given)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError
            destination = origin_of(given)
        except (ValueError, KeyError, TypeError, RecursionError, ClientDisconnect):
            return error_response(422, "invalid_request", 'Send {"destination": '
                                  '"https://host[:port]"}, an origin from GET '
                                  '/callbacks/destinations.')
        try:
            await self.store.resume_destination(destination, self.dispatcher.clock())
        except DestinationNotFound:
            return error_response(404, "destination_not_found",
                                  f"No callback has been sent to {destination[:200]!r}.")
        except StorageUnavailable:
            return error_response(503, "storage_unavailable", "The store cannot take writes.")
        self.deliverer.wake()
        found = [d for d in await self.store.destinations() if d.destination == destination]
        return JSONResponse(found[0].model_dump(mode="json") if found
                            else {"destination": destination})

    async def replay(self, request: Request) -> Response:
        if not self._authorised(request):
            return token_required()
        run_id = request.path_params["run_id"]
        try:
            await self.dispatcher.replay(run_id)
        except RunNotFound:
            return await self._not_found(run_id)
        except BodyRemoved as exc:  # retention took what there was to run again
            return error_response(410, "body_removed", str(exc))
        except NotReplayable as exc:
            return error_response(409, "not_replayable", str(exc))
        except StorageUnavailable:
            return error_response(503, "storage_unavailable", "The store cannot take writes.")
        run = await self.store.get_run(run_id)
        return JSONResponse(run.model_dump(mode="json") if run else None,
                            status_code=202)

    async def metrics(self, request: Request) -> Response:
        try:
            stats = await self.store.stats()
        except Exception as exc:  # as /healthz: a store that cannot be read is down
            log.warning("metrics: the store cannot be read", exc_info=True)
            return error_response(503, "storage_unavailable",
                                  f"The store cannot be read: {type(exc).__name__}.")
        body = self._metrics.render(stats, self.dispatcher.clock())
        return Response(body, media_type=self._metrics.content_type)

    async def healthz(self, request: Request) -> Response:
        await self.store.probe()  # unhealthy and idle: is the database back?
        body: dict[str, Any] = {"status": "ok", "engine": self.store.engine,
                                "instance_id": self.instance_id,
                                "inflight": self.dispatcher.inflight}
        try:
            body.update(await self.store.stats())
        except Exception as exc:  # any read failure means the store is not healthy
            body.update(status="unhealthy", reason=f"store cannot be read: {type(exc).__name__}")
            return JSONResponse(body, status_code=503)
        if not self.store.healthy:
            body.update(status="unhealthy", reason=self.store.last_error)
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    async def prune(self, request: Request) -> Response:
        """`agentbox prune` beside a running server (which holds the SQLite file): a
        retention pass now, `{"dry_run": true}` to be told what would go."""
        if not self._authorised(request):
            return token_required()
        try:
            raw = await small_body(request)
            body = json.loads(raw) if raw else {}  # blanks are no JSON: 422
            dry_run = body.get("dry_run", False) if isinstance(body, dict) else None
            if not isinstance(dry_run, bool):
                raise ValueError
        except (ValueError, RecursionError, ClientDisconnect):
            return error_response(422, "invalid_request",
                                  'Send {"dry_run": true} or {"dry_run": false}.')
        if self.retention is None:
            return error_response(503, "retention_unavailable", "Retention is not running.")
        try:
            report = await self.retention.prune(dry_run=dry_run)
        except StorageUnavailable:
            return error_response(503, "storage_unavailable", "The store cannot take writes.")
        return JSONResponse(report.as_json())

    def _authorised(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self._admin_token)

    def _file_of(self, payload: Mapping[str, Any]) -> str | None:
        return next((name for namer in self.file_namers if (name := namer(payload))), None)

    async def _not_found(self, run_id: str) -> Response:
        """404 run_not_found; for a run retention removed, where an app kept it
        (`removed_notes`: the review's project history)."""
        for note in self.removed_notes:
            said = await note(run_id)
            if said is not None:
                return error_response(404, "run_not_found", said)
        return _not_found(run_id)


def _dump(views: Sequence[BaseModel]) -> list[dict[str, Any]]:
    """Views as the API's JSON shows them."""
    return [view.model_dump(mode="json") for view in views]


def limit_of(request: Request) -> int | None:
    raw = request.query_params.get("limit", str(DEFAULT_LIST_LIMIT))
    ok = raw.isascii() and raw.isdigit() and len(raw) <= 6
    return int(raw) if ok and 1 <= int(raw) <= MAX_LIST_LIMIT else None


def _bad_limit() -> Response:
    return error_response(422, "invalid_query",
                          f"limit must be an integer from 1 to {MAX_LIST_LIMIT}")


def _not_found(run_id: str) -> Response:
    return error_response(404, "run_not_found", f"No run has the id {run_id[:100]!r}.")
