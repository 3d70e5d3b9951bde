"""Assemble the ASGI app: store, dispatcher, receiver and API, started by the lifespan."""

from __future__ import annotations

import gc
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbox.apps import App, Host, api_document, default_agents, load_apps
from agentbox.config import ConfigError, Settings, page_name
from agentbox.engine.agents import AgentRegistry
from agentbox.engine.callbacks import CallbackDeliverer, OperatorAlerts
from agentbox.engine.dispatcher import Dispatcher
from agentbox.engine.loop import Services
from agentbox.engine.metrics import Metrics
from agentbox.engine.retention import Retention
from agentbox.engine.subscriptions import Subscriptions
from agentbox.http.access import Access
from agentbox.http.api import RunsApi
from agentbox.http.docs import ManualPages
from agentbox.http.errors import error_response
from agentbox.http.headers import SecurityHeaders, secured
from agentbox.http.pages import StatusPages, TokenGuard, asset
from agentbox.http.receiver import INTERNAL_ERROR_MESSAGE, STORAGE_RETRY_AFTER_SECONDS, Receiver
from agentbox.http.subscriptions_api import SubscriptionsApi
from agentbox.logs import get_logger
from agentbox.runs import SteadyClock
from agentbox.signing import RECEIVER_PATH
from agentbox.store import RemoteChange, StorageUnavailable, StoreError
from agentbox.store.engines import create_store

log = get_logger("app")
GC_YOUNG_THRESHOLD = 10_000  # allocations between collections of the youngest generation
INGEST_SETTLE_SECONDS = 5.0  # at shutdown, for writes still in flight (milliseconds, usually)


class AgentboxServer(Starlette):
    """Starlette, but `POST /webhooks/events` goes straight to the receiver.

    The receiver needs none of the framework's middleware (the path is open to
    senders; it answers its own errors) nor its routing, which on the hot path
    cost about as much as verifying and validating the event. The route stays in
    the table, where other methods get their 405.
    """

    def __init__(self, receiver: ASGIApp, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.receiver = receiver

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] == RECEIVER_PATH):
            scope["app"] = self
            await self.receiver(scope, receive, secured(send))  # past the middleware
            return
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings, admin_token: str, clock: Callable[[], float] | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> AgentboxServer:
    """`clock` times leases, retries and records (default: a SteadyClock, which a
    step of the system clock does not move); `wall_clock` checks signature windows."""
    clock = clock or SteadyClock(wall_clock)
    if not settings.webhook_secret or not settings.callback_secret:
        raise ConfigError("no webhook or callback secret: call ensure_webhook_secret and "
                          "ensure_callback_secret first")
    apps = load_apps(settings)  # their event types and checks of the settings register
    registry = AgentRegistry.from_bindings(settings.agents, defaults=default_agents(apps))
    instance_id = settings.instance_id or f"{socket.gethostname()}:{os.getpid()}"
    owner = f"{instance_id}:{uuid.uuid4().hex[:8]}"  # leases: unique even if names repeat
    store = create_store(settings, settings.callback_retry_schedule[0], owner)
    metrics = Metrics(instance_id, store.engine)
    dispatcher = Dispatcher(store, registry, settings, clock, metrics, owner=owner)
    deliverer = CallbackDeliverer(store, settings, clock, metrics=metrics, owner=owner)
    alerts = OperatorAlerts(store, deliverer, settings.alert_url, clock)
    dispatcher.listeners += [deliverer.on_transition, metrics.transition, alerts.on_transition]
    deliverer.pause_listeners.append(alerts.on_pause)
    subscriptions = Subscriptions(store, deliverer, settings, clock)
    store.outbox_listeners.append(deliverer.wake)
    subscriptions_api = SubscriptionsApi(store, subscriptions, registry, settings, admin_token)
    receiver = Receiver(settings, store, registry, dispatcher, clock, metrics,
                        wall_clock)
    api = RunsApi(store, dispatcher, deliverer, admin_token, metrics, instance_id)
    retention = api.retention = Retention(store, settings, clock,
                                          apps=[app.retain for app in apps])
    access = Access(settings, admin_token, metrics, page_name=page_name(settings))
    pages = StatusPages(settings, store, dispatcher, access)
    manual_pages = ManualPages(pages.env)
    dispatcher.listeners.append(pages.live.transition)
    tables = {schema.line: store.add_tables(schema) for each in apps for schema in each.schemas}
    for schema in (schema for each in apps for schema in each.schemas):
        pages.add_run_fields(schema)  # the run list's columns and filters
    for each in apps:
        pages.add_app_files(each.name, each.templates, each.static)
        each.setup(Host(each, settings=settings, store=store, registry=registry,
                        dispatcher=dispatcher, clock=clock, pages=pages, api=api,
                        receiver=receiver, admin_token=admin_token, tables=tables))
    # Started in this order once the store is open, stopped in the reverse order
    # before it closes: runs stop before what sends their callbacks, the apps last.
    services = Services([*((f"app {each.name}", each) for each in apps),
                         ("callbacks", deliverer), ("subscriptions", subscriptions),
                         ("dispatcher", dispatcher), ("retention", retention)])

    def on_remote_change(change: RemoteChange) -> None:
        """Another instance (same PostgreSQL database) committed runs or callbacks."""
        if change.runs_ready:
            dispatcher.wake()
        if change.outbox_ready:
            deliverer.wake()
        for transition in change.transitions:
            pages.live.transition(transition)

    store.remote_listeners.append(on_remote_change)
    store.remote_transitions_wanted = lambda: bool(pages.live.subscribers)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await store.open()
        except StoreError as exc:  # another agentbox on the data directory, say
            app.state.startup_error = str(exc)  # said in a sentence by the server
            raise
        try:
            await services.start()
        except BaseException:
            await store.close()
            raise
        _quiet_garbage_collector()
        # Said by the server once its port is bound too ("agentbox is ready").
        app.state.ready = {"database": store.description, "instance_id": instance_id}
        try:
            yield
        finally:
            for each in apps:  # no new work (a watched folder's exports) while the rest stops
                await each.stopping()
            # Writes of requests the server cancelled commit first, so that their runs
            # start or are given back (one that commits even later stays leased to
            # this instance until its lease ends, then runs as the next attempt).
            await receiver.settle(INGEST_SETTLE_SECONDS)
            await services.stop()
            await store.close()
            log.info("agentbox stopped")

    app = AgentboxServer(
        receiver,
        routes=[
            Route(RECEIVER_PATH, receiver, methods=["POST"]),
            *(route for each in apps for route in each.routes()),  # before the engine's
            Route("/runs", api.list_runs, methods=["GET"]),
            Route("/runs/{run_id}", api.get_run, methods=["GET"]),
            Route("/runs/{run_id}/replay", api.replay, methods=["POST"]),
            Route("/prune", api.prune, methods=["POST"]),
            Route("/callbacks", api.list_callbacks, methods=["GET"]),
            Route("/callbacks/destinations", api.destinations, methods=["GET"]),
            Route("/callbacks/destinations/resume", api.resume_destination, methods=["POST"]),
            Route("/healthz", api.healthz, methods=["GET"]),
            Route("/subscriptions", subscriptions_api.collection, methods=["GET", "POST"]),
            Route("/subscriptions/{subscription_id}", subscriptions_api.delete,
                  methods=["DELETE"]),
            Route("/subscriptions/{subscription_id}/refresh", subscriptions_api.refresh,
                  methods=["POST"]),
            Route("/", pages.home, methods=["GET"]),
            Route("/ui/runs", pages.runs, methods=["GET"]),
            Route("/ui/runs/{run_id}", pages.run, methods=["GET"]),
            Route("/ui/dead-letters", pages.dead_letters, methods=["GET"]),
            Route("/ui/callbacks", pages.callbacks, methods=["GET"]),
            Route("/ui/stream", pages.stream, methods=["GET"]),
            Route("/ui/static/{name}", asset, methods=["GET"]),
            Route("/static/{app}/{name}", pages.app_asset, methods=["GET"]),
            Route("/ui/replay", pages.replay, methods=["POST"]),
            Route("/ui/discard", pages.discard, methods=["POST"]),
            Route("/ui/login", pages.login, methods=["POST"]),
            Route("/ui/login", pages.login_link, methods=["GET"]),
            Route("/login-links", pages.new_login_link, methods=["POST"]),
            Route("/login-links/{link_id}", pages.login_link_used, methods=["GET"]),
            Route("/ui/logout", pages.logout, methods=["POST"]),
            Route("/metrics", api.metrics, methods=["GET"]),
            Route("/openapi.json", openapi_json(apps), methods=["GET"]),
            Route("/docs", manual_pages.contents, methods=["GET"]),
            Route("/docs/{topic}", manual_pages.topic, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, StorageUnavailable: _storage_error,
                            Exception: _internal_error},
        middleware=[Middleware(SecurityHeaders), Middleware(TokenGuard, pages=pages)],
        lifespan=lifespan,
    )
    app.state.store, app.state.dispatcher, app.state.deliverer = store, dispatcher, deliverer
    app.state.receiver = receiver
    app.state.access = access  # the start-up line's one-time login link
    app.state.apps = {each.name: each for each in apps}
    return app


def openapi_json(apps: Sequence[App]) -> Callable[[Request], Awaitable[Response]]:
    """`GET /openapi.json`: the engine's document with the apps' parts, made once."""
    made = api_document(apps)

    async def answer(request: Request) -> Response:
        return JSONResponse(made)
    return answer


def _quiet_garbage_collector() -> None:
    """Keep full collections short: under load they were the p99 latency.

    Everything alive once started (modules, pydantic schemas, the app) lives
    for the whole process: freezing it takes it out of every collection. The
    youngest generation is collected less often, since each request makes and
    drops a few hundred objects that reference counting frees anyway.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return error_response(exc.status_code, codes.get(exc.status_code, "http_error"),
                          str(exc.detail), headers=dict(exc.headers or {}))


async def _storage_error(request: Request, exc: Exception) -> Response:
    """A read the database could not answer (PostgreSQL down, say): 503, never a 500."""
    return error_response(503, "storage_unavailable", "The store cannot be read right now; "
                          "retry later. /healthz says why.",
                          headers={"Retry-After": str(STORAGE_RETRY_AFTER_SECONDS)})


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc, extra={"path": request.url.path})
    return error_response(500, "internal_error", INTERNAL_ERROR_MESSAGE)
