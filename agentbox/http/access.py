"""Who may ask what: the admin token, login sessions and one-time login links, the
host check on loopback, the origin of a form, and the bounded body of an admin call.

Every page, stream and API call needs the admin token, on loopback too: every
other account of the machine reaches a loopback port, and the page is its
user's alone (the token file is readable by that user only). The token comes
as `Authorization: Bearer` (the CLI, watch folders, MCP), or is traded for a
session: by the login form, or by a one-time login link (`agentbox open`, the
start-up line), which carries no secret that outlives it. On loopback a request
must also be addressed by a loopback name (DNS rebinding is refused).

On loopback the page is served on a private host name, `agentbox-<32 hex
digits>.localhost` (random per install, kept in the config dir: config.page_name),
which browsers resolve to loopback themselves. A session's cookie is set there
alone (host-only), and a session is taken only on that name: browsers send a
cookie to every port of its host, so a cookie of 127.0.0.1 would reach any
program another account runs on another loopback port, while this name's reaches
only a program that knows the name. A login at 127.0.0.1 or localhost moves the
browser to the name first, once it has shown the token or a working link (the
name is told to no one else: any program can ask 127.0.0.1); the admin token as
a Bearer token works on every loopback name.

A session is a random id, signed with a key made from the admin token, in an
HttpOnly, SameSite=Strict cookie (Secure over https); it ends at logout or
after AGENTBOX_SESSION_SECONDS (on loopback 400 days unless set: a musician
logs in once per browser). Being signed, it outlives a restart; a new admin
token ends every session. Failed logins are slowed down per client: each failure makes
that client's next attempt wait longer (1 s, 2 s, 4 s … up to a minute), by a
sleep of its own request alone, and a client that has queued more than a
minute of attempts is told 429. They are counted in the metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbox import proof
from agentbox.config import Settings, is_loopback_host, session_seconds
from agentbox.engine.metrics import Metrics
from agentbox.http.errors import error_response
from agentbox.logs import get_logger

log = get_logger("access")
MAX_ADMIN_BODY_BYTES = 4096
SESSION_COOKIE = "agentbox_session"
# Open beyond loopback as well: the receiver checks signatures, /healthz is for load
# balancers, the login form and the page's stylesheet and script are what asks, and
# the API's document (no data: what a client generator reads) is what a program asks.
OPEN_PATHS = ("/webhooks/events", "/healthz", "/openapi.json", "/ui/login", "/ui/static/")
LOGIN_DELAY_MAX_TIMES = 60  # a wrong token's wait doubles up to this many times the first
CSRF_HEADER = "x-csrf-token"  # how the pages' scripts send the CSRF token with an action
LOGIN_QUEUE_SECONDS = 60.0  # a client whose next attempt is further off gets 429
LOGIN_FORGET_SECONDS = 900.0  # a client's failures are forgotten after this without one
LOGIN_CLIENTS = 10_000  # clients whose failures are remembered (the oldest forgotten)
LOGIN_LINK_SECONDS = 600.0  # a one-time login link works once, within this
LOGIN_LINKS = 100  # links not yet used at once (the oldest forgotten)
LOGIN_LINK_PATH = "/ui/login"


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


CSRF_FAILED = ("The form is stale or forged (CSRF check failed); reload the page and "
               "try again.")


def page_token_ok(request: Request, given: str, csrf: str) -> bool:
    """Whether a page form's token (`given`) is the page's (`csrf`), sent from this site."""
    return bool(given) and from_this_site(request.headers) and hmac.compare_digest(
        given.encode(), csrf.encode())


def posted_form(request: Request) -> bool:
    """Whether an action was posted by a page's form (its answer a page or a redirect),
    not by a program (JSON)."""
    return request.headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded")


async def page_form(request: Request, csrf: str) -> FormData | Response:
    """A page form's fields when it was posted from this site with the page's CSRF
    token (`csrf`), else the refusal: 403 csrf_failed."""
    form = await request.form()
    if page_token_ok(request, str(form.get("csrf") or ""), csrf):
        return form
    return error_response(403, "csrf_failed", CSRF_FAILED)


def bearer(request: Request) -> str | None:
    """The token of `Authorization: Bearer`, stripped; None when there is none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


LOOPBACK_CLIENT = "loopback"  # every address of 127.0.0.0/8 and ::1: one client


def client_host(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def client_of(scope: Scope) -> str:
    """Who the login throttle counts: the client's address, every loopback one as one
    (a program on this machine can bind any of 127.0.0.0/8's sixteen million)."""
    host = client_host(scope)
    return LOOPBACK_CLIENT if is_loopback_host(host.split("%", 1)[0]) else host


class TooManyLogins(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(f"retry after {retry_after:.0f} s")
        self.retry_after = retry_after


@dataclass
class _Failures:
    count: int
    next_at: float  # when this client's next wrong token may be answered
    last: float

    def delay(self, base: float) -> float:
        return float(min(base * 2.0 ** (self.count - 1), base * LOGIN_DELAY_MAX_TIMES))


class LoginThrottle:
    """Each client's wrong tokens, and when the answer to its next one may be given."""

    def __init__(self, base: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self._base = clock, base
        self._clients: dict[str, _Failures] = {}  # the least recently failed first

    def failed(self, client: str) -> float:
        """A wrong token from `client`, counted now (those sent at once count each):
        the seconds its answer must wait; the next one's waits twice as long.
        TooManyLogins when a minute of answers is queued already."""
        now = self.clock()
        found = self._clients.pop(client, None)
        if found is None or now - found.last > LOGIN_FORGET_SECONDS:
            found = _Failures(0, now, now)
        found.count, found.last = found.count + 1, now
        self._clients[client] = found  # now the most recent
        if len(self._clients) > LOGIN_CLIENTS:
            del self._clients[next(iter(self._clients))]
        slot = max(now, found.next_at)
        if slot - now > LOGIN_QUEUE_SECONDS:
            raise TooManyLogins(slot - now)
        found.next_at = slot + found.delay(self._base)
        return slot - now


class Sessions:
    """Login sessions: random ids signed with a key of the admin token's, each with its
    end; they end at logout (remembered until they would have ended) or when they expire.
    Nothing of them is kept on disk: a restart keeps them, a new admin token ends them."""

    def __init__(self, token: bytes, seconds: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.seconds, self.clock = seconds, clock
        self._key = hmac.new(token, b"agentbox session", hashlib.sha256).digest()
        self._ended: dict[str, float] = {}  # session id -> when it would have ended

    def start(self) -> str:
        end = f"{(self.clock() + self.seconds) * 1000:.0f}"  # milliseconds since the epoch
        signed = f"{end}.{secrets.token_urlsafe(24)}"
        return f"{signed}.{self._mac(signed)}"

    def valid(self, session: str) -> bool:
        return self._end_of(session) is not None and session not in self._ended

    def end(self, session: str) -> None:
        end = self._end_of(session)
        if end is not None:
            now = self.clock()
            self._ended = {sid: at for sid, at in self._ended.items() if at > now}
            self._ended[session] = end

    def _end_of(self, session: str) -> float | None:
        """When a well-signed, unexpired session ends, else None."""
        signed, _, mac = session.rpartition(".")
        end, _, _ = signed.partition(".")
        if not (end.isascii() and end.isdigit()) or not hmac.compare_digest(
                mac.encode(), self._mac(signed).encode()):
            return None
        at = int(end) / 1000
        return at if at > self.clock() else None

    def _mac(self, signed: str) -> str:
        return hmac.new(self._key, signed.encode(), hashlib.sha256).hexdigest()


class LoginLinks:
    """One-time login links' codes: each opens one session, once, within
    LOGIN_LINK_SECONDS. Made for whoever holds the admin token (`agentbox open`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._ends: dict[str, float] = {}  # code -> when it stops working, oldest first
        self._used: dict[str, float] = {}  # a used link's id -> when it would have ended

    def make(self) -> str:
        code = secrets.token_urlsafe(32)
        self._ends[code] = self.clock() + LOGIN_LINK_SECONDS
        if len(self._ends) > LOGIN_LINKS:
            del self._ends[next(iter(self._ends))]
        return code

    def waiting(self, code: str) -> bool:
        """Whether `code` would open a session now (it is left unused)."""
        return self._ends.get(code, 0.0) > self.clock()

    def use(self, code: str) -> bool:
        end = self._ends.pop(code, None)
        now = self.clock()
        if end is None or end <= now:
            return False
        self._used = {link: at for link, at in self._used.items() if at > now}
        self._used[link_id(code)] = end
        return True

    def used(self, link: str) -> bool | None:
        """Whether the link of this id (link_id) was used; None: no such link, or
        expired. What `agentbox open` waits for before it removes the file it gave
        the browser."""
        now = self.clock()
        if self._used.get(link, 0.0) > now:
            return True
        waiting = any(link_id(code) == link for code, end in self._ends.items() if end > now)
        return False if waiting else None


def serves_page_name(host: str) -> bool:
    """Whether a server listening on `host` is reached by a name under .localhost:
    browsers resolve those to 127.0.0.1 and ::1 alone."""
    return host in ("127.0.0.1", "::1", "localhost")


def host_name(scope: Scope) -> str | None:
    """The host a request names (its Host header, lowercase, no port or final dot);
    None when it names none, or none that parses."""
    host = next((value for name, value in scope["headers"] if name == b"host"), None)
    if host is None:
        return None
    try:
        name = urlsplit("//" + host.decode("latin-1")).hostname
    except ValueError:
        return None
    return name.removesuffix(".") if name else None


def link_id(code: str) -> str:
    """A login link's name that opens nothing: asked after by whoever made the link."""
    return hashlib.sha256(code.encode()).hexdigest()[:32]


class Access:
    """The pages' and the API's access rules (the guard in agentbox.http.pages applies
    them to every request): the token, sessions, the login's throttle, the host check."""

    def __init__(self, settings: Settings, admin_token: str, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic,
                 page_name: str | None = None) -> None:
        self.host = settings.host
        # The private name sessions are bound to (None: served on AGENTBOX_HOST alone).
        self.page_name = page_name if serves_page_name(settings.host) else None
        self._token = admin_token.encode()
        self.metrics = metrics
        self.sessions = Sessions(self._token, session_seconds(settings))
        self.throttle = LoginThrottle(settings.login_delay_seconds, clock)
        self.links = LoginLinks(clock)

    @property
    def open_to_this_machine(self) -> bool:
        return is_loopback_host(self.host)

    def authorised(self, request: Request) -> bool:
        """The admin token as a Bearer token, or a session's cookie on the page's name."""
        token = bearer(request)
        if token is not None:
            return self.token_is(token)
        return self.on_page_name(request.scope) and self.sessions.valid(
            request.cookies.get(SESSION_COOKIE, ""))

    def on_page_name(self, scope: Scope) -> bool:
        """Whether the request names the host sessions are made and taken on."""
        return self.page_name is None or host_name(scope) == self.page_name

    def page_url(self, base_url: str) -> str:
        """`base_url` (http://127.0.0.1:8000/) on the page's private name, when it has
        one: where a browser logs in."""
        if self.page_name is None:
            return base_url.rstrip("/")
        parts = urlsplit(base_url)
        try:
            port = "" if parts.port is None else f":{parts.port}"
        except ValueError:  # a Host header's port out of range: the page's name alone
            port = ""
        return f"{parts.scheme}://{self.page_name}{port}"

    def page_url_of(self, request: Request) -> str:
        """The page's address for a request to it: on its private name at the port of
        the socket it came in on (not the Host header's), else as it was asked."""
        server = request.scope.get("server")
        if self.page_name is not None and server and server[1]:
            return f"{request.scope.get('scheme', 'http')}://{self.page_name}:{server[1]}"
        return self.page_url(str(request.base_url))

    def may_change(self, request: Request, csrf: str) -> bool:
        """An action's caller: the admin token as a Bearer token (the CLI), or the
        page's own script (its CSRF token in X-CSRF-Token, from this site)."""
        token = bearer(request)
        if token is not None:
            return self.token_is(token)
        given = request.headers.get(CSRF_HEADER, "")
        return bool(given) and from_this_site(request.headers) and hmac.compare_digest(
            given.encode(), csrf.encode())

    def token_is(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    async def log_in(self, request: Request, token: str) -> bool:
        """Whether the login form's token is the right one: at once if so; else once
        this client's wait is over (counted, and its next wrong one waits longer).
        TooManyLogins when the client has queued too many."""
        if self.token_is(token):
            return True
        await self.wrong_token(request.scope, "a login to the page failed")
        return False

    async def wrong_token(self, scope: Scope, said: str) -> None:
        """A wrong admin token (the login form's or a Bearer token): counted, logged
        and answered once this client's wait is over (it doubles with each, up to a
        minute); TooManyLogins when a minute of them is queued already. The right
        token is checked before any wait: it never waits for another's wrong ones."""
        self.metrics.login_failed()
        # By address, for whoever watches for guessing (a proxy's X-Forwarded-For
        # counts only from AGENTBOX_TRUSTED_PROXIES).
        log.warning(said, extra={"client": client_host(scope)})
        await asyncio.sleep(self.throttle.failed(client_of(scope)))  # this request alone

    def login_link(self, base_url: str) -> str:
        """A one-time login link to the page at `base_url` (http://127.0.0.1:8000), on
        its private name."""
        return f"{self.page_url(base_url)}{self.login_path()}"

    def login_path(self) -> str:
        """A new one-time login link's path and query."""
        return f"{LOGIN_LINK_PATH}?code={self.links.make()}"

    def moved(self, request: Request, path: str) -> Response:
        """A browser at 127.0.0.1 or localhost sent on to `path` on the page's private
        name, to log in there: only one that showed the token or a working login link
        is sent (the name is no secret to it), never one that merely asks."""
        return RedirectResponse(self.page_url_of(request) + path, status_code=303,
                                headers={"Cache-Control": "no-store"})

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
        rebinding); everything but OPEN_PATHS needs the token or a session (a page asks
        with `login_page`, the API answers 401)."""
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            response: Response
            if self.open_to_this_machine and self.rebound(scope):
                response = error_response(400, "host_not_allowed", (
                    "agentbox on a loopback address answers only when addressed as "
                    "localhost or a loopback IP (the Host header)."))
            elif scope["path"] == proof.PROOF_PATH:
                response = self.proof(scope)
            elif scope["path"].startswith(OPEN_PATHS) or self.authorised(Request(scope)):
                await app(scope, receive, send)
                return
            elif bearer(Request(scope)) is not None:  # and not the right one
                response = await self.refused_bearer(scope)
            elif (scope["method"] == "GET"
                  and "text/html" in Request(scope).headers.get("accept", "")):
                response = login_page()  # where it was asked: the page's name is not told
            else:
                response = token_required()
            await response(scope, receive, send)
        return guarded

    async def refused_bearer(self, scope: Scope) -> Response:
        """401 for a wrong Bearer token, slowed as a wrong login is; 429 when this
        client has a minute of them queued."""
        if bearer(Request(scope)) is None:
            return token_required()
        try:
            await self.wrong_token(scope, "an admin call with a wrong token was refused")
        except TooManyLogins as exc:
            return error_response(429, "too_many_wrong_tokens", (
                "Too many wrong admin tokens from this client: wait, then send the "
                "right one (agentbox token)."), headers={
                    "Retry-After": str(math.ceil(exc.retry_after))})
        return token_required()

    def proof(self, scope: Scope) -> Response:
        """`GET /.well-known/agentbox-proof?nonce=...`: that this is the user's agentbox,
        shown to a client before it sends the token (agentbox.proof)."""
        nonce = Request(scope).query_params.get("nonce", "")
        found = proof.answer(self._token, nonce, scope.get("server"))
        if found is None:
            return error_response(400, "invalid_nonce", (
                "Send a random nonce of 32 to 128 hexadecimal digits as ?nonce=."))
        return JSONResponse(found, headers={"Cache-Control": "no-store"})

    def rebound(self, scope: Scope) -> bool:
        """The request names another host than this machine: a site whose name now
        points at 127.0.0.1.

        A page open to this machine must not be open to a web site whose name was
        made to point at 127.0.0.1 after the browser loaded it (DNS rebinding):
        the browser would treat agentbox's pages as that site's own, CSRF token
        included. Its requests carry the site's name as their Host, and nothing
        else tells them from a program's: on plain http a browser sends no
        Sec-Fetch headers and a same-origin GET no Origin, and some browsers let
        a page set its User-Agent. So every request must name this machine: a
        loopback address, localhost, AGENTBOX_HOST or the page's private name (other
        names under .localhost, which browsers resolve to loopback themselves, are
        no name of agentbox's either)."""
        host = next((value for name, value in scope["headers"] if name == b"host"), None)
        if host is None:
            return False  # HTTP/1.0 without a Host: no browser sends that
        try:
            name = urlsplit("//" + host.decode("latin-1")).hostname or ""
        except ValueError:
            return True
        name = name.removesuffix(".")
        return not (is_loopback_host(name) or name == self.host.lower()
                    or (self.page_name is not None and name == self.page_name))
