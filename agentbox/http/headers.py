"""The headers every answer carries: no page of agentbox's may be framed by
another site, nor run code or load anything that agentbox did not serve itself.

A page in another site's invisible frame could be clicked through (the run
page's Replay form, by a user who thought they clicked something else); a
Content-Security-Policy allowing only agentbox's own scripts, styles and
connections keeps an injected tag inert. The page's script and stylesheet are
files for that reason (/ui/static/, agentbox.http.pages): no inline code, no
inline `style` attribute, no CDN.

An answer that is not a page (JSON, audio, the page's own files, an error) gets
a sandboxing policy instead: opened as a document, it runs nothing and is of no
origin. And no answer may be used by another site at all
(Cross-Origin-Resource-Policy: same-origin): an `<audio src=...>` on another
site's page learned whether a project existed, and its reference's duration.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "connect-src 'self'",  # fetch and the live updates' EventSource
    "img-src 'self' data:",
    "media-src 'self'",  # the mix's player
    "form-action 'self'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
))
# Every answer that is not an HTML page: nothing runs, nothing loads, no frame.
SANDBOX_POLICY = "default-src 'none'; sandbox; frame-ancestors 'none'"
_COMMON: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
PAGE_HEADERS = ((b"content-security-policy", CONTENT_SECURITY_POLICY.encode()), *_COMMON)
# The headers of every other answer (the server's own errors included).
SECURITY_HEADERS = ((b"content-security-policy", SANDBOX_POLICY.encode()), *_COMMON)


class SecurityHeaders:
    """ASGI middleware: PAGE_HEADERS on every HTML page, SECURITY_HEADERS on every other
    answer (one the app already gave one of these headers keeps its own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, secured(send) if scope["type"] == "http" else send)


def secured(send: Send) -> Send:
    """`send`, adding PAGE_HEADERS or SECURITY_HEADERS to the answer's start."""
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = with_security_headers(message.get("headers", ()))
        await send(message)
    return send_with_headers


def with_security_headers(headers: list[tuple[bytes, bytes]] | tuple[()]
                          ) -> list[tuple[bytes, bytes]]:
    given = {name.lower(): value for name, value in headers}
    page = given.get(b"content-type", b"").lower().startswith(b"text/html")
    return [*headers, *(h for h in (PAGE_HEADERS if page else SECURITY_HEADERS)
                        if h[0] not in given)]
