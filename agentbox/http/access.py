"""Who may ask what: the admin token's answer and the bounded body of an admin call."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from agentbox.http.errors import error_response

MAX_ADMIN_BODY_BYTES = 4096


async def small_body(request: Request) -> bytes:
    """An admin call's JSON body; larger than MAX_ADMIN_BODY_BYTES is refused (ValueError)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_ADMIN_BODY_BYTES:
            raise ValueError("body too large")
        chunks.append(chunk)
    return b"".join(chunks)


def token_required() -> Response:
    return error_response(401, "admin_token_required",
                          "Send the admin token (agentbox token) as a Bearer token.")
