"""The callback deliverer: sends the outbox's notifications, signed, with retries.

Run transitions write their notifications into the outbox in the same
transaction (see the store). This loop leases due ones, checks the destination
again (allowlist, then every resolved address), signs each attempt afresh and
POSTs it to the address it checked, never to a second lookup of the name.
A 2xx delivers; anything else, a timeout or a connection error schedules the
next attempt from AGENTBOX_CALLBACK_RETRY_SCHEDULE, and the last failure
makes the notification dead (kept and listable). A destination that keeps
failing, or answers 410, is paused until someone resumes it; what is queued
for it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import random
import socket
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from agentbox.addresses import IPAddress, is_public, origin_of, parse_address
from agentbox.config import Settings, is_loopback_host
from agentbox.engine.loop import AGAIN, Loop
from agentbox.engine.metrics import Metrics
from agentbox.logs import get_logger
from agentbox.signing import callback_headers
from agentbox.store import (
    DeliveryResult,
    Notification,
    StorageUnavailable,
    Store,
    Transition,
    iso,
)

log = get_logger("callbacks")
RESPONSE_BODY_CAP_BYTES = 4096  # read this much at most, and never keep it
LEASE_GRACE_SECONDS = 10.0  # a lease outlives the delivery timeout by this much
MAX_RETRY_AFTER_SECONDS = 86_400.0
# Idle, the loop sleeps until the next notification falls due or it is woken (a state
# change that owes a callback, a resumed destination, another instance's notice); the
# longest sleep is a net for what no wake-up reports (see the dispatcher's).
MAX_IDLE_WAIT_SECONDS = 5.0  # a shared database
MAX_LOCAL_IDLE_WAIT_SECONDS = 60.0  # a local store (SQLite)
JITTER = 0.2

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
# A subscription's deliveries go to the destination `subscription:<id>` (see
# agentbox.store.subscriptions); its subscriber's refresh resumes it, not an operator.
SUBSCRIPTION_DESTINATION = "subscription:"


def how_to_resume(destination: str) -> str:
    """What resumes a paused destination, in the words of the operator's alerts."""
    if destination.startswith(SUBSCRIPTION_DESTINATION):
        subscription_id = destination.removeprefix(SUBSCRIPTION_DESTINATION)
        return (f"its subscriber resumes it with a refresh, POST /subscriptions/"
                f"{subscription_id}/refresh (it is verified again, then what waited is sent)")
    return (f"resume it with `agentbox callbacks resume {destination}` (or POST "
            "/callbacks/destinations/resume)")


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, in the resolver's order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = parse_address(str(sockaddr[0]))
        if address is not None and address not in found:
            found.append(address)
    return found


@dataclass(frozen=True)
class Attempt:
    """How one POST went. `error` is None when the destination took it (2xx)."""

    error: str | None
    status_code: int | None = None
    retry_after: float | None = None
    final: bool = False  # no attempt can succeed (its subscription is gone): dead now
    body: bytes = b""  # the answer's first bytes, only when asked for (a verification)


class Signer(Protocol):
    """Another kind of delivery in the outbox (a subscription's): its rules and
    its signature instead of the callbacks'."""

    pause_after_failures: int

    async def prepare(self, notification: Notification, now: float
                      ) -> tuple[DestinationPolicy, dict[str, str]] | Attempt:
        """The policy to check its URL by and its signed headers; or the Attempt
        it ends with unsent."""
        ...


class UrlProblem(enum.Enum):
    """Why a URL given as a destination (an event's callback_url, a subscriber's
    url) is refused; each route says it in its own wire words."""

    MALFORMED = "malformed"  # not an absolute http(s) URL in printable ASCII
    CREDENTIALS = "credentials"  # user:password@ in it
    NOT_ALLOWED = "not_allowed"  # an origin the policy does not allow


class DestinationPolicy:
    """Which callback URLs may be sent to, and at which addresses (the SSRF rules).

    An origin must be allowlisted (AGENTBOX_CALLBACK_ALLOWED or
    AGENTBOX_CALLBACK_ALLOWED_LOCAL). Its host's addresses must all be public,
    except: a loopback origin (127.0.0.1, [::1], localhost) listed explicitly
    may reach loopback addresses only, and an origin listed in
    AGENTBOX_CALLBACK_ALLOWED_LOCAL may reach any unicast address.

    `check` judges a URL when it is given, `refusal` and `permits` again before
    every attempt: the receiver, the subscriptions' routes and the deliverer all
    ask one policy (the callbacks' or the subscriptions').
    """

    fragments = True  # a callback URL may carry a #fragment (it is never sent)

    def __init__(self, allowed: Sequence[str], allowed_local: Sequence[str]) -> None:
        self.local = frozenset(origin_of(o) for o in allowed_local)
        self.allowed = frozenset(origin_of(o) for o in allowed) | self.local

    @classmethod
    def callbacks(cls, settings: Settings) -> DestinationPolicy:
        """The callbacks' policy, by AGENTBOX_CALLBACK_ALLOWED(_LOCAL)."""
        return cls(settings.callback_allowed, settings.callback_allowed_local)

    def check(self, url: str) -> UrlProblem | None:
        """What is wrong with `url` as a destination, or None: its form first, then
        credentials, then its origin (`refusal`)."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (a port out of range raises here)
        except ValueError:  # "http://[": not a URL
            parts = urlsplit("")
        if (parts.scheme not in ("http", "https") or not parts.hostname or not url.isascii()
                or not url.isprintable()  # no control characters (NUL, newlines, ...)
                or (parts.fragment and not self.fragments)):
            return UrlProblem.MALFORMED
        if parts.username is not None or parts.password is not None:
            return UrlProblem.CREDENTIALS
        return UrlProblem.NOT_ALLOWED if self.refusal(url) is not None else None

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be used at all (an error category), or None."""
        return None if self.origin(url) in self.allowed else "destination_not_allowed"

    @staticmethod
    def origin(url: str) -> str | None:
        """The origin of a URL fit to be called (ASCII, no credentials), else None."""
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None or not url.isascii():
            return None
        try:
            return origin_of(url)
        except ValueError:
            return None

    def permits(self, url: str, address: IPAddress) -> bool:
        origin, host = origin_of(url), urlsplit(url).hostname or ""
        if origin in self.local:
            return not (address.is_multicast or address.is_unspecified)
        if is_loopback_host(host):
            return address.is_loopback
        return is_public(address)


class OperatorAlerts:
    """Optional signed POSTs to AGENTBOX_ALERT_URL when a run is dead-lettered or a
    callback destination is paused: through the same outbox, with the same
    signatures, retries and SSRF rules as callbacks."""

    def __init__(self, store: Store, deliverer: CallbackDeliverer, url: str | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.deliverer, self.url, self.clock = store, deliverer, url, clock
        self._tasks: set[asyncio.Task[None]] = set()

    def on_transition(self, t: Transition) -> None:
        if t.status == "dead_lettered":
            self._queue(f"alert:{t.run_id}:dead_lettered:{max(t.attempt - 1, 0)}", t.run_id, {
                "alert": "run_dead_lettered", "run_id": t.run_id, "event_id": t.event_id,
                "event_type": t.event_type, "agent": t.agent, "error_code": t.error_code})

    def on_pause(self, destination: str, reason: str) -> None:
        if self.url is not None and origin_of(self.url) == destination:
            return  # the alert destination itself: nobody to tell
        subscription = destination.removeprefix(SUBSCRIPTION_DESTINATION)
        self._queue(f"alert:paused:{destination}:{int(self.clock())}", "alerts", {
            "alert": "callback_destination_paused", "destination": destination,
            "reason": reason, "resume": how_to_resume(destination),
            **({"subscription_id": subscription} if subscription != destination else {})})

    def _queue(self, notification_id: str, run_id: str, fields: dict[str, Any]) -> None:
        if self.url is None:
            return
        body = json.dumps({"notification_id": notification_id, **fields,
                           "occurred_at": iso(self.clock())},
                          sort_keys=True, separators=(",", ":")).encode()
        task = asyncio.get_running_loop().create_task(self._store(notification_id, run_id, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, notification_id: str, run_id: str, body: bytes) -> None:
        assert self.url is not None
        try:
            await self.store.queue_alert(notification_id, run_id, self.url, body, self.clock())
        except StorageUnavailable:
            log.warning("could not queue an operator alert", extra={"alert": notification_id})
            return
        self.deliverer.wake()


class CallbackDeliverer:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        resolver: Resolver = system_resolver,
        transport: httpx.AsyncBaseTransport | None = None,
        ssl_context: ssl.SSLContext | None = None,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.pause_listeners: list[Callable[[str, str], None]] = []
        self.settings = settings
        self.clock = clock
        self.resolver = resolver
        self.policy = DestinationPolicy.callbacks(settings)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._rng = rng or random.Random()
        timeout = settings.callback_timeout_seconds
        # No proxies from the environment (they would defeat the address check), no
        # redirects, and no kept-alive connections: each one is made to the address
        # just checked, with the TLS name of the URL it is for.
        self._client = httpx.AsyncClient(
            transport=transport or httpx.AsyncHTTPTransport(
                verify=ssl_context or ssl.create_default_context(), trust_env=False,
                limits=httpx.Limits(max_keepalive_connections=0)),
            trust_env=False, follow_redirects=False, timeout=httpx.Timeout(timeout))
        self._inflight: set[asyncio.Task[None]] = set()
        self.loop = Loop("agentbox-callbacks", self._claim_round, clock=clock,
                         max_wait=MAX_IDLE_WAIT_SECONDS if store.shared
                         else MAX_LOCAL_IDLE_WAIT_SECONDS, failure="claiming callbacks failed")
        self.subscriptions: Signer | None = None  # subscriptions' deliveries (set by the app)

    # -- life cycle -----------------------------------------------------------------

    async def start(self, recover_all_leases: bool = True) -> None:
        # Sent by a previous life when it died: send again now (unless other
        # instances share the database: theirs may be in flight).
        if recover_all_leases and not self.store.shared:
            await self.store.release_notification_leases("*", self.clock())
        self.loop.start()

    async def stop(self) -> None:
        """Stop sending. Deliveries cut short stay pending and go out at the next start."""
        await self.loop.stop()
        tasks = list(self._inflight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(StorageUnavailable):
            await self.store.release_notification_leases(self.owner, self.clock())
        await self._client.aclose()

    def wake(self) -> None:
        self.loop.wake()

    def on_transition(self, transition: Transition) -> None:
        if transition.notify:
            self.loop.wake()

    # -- the loop ---------------------------------------------------------------------

    async def _claim_round(self) -> float | None:
        """Lease the notifications due, as many as sends are free, and send each."""
        s = self.settings
        free = s.callback_concurrency - len(self._inflight)
        if free <= 0:
            return None  # a finishing send wakes us
        claimed, due = await self.store.claim_notifications(
            self.owner, free, self.clock(), s.callback_timeout_seconds + LEASE_GRACE_SECONDS)
        for notification in claimed:
            task = asyncio.create_task(self._deliver(notification))
            self._inflight.add(task)
            task.add_done_callback(self._finished)
        return AGAIN if len(claimed) == free else due  # all taken: more may be due

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self.loop.wake()

    async def _deliver(self, notification: Notification) -> None:
        started = time.monotonic()
        try:
            attempt = await self.attempt(notification)
        except Exception:  # a bug: count it as a failed attempt, never lose the row
            log.exception("delivering a callback failed",
                          extra={"notification_id": notification.notification_id})
            attempt = Attempt("internal_error")
        result = self.decide(notification, attempt)
        try:
            paused = await self._record(notification, result)
        except Exception:  # a bug; the lease runs out and the notification goes again
            log.exception("recording a delivery failed",
                          extra={"notification_id": notification.notification_id})
            return
        if self.metrics is not None:
            self.metrics.callbacks.labels(result.state).inc()
        log.info(f"callback {result.state}", extra={
            "notification_id": notification.notification_id, "run_id": notification.run_id,
            "destination": notification.destination, "attempt": notification.attempts + 1,
            "error": result.error, "status_code": result.status_code,
            "duration_ms": round((time.monotonic() - started) * 1000, 3)})
        if paused:
            if notification.subscription_id is not None:  # resumed by a refresh, verified
                log.warning(f"ALERT: subscription {notification.subscription_id} suspended "
                            "after failed deliveries; " + how_to_resume(notification.destination),
                            extra={"subscription_id": notification.subscription_id,
                                   "reason": paused})
            else:
                log.warning("ALERT: callback destination paused; "
                            + how_to_resume(notification.destination),
                            extra={"destination": notification.destination, "reason": paused})
            for listener in self.pause_listeners:
                listener(notification.destination, paused)

    async def _record(self, notification: Notification, result: DeliveryResult) -> str | None:
        delay = 0.1
        while True:
            try:
                pause_after = self.settings.callback_pause_after_failures
                if notification.subscription_id is not None and self.subscriptions:
                    pause_after = self.subscriptions.pause_after_failures
                return await self.store.record_delivery(
                    notification, self.owner, result, self.clock(), pause_after)
            except StorageUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def decide(self, notification: Notification, attempt: Attempt) -> DeliveryResult:
        """The notification's next state after `attempt`, by the retry schedule."""
        if attempt.error is None:
            return DeliveryResult("delivered", status_code=attempt.status_code)
        if attempt.final:
            return DeliveryResult("dead", attempt.error, attempt.status_code)
        schedule = self.settings.callback_retry_schedule
        number = notification.attempts + 1  # this attempt's number
        pause = "gone: the destination answered 410" if attempt.status_code == 410 else None
        if number >= len(schedule):
            return DeliveryResult("dead", attempt.error, attempt.status_code,
                                  pause_reason=pause)
        now = self.clock()
        delay = schedule[number] * self._rng.uniform(1 - JITTER, 1 + JITTER)
        if pause is not None:  # waits, due at once, until the destination is resumed
            delay = 0.0
        elif attempt.retry_after is not None:
            # Never sooner than the destination asked, nor sooner than the schedule: a
            # "Retry-After: 0" loop must not spend the whole schedule in seconds.
            delay = max(delay, attempt.retry_after)
        next_at = now + delay
        return DeliveryResult("pending", attempt.error, attempt.status_code, next_at, pause)

    # -- one POST -----------------------------------------------------------------------

    async def attempt(self, notification: Notification) -> Attempt:
        """Check the destination, resolve it, and POST to the address that passed,
        all within the timeout (so an attempt never outlives its lease)."""
        try:
            async with asyncio.timeout(self.settings.callback_timeout_seconds):
                return await self._attempt(notification)
        except TimeoutError:
            return Attempt("timeout")

    async def _attempt(self, notification: Notification) -> Attempt:
        policy = self.policy
        if notification.subscription_id is not None:
            if self.subscriptions is None:
                return Attempt("subscriptions_unavailable")
            prepared = await self.subscriptions.prepare(notification, self.clock())
            if isinstance(prepared, Attempt):
                return prepared
            policy, signed = prepared
        else:
            signed = callback_headers(self.settings.callback_secret,
                                      notification.notification_id, notification.body,
                                      int(self.clock()))
        return await self.send(notification.url, policy, signed, notification.body)

    async def send(self, url: str, policy: DestinationPolicy, signed: dict[str, str],
                   body: bytes, keep_body: bool = False) -> Attempt:
        """Check `url` by `policy`, resolve it, and POST `body` with the `signed`
        headers to an address that passed (the answer's first bytes kept if asked)."""
        refusal = policy.refusal(url)
        if refusal is not None:
            return Attempt(refusal)
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        literal = parse_address(host)
        if literal is not None:
            addresses: Sequence[IPAddress] = [literal]
        else:
            try:
                addresses = await self.resolver(host, port)
            except (OSError, UnicodeError):
                return Attempt("dns_error")
        if not addresses:
            return Attempt("dns_error")
        if not all(policy.permits(url, address) for address in addresses):
            return Attempt("address_not_allowed")
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "agentbox-callbacks",
            "Host": _host_header(host, parts.port),
            **signed,
        }
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        last = Attempt("connection_error")
        for address in addresses:
            netloc = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
            target = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
            last = await self._post(target, headers, body, extensions, keep_body)
            if last.error != "connection_error":
                break  # only an address that cannot be reached makes us try the next
        return last

    async def _post(self, target: str, headers: dict[str, str], body: bytes,
                    extensions: dict[str, str], keep_body: bool = False) -> Attempt:
        kept = bytearray()
        try:
            async with self._client.stream("POST", target, content=body, headers=headers,
                                           extensions=extensions) as response:
                received = 0
                async for chunk in response.aiter_raw():
                    received += len(chunk)
                    if keep_body:
                        kept += chunk[:RESPONSE_BODY_CAP_BYTES - len(kept)]
                    if received >= RESPONSE_BODY_CAP_BYTES:
                        break
        except httpx.TimeoutException:
            return Attempt("timeout")
        except httpx.ConnectError as exc:
            return Attempt("tls_error" if _caused_by(exc, ssl.SSLError) else "connection_error")
        except httpx.HTTPError:
            return Attempt("protocol_error")
        code = response.status_code
        if 200 <= code < 300:
            return Attempt(None, code, body=bytes(kept))
        retry_after = None
        if code in (429, 503):
            retry_after = retry_after_seconds(response.headers.get("retry-after"), self.clock())
        return Attempt(f"http_{code}", code, retry_after)


def _host_header(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    for _ in range(10):  # the chain is short; the bound guards against a cycle
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """A Retry-After header (seconds or an HTTP date) as seconds from now, bounded."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value)
    else:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)
