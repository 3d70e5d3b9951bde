"""The one shape of an error answer, for every route: `status`, `error_code`
(what went wrong, for programs), `message` (what to change, for people) and, for
an invalid event, the field `errors`."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Send

from agentbox.jsontext import encoder

# As json.dumps(ensure_ascii=False, allow_nan=False, separators=(",", ":")) encodes,
# made once (json.dumps makes one per call when given any option).
_ENCODE = encoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def error_body(code: str, message: str,
               errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status": "rejected", "error_code": code, "message": message}
    if errors is not None:
        body["errors"] = errors
    return body


def error_response(
    status: int, code: str, message: str, errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(code, message, errors), status_code=status, headers=headers)


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: dict[str, str] | None = None) -> None:
    """A JSON response, encoded as Starlette's JSONResponse encodes it."""
    content = _ENCODE(body).encode()
    raw = [(b"content-length", str(len(content)).encode()),
           (b"content-type", b"application/json")]
    raw += [(name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})
