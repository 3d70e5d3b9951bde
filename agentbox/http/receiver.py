"""`POST /webhooks/events`: verify, validate, check the callback, admit, store, answer.

The order matters: the signature's headers (present, timestamp fresh) are
checked before the body is read, the body's size before it is read whole, the
signature before the body is parsed (unauthenticated senders learn nothing of
the contract), and the 202 is sent only after the store's commit is durable.
No agent work and no outbound calls happen here.

The receiver is a plain ASGI app, served ahead of Starlette's middleware and
routing (the app's `__call__`): on this, the hot path, they cost more than
verifying the signature and validating the event together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.types import Receive, Scope, Send

from agentbox import logs
from agentbox.config import ConfigError, Settings, is_loopback_host, secrets_in_file
from agentbox.engine.agents import AgentRegistry, Known
from agentbox.engine.callbacks import DestinationPolicy, UrlProblem
from agentbox.engine.dispatcher import Dispatcher
from agentbox.engine.handover import Handover
from agentbox.engine.metrics import Metrics
from agentbox.engine.timeouts import within
from agentbox.engine.turns import Turns
from agentbox.events import Event, InvalidEvent, parse_event
from agentbox.http.errors import error_body, send_json
from agentbox.logs import get_logger
from agentbox.signing import SignatureError, Verifier, sender_message_id
from agentbox.store import (
    AdmissionRefused,
    IngestParams,
    IngestResult,
    Lease,
    NoSubscribedAgent,
    RunRef,
    StorageUnavailable,
    Store,
)

log = get_logger("receiver")
SECRET_CHECK_SECONDS = 1.0
ADMISSION_RETRY_AFTER_SECONDS = 5
STORAGE_RETRY_AFTER_SECONDS = 30
MAX_WEBHOOK_ID_CHARS = 256  # a sender's webhook-id is kept up to this many characters
# The runs a duplicate's answer lists at most (an event has one run per agent).
KNOWN_RUNS = 100
# A request refused from its headers: a body this small, there within this time, is
# read and dropped before the answer (see _refused_unread); a larger one is not.
DRAIN_BYTES = 64 * 1024
DRAIN_SECONDS = 0.5
INTERNAL_ERROR_MESSAGE = "agentbox failed to handle this request; the error is in its log."


class Rejected(Exception):
    """A refusal with its exact status code and wire error_code."""

    def __init__(
        self, status: int, code: str, message: str, errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.errors, self.headers = errors, headers

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.errors)


class Receiver:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        registry: AgentRegistry,
        dispatcher: Dispatcher,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.wall_clock = wall_clock  # signature windows: the sender's clock is a wall clock
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher  # starts the runs: claimed as stored when it can
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.verifier = Verifier(settings.webhook_secret, settings.signature_max_age_seconds)
        # Secrets kept in the config dir are read again when the file changes
        # (`agentbox secret rotate` / `retire` need no restart).
        self._secret_file = settings.webhook_secret_file
        self._secret_seen = self._secret_stamp()
        self._secret_checked = time.monotonic()
        # The same rules the callback deliverer applies again before every attempt.
        self.destinations = DestinationPolicy.callbacks(settings)
        # New events' runs go to the dispatcher through it: stored claimed when they
        # can start at once, each write handed over once, cancelled requests' too.
        self.handover = Handover(dispatcher, self._stored)
        self._turns = Turns()  # admission and storing by name (`admission`'s serial)
        # The senders' own ids (webhook-id) of the events being written, by idempotency
        # key, for the line that says each was stored.
        self._webhook_ids: dict[str, str] = {}

    async def settle(self, timeout: float) -> None:
        """Wait for ingests still writing (their requests may have been cancelled by
        the server's shutdown): `Handover.settle`."""
        await self.handover.settle(timeout)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            result = await self._receive(scope, receive)
            status, answer = (200 if result.duplicate else 202), _accepted(result)
        except Rejected as rejected:
            self.metrics.event_refused(rejected.code)
            await send_json(send, rejected.status, rejected.body(), rejected.headers)
            return
        except Exception:  # a bug: say so in the log, answer as the app's other routes do
            log.exception("unhandled error", extra={"path": scope["path"]})
            await send_json(send, 500, error_body("internal_error", INTERNAL_ERROR_MESSAGE))
            return
        await send_json(send, status, answer)

    def _secret_stamp(self) -> tuple[int, int] | None:
        if self._secret_file is None:
            return None
        try:
            found = self._secret_file.stat()
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size

    def _reload_secrets(self) -> None:
        now = time.monotonic()
        if self._secret_file is None or now - self._secret_checked < SECRET_CHECK_SECONDS:
            return
        self._secret_checked = now
        stamp = self._secret_stamp()
        if stamp is None or stamp == self._secret_seen:
            return
        try:
            found = secrets_in_file(self._secret_file)
        except ConfigError:
            return  # keep the secrets we have
        self._secret_seen = stamp
        self.verifier = Verifier(found, self.settings.signature_max_age_seconds)
        log.info("webhook secrets reloaded", extra={"secrets": len(found)})

    async def _receive(self, scope: Scope, receive: Receive) -> IngestResult:
        self._reload_secrets()
        # Names come lower-cased; of a repeated header the last counts (as before, when
        # the verifier read Starlette's headers as a dict).
        headers = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"]}
        try:
            # From the headers first: an unsigned or stale request is refused before
            # its body is read, so it cannot hold a connection for the body's timeout.
            present = self.verifier.check_headers(headers, self.wall_clock())
        except SignatureError as exc:
            raise await _refused_unread(exc, headers, receive) from None
        body = await self._read_body(headers, receive)
        try:
            verified_id = self.verifier.verify(headers, body, self.wall_clock(), present)
        except SignatureError as exc:
            raise Rejected(401, exc.code, exc.message) from None
        return await self.take(body, _webhook_id(verified_id, headers))

    async def take(self, body: bytes, webhook_id: str | None = None) -> IngestResult:
        """Store an event whose sender is vouched for (its signature checked, or an
        app's page or the admin token behind it) and hand its runs over to start:
        the contract, the callback URL, the agents' admission, the store's refusals,
        each a Rejected with its exact status."""
        try:
            event = parse_event(body)
        except InvalidEvent as exc:
            raise Rejected(422, "invalid_event", "The event does not match the v1 contract; "
                           "see errors.", exc.errors) from None
        self._check_callback(event.envelope.callback_url)
        if not self.registry.checks(event.envelope.event_type):
            return await self._store(event, body, webhook_id)
        # Events a check decides by the same name (its `serial`) are checked and
        # stored in turn: the second of two sent at once is checked against the first.
        async with self._turns.of(self.registry.serial_keys(event)):
            try:
                errors = await self.registry.admit(event)
            except Known as known:
                return await self._known(event, known.run_id, body, webhook_id)
            if errors:
                raise Rejected(422, "invalid_event", "An agent for this event cannot take "
                               "it; see errors.", errors)
            return await self._store(event, body, webhook_id)

    async def _known(self, event: Event, run_id: str, body: bytes,
                     webhook_id: str | None) -> IngestResult:
        """An event an agent already has (`Known`): the runs of the event that run
        belongs to (each agent's, as an idempotency key it knows is answered), as a
        duplicate; nothing stored."""
        run = await self.store.get_run(run_id)
        if run is None:  # gone meanwhile (removed): taken as new after all
            return await self._store(event, body, webhook_id)
        order = {spec.name: i for i, spec in
                 enumerate(self.registry.for_event_type(event.envelope.event_type))}
        found = await self.store.search_runs(text=run.event_id, limit=KNOWN_RUNS)
        runs = sorted((r for r in found if r.event_id == run.event_id),
                      key=lambda r: (order.get(r.agent, len(order)), r.run_id)) or [run]
        result = IngestResult(runs=[RunRef(run_id=r.run_id, agent=r.agent, status=r.status)
                                    for r in runs], duplicate=True)
        self._stored(event, result)
        return result

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> bytes:
        limit = self.settings.max_body_bytes
        declared = headers.get("content-length")
        if (declared is not None and declared.isascii() and declared.isdecimal()
                and int(declared) > limit):
            raise _too_large(limit)
        try:
            # A sender that trickles its body (a byte a second) would hold a
            # connection and its buffers for as long as it likes: the whole body
            # must arrive within AGENTBOX_BODY_TIMEOUT_SECONDS.
            return await within(self.settings.body_timeout_seconds, _chunks(receive, limit))
        except TimeoutError:
            raise Rejected(408, "body_timeout",
                           f"The body did not arrive within {self.settings.body_timeout_seconds:g}"
                           " s (AGENTBOX_BODY_TIMEOUT_SECONDS).",
                           headers={"Connection": "close"}) from None

    def _check_callback(self, url: str | None) -> None:
        if url is None:
            return
        problem = self.destinations.check(url)
        if problem is UrlProblem.MALFORMED:
            raise Rejected(422, "invalid_event", "The event does not match the v1 contract; "
                           "see errors.", [{"loc": ["callback_url"], "type": "url_invalid",
                                            "msg": "must be an absolute http(s) URL in ASCII "
                                                   "(an international host name in its xn-- "
                                                   "form, the path percent-encoded)"}])
        if problem is UrlProblem.CREDENTIALS:
            raise Rejected(403, "callback_not_allowed",
                           "callback_url must not carry credentials.")
        if problem is UrlProblem.NOT_ALLOWED:
            parts = urlsplit(url)
            hint = ("" if parts.scheme == "https" or is_loopback_host(parts.hostname or "")
                    else " Callbacks use https (plain http only for a listed loopback origin).")
            raise Rejected(403, "callback_not_allowed",
                           "callback_url's origin is not in AGENTBOX_CALLBACK_ALLOWED." + hint)

    async def _store(self, event: Event, body: bytes,
                     webhook_id: str | None = None) -> IngestResult:
        # The configuration's routing; the store routes by the agents' current
        # subscriptions in the ingest's transaction (no agent at all: no_agent).
        agents = [spec.name for spec in self.registry.for_event_type(event.envelope.event_type)]
        return await self.handover.store(event, len(agents), lambda lease: self._ingest(
            event, body, agents, lease, webhook_id))

    def _stored(self, event: Event, result: IngestResult) -> None:
        """Log and count a committed write (its request may be gone)."""
        env = event.envelope
        webhook_id = self._webhook_ids.pop(env.idempotency_key, None)
        if log.isEnabledFor(logging.INFO):
            run_ids = [run.run_id for run in result.runs]
            # run_id: the (first) run, as the 202 names it, for a search by one field
            said = {"event_id": env.event_id, "event_type": env.event_type,
                    "source": env.source, "run_id": run_ids[0] if run_ids else None,
                    "run_ids": run_ids}
            if webhook_id is not None:
                said["webhook_id"] = webhook_id
            logs.info(log, "event duplicate" if result.duplicate else "event accepted", said)
        if result.duplicate:
            self.metrics.duplicates.inc()
        else:
            self.metrics.event_accepted(env.event_type)

    async def _ingest(self, event: Event, body: bytes, agents: list[str],
                      lease: Lease | None, webhook_id: str | None) -> IngestResult:
        s = self.settings
        key = event.envelope.idempotency_key
        if webhook_id is not None:
            self._webhook_ids[key] = webhook_id  # for `_stored`, which takes it back
        stored = False
        try:
            result = await self.store.ingest(IngestParams(
                event=event, body=body, agents=agents, now=self.clock(),
                ttl=s.idempotency_ttl_seconds, max_pending=s.max_pending,
                max_hops=s.max_hops, lease=lease, webhook_id=webhook_id))
            stored = True
            return result
        except NoSubscribedAgent:
            raise Rejected(422, "no_agent", f"No agent is configured for "
                           f"{event.envelope.event_type} (or every one unsubscribed); see "
                           "AGENTBOX_AGENTS.") from None
        except AdmissionRefused:
            raise Rejected(
                429, "too_many_pending",
                f"{s.max_pending} runs are waiting (AGENTBOX_MAX_PENDING); retry later.",
                headers={"Retry-After": str(ADMISSION_RETRY_AFTER_SECONDS)}) from None
        except StorageUnavailable:
            raise Rejected(503, "storage_unavailable", _unavailable(self.store.last_error),
                           headers={"Retry-After": str(STORAGE_RETRY_AFTER_SECONDS)}) from None
        finally:
            if not stored:
                self._webhook_ids.pop(key, None)  # no line will say it stored


def _webhook_id(verified_id: str | None, headers: dict[str, str]) -> str | None:
    """The sender's own id of the request, if any: the id of the Standard Webhooks set
    that verified (webhook-id or svix-id), else one sent beside a hex signature; kept
    with its event, up to a length that no real id reaches."""
    found = verified_id or sender_message_id(headers)
    return found[:MAX_WEBHOOK_ID_CHARS] if found else None


def _unavailable(why: str | None) -> str:
    """The 503's sentence, with the store's own reason when it knows one (the data
    directory removed, the disk full): the sender's person reads it, not only the page."""
    why = (why or "").removeprefix("storage unavailable: ")
    if not why:
        return "The event store cannot take writes right now; retry later. Nothing was stored."
    return f"The event store cannot take writes: {why}. Nothing was stored."


async def _refused_unread(exc: SignatureError, headers: dict[str, str],
                          receive: Receive) -> Rejected:
    """The 401 of a request its headers already condemn. A small body that is there
    at once is read and dropped first: closing a connection with unread bytes makes
    the kernel reset it, and the reset can reach the sender before the answer does.
    A large, undeclared or trickling one is not waited for: the connection closes."""
    declared = headers.get("content-length", "")
    if declared.isascii() and declared.isdecimal() and int(declared) <= DRAIN_BYTES:
        try:
            await within(DRAIN_SECONDS, _chunks(receive, DRAIN_BYTES))
            return Rejected(401, exc.code, exc.message)
        except (TimeoutError, Rejected):
            pass
    return Rejected(401, exc.code, exc.message, headers={"Connection": "close"})


async def _chunks(receive: Receive, limit: int) -> bytes:
    """The body, read to its end (usually there already, in one message)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Rejected(400, "client_disconnected", "The body ended early.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> Rejected:
    return Rejected(413, "body_too_large",
                    f"The body is larger than {limit} bytes (AGENTBOX_MAX_BODY_BYTES).")


def _accepted(result: IngestResult) -> dict[str, Any]:
    first = result.runs[0]
    return {
        "status": first.status,
        "run_id": first.run_id,
        "duplicate": result.duplicate,
        "status_url": f"/runs/{first.run_id}",
        "runs": [
            {"run_id": r.run_id, "agent": r.agent, "status": r.status,
             "status_url": f"/runs/{r.run_id}"}
            for r in result.runs
        ],
    }
