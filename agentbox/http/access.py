"""Who may ask what: the admin token, login sessions beyond loopback, the host
check on loopback, the origin of a form, and the bounded body of an admin call.

On a loopback address the pages are open to this machine (addressed by a
loopback name: DNS rebinding is refused). Bound to any other address, every
page, stream and API call needs the admin token: as `Authorization: Bearer`, or
through the login form, which trades it for a session. A session is a random
id in an HttpOnly, SameSite=Strict cookie (Secure over https) that ends at
logout or after AGENTBOX_SESSION_SECONDS; sessions live in memory, so a restart
logs everyone out. Failed logins are slowed down per client: each failure makes
that client's next attempt wait longer (1 s, 2 s, 4 s … up to a minute), by a
sleep of its own request alone, and a client that has queued more than a
minute of attempts is told 429. They are counted in the metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbox.config import Settings, is_loopback_host
from agentbox.engine.metrics import Metrics
from agentbox.http.errors import error_response

MAX_ADMIN_BODY_BYTES = 4096
SESSION_COOKIE = "agentbox_session"
# Open beyond loopback as well: the receiver checks signatures, /healthz is for load
# balancers, the login form and the page's stylesheet and script are what asks.
OPEN_PATHS = ("/webhooks/events", "/healthz", "/ui/login", "/ui/static/")
LOGIN_DELAY_BASE_SECONDS = 1.0  # the wait after a client's first failed login; doubles
LOGIN_DELAY_MAX_SECONDS = 60.0  # ... up to this
LOGIN_QUEUE_SECONDS = 60.0  # a client whose next attempt is further off gets 429
LOGIN_FORGET_SECONDS = 900.0  # a client's failures are forgotten after this without one
LOGIN_CLIENTS = 10_000  # clients whose failures are remembered (the oldest forgotten)


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


class TooManyLogins(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(f"retry after {retry_after:.0f} s")
        self.retry_after = retry_after


@dataclass
class _Failures:
    count: int
    next_at: float  # when this client's next attempt may be checked
    last: float

    def delay(self) -> float:
        return float(min(LOGIN_DELAY_BASE_SECONDS * 2.0 ** (self.count - 1),
                         LOGIN_DELAY_MAX_SECONDS))


class LoginThrottle:
    """Each client's failed logins, and when its next attempt may be checked."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._clients: dict[str, _Failures] = {}  # the least recently failed first

    def reserve(self, client: str) -> float:
        """Seconds this attempt must wait; the one after it waits longer (it is counted
        as failing until it succeeds). TooManyLogins if a minute is queued already."""
        now = self.clock()
        found = self._clients.get(client)
        if found is None or now - found.last > LOGIN_FORGET_SECONDS:
            self._clients.pop(client, None)
            return 0.0
        slot = max(now, found.next_at)
        if slot - now > LOGIN_QUEUE_SECONDS:
            raise TooManyLogins(slot - now)
        found.next_at = slot + found.delay()
        return slot - now

    def failed(self, client: str) -> None:
        now = self.clock()
        found = self._clients.pop(client, None) or _Failures(0, now, now)
        found.count, found.last = found.count + 1, now
        found.next_at = max(found.next_at, now + found.delay())
        self._clients[client] = found  # now the most recent
        if len(self._clients) > LOGIN_CLIENTS:
            del self._clients[next(iter(self._clients))]

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)


class Sessions:
    """Login sessions, in memory: random ids that end at logout or when they expire."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self._ends: dict[str, float] = {}  # session id -> when it ends

    def start(self) -> str:
        now = self.clock()
        self._ends = {sid: end for sid, end in self._ends.items() if end > now}
        session = secrets.token_urlsafe(32)
        self._ends[session] = now + self.seconds
        return session

    def valid(self, session: str) -> bool:
        end = self._ends.get(session)
        if end is None:
            return False
        if end <= self.clock():
            del self._ends[session]
            return False
        return True

    def end(self, session: str) -> None:
        self._ends.pop(session, None)


class Access:
    """The pages' and the API's access rules (the guard in agentbox.http.pages applies
    them to every request): the token, sessions, the login's throttle, the host check."""

    def __init__(self, settings: Settings, admin_token: str, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host = settings.host
        self._token = admin_token.encode()
        self.metrics = metrics
        self.sessions = Sessions(settings.session_seconds, clock)
        self.throttle = LoginThrottle(clock)

    @property
    def open_to_this_machine(self) -> bool:
        return is_loopback_host(self.host)

    def authorised(self, request: Request) -> bool:
        """The admin token as a Bearer token, or a session's cookie (beyond loopback)."""
        if self.open_to_this_machine:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return self.token_is(token.strip())
        return self.sessions.valid(request.cookies.get(SESSION_COOKIE, ""))

    def token_is(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    async def log_in(self, request: Request, token: str) -> str | None:
        """A new session's id for the right token, else None (counted, and this client's
        next attempt waits longer). TooManyLogins when the client has queued too many."""
        client = request.client.host if request.client else ""
        await asyncio.sleep(self.throttle.reserve(client))  # this request waits, no other
        if not self.token_is(token):
            self.throttle.failed(client)
            self.metrics.login_failed()
            return None
        self.throttle.succeeded(client)
        return self.sessions.start()

    def session_cookie(self, response: Response, request: Request, session: str) -> None:
        response.set_cookie(SESSION_COOKIE, session, max_age=math.ceil(self.sessions.seconds),
                            httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")

    def log_out(self, request: Request, response: Response) -> None:
        self.sessions.end(request.cookies.get(SESSION_COOKIE, ""))
        response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict",
                               secure=request.url.scheme == "https")

    def guard(self, app: ASGIApp, login_page: Callable[[], Response]) -> ASGIApp:
        """Middleware: on loopback, no request addressed to another name (DNS
        rebinding); beyond it, everything but OPEN_PATHS needs the token or a session
        (a page asks with `login_page`, the API answers 401)."""
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            response: Response
            if self.open_to_this_machine:
                if not self.rebound(scope):
                    await app(scope, receive, send)
                    return
                response = error_response(400, "host_not_allowed", (
                    "agentbox on a loopback address answers only when addressed as "
                    "localhost or a loopback IP (the Host header)."))
            elif scope["path"].startswith(OPEN_PATHS) or self.authorised(Request(scope)):
                await app(scope, receive, send)
                return
            elif (scope["method"] == "GET"
                  and "text/html" in Request(scope).headers.get("accept", "")):
                response = login_page()
            else:
                response = token_required()
            await response(scope, receive, send)
        return guarded

    def rebound(self, scope: Scope) -> bool:
        """The request names another host than this machine: a site whose name now
        points at 127.0.0.1.

        A page open to this machine must not be open to a web site whose name was
        made to point at 127.0.0.1 after the browser loaded it (DNS rebinding):
        the browser would treat agentbox's pages as that site's own, CSRF token
        included. Its requests carry the site's name as their Host, and nothing
        else tells them from a program's: on plain http a browser sends no
        Sec-Fetch headers and a same-origin GET no Origin, and some browsers let
        a page set its User-Agent. So every request must name this machine."""
        host = next((value for name, value in scope["headers"] if name == b"host"), None)
        if host is None:
            return False  # HTTP/1.0 without a Host: no browser sends that
        try:
            name = urlsplit("//" + host.decode("latin-1")).hostname or ""
        except ValueError:
            return True
        name = name.removesuffix(".")
        # *.localhost: browsers resolve it to loopback themselves, no DNS to rebind.
        return not (is_loopback_host(name) or name.endswith(".localhost")
                    or name == self.host.lower())
