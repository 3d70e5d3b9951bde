"""Who may ask what: the admin token's answer and the bounded body of an admin call."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

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


def from_this_site(headers: Mapping[str, str]) -> bool:
    """Whether a state-changing request came from agentbox's own page (not another
    site's): its Origin names this host, or is "null", which browsers send for every
    POST under the pages' Referrer-Policy: no-referrer. Browsers that say where a
    request comes from (Sec-Fetch-Site; on loopback and https) must say same-origin.
    The form's CSRF token is checked as well."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    origin = headers.get("origin")
    return origin in (None, "null") or urlsplit(origin).netloc == headers.get("host")
