"""What scripts/bench serves: the ceiling app and the no-op agent.

The ceiling is the least a receiver can do: verify the same signature and
validate the same event model with the same code as agentbox, store nothing,
answer 202. agentbox's accepted/s divided by the ceiling's, measured in the
same run, is the benchmark's headline figure.
"""

from __future__ import annotations

import os
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentbox import AgentContext, Event
from agentbox.events import InvalidEvent, parse_event
from agentbox.signing import SignatureError, Verifier

_verifier = Verifier(os.environ.get("BENCH_SECRET", "bench-secret").split(","), 300)


async def _receive(request: Request) -> Response:
    body = await request.body()
    try:
        _verifier.verify(request.headers, body, time.time())
        event = parse_event(body)
    except SignatureError as exc:
        return JSONResponse({"status": "rejected", "error_code": exc.code}, status_code=401)
    except InvalidEvent as exc:
        return JSONResponse({"status": "rejected", "errors": exc.errors}, status_code=422)
    return JSONResponse({"status": "accepted", "event_id": event.envelope.event_id},
                        status_code=202)


ceiling_app = Starlette(routes=[Route("/webhooks/events", _receive, methods=["POST"])])


async def noop(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """The benchmark's agent: returns at once, so the figures measure agentbox."""
    return {"ok": True}
