"""The JSON API beside the receiver: runs, their history, replay, health."""

from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentbox.dispatcher import Dispatcher
from agentbox.receiver import error_response
from agentbox.runs import RunStatus
from agentbox.store import NotReplayable, RunNotFound, StorageUnavailable
from agentbox.store.sqlite import SqliteStore

MAX_LIST_LIMIT = 500
DEFAULT_LIST_LIMIT = 50


class RunsApi:
    def __init__(self, store: SqliteStore, dispatcher: Dispatcher, admin_token: str) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self._admin_token = admin_token.encode()

    async def get_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        run = await self.store.get_run(run_id)
        if run is None:
            return _not_found(run_id)
        if request.query_params.get("history") in ("1", "true"):
            run["attempts"] = await self.store.attempts(run_id)
            run["history"] = await self.store.history(run_id)
        return JSONResponse(run)

    async def list_runs(self, request: Request) -> Response:
        status = request.query_params.get("status")
        if status is not None and status not in {s.value for s in RunStatus}:
            return error_response(422, "invalid_query", f"unknown status {status[:40]!r}; "
                                  f"use one of {', '.join(s.value for s in RunStatus)}")
        raw_limit = request.query_params.get("limit", str(DEFAULT_LIST_LIMIT))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
            return error_response(422, "invalid_query",
                                  f"limit must be an integer from 1 to {MAX_LIST_LIMIT}")
        runs = await self.store.list_runs(status, int(raw_limit))
        return JSONResponse({"runs": runs})

    async def replay(self, request: Request) -> Response:
        if not self._authorised(request):
            return error_response(401, "admin_token_required",
                                  "Send the admin token (agentbox token) as a Bearer token.")
        run_id = request.path_params["run_id"]
        try:
            await self.store.replay(run_id, self.dispatcher.clock())
        except RunNotFound:
            return _not_found(run_id)
        except NotReplayable as exc:
            return error_response(409, "not_replayable", str(exc))
        except StorageUnavailable:
            return error_response(503, "storage_unavailable", "The store cannot take writes.")
        self.dispatcher.wake()
        run = await self.store.get_run(run_id)
        return JSONResponse(run, status_code=202)

    async def healthz(self, request: Request) -> Response:
        body: dict[str, Any] = {"status": "ok", "inflight": self.dispatcher.inflight}
        try:
            body.update(await self.store.stats())
        except Exception as exc:  # any read failure means the store is not healthy
            body.update(status="unhealthy", reason=f"store cannot be read: {type(exc).__name__}")
            return JSONResponse(body, status_code=503)
        if not self.store.healthy:
            body.update(status="unhealthy", reason=self.store.last_error)
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    def _authorised(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self._admin_token)


def _not_found(run_id: str) -> Response:
    return error_response(404, "run_not_found", f"No run has the id {run_id[:100]!r}.")
