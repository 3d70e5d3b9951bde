"""Apps: what a feature brings to the engine, through one hook (docs/apps.md).

The engine (receiver, dispatcher, callbacks, subscriptions, retention, the store's
events, runs and outbox) knows no app by name. An app is an object the
configuration names by import string (`apps`, AGENTBOX_APPS); importing its module
registers its event types (agentbox.events.register_event_type) and its checks of
the settings (agentbox.config.settings_check). The server then gives each app, in
order, its `Host` to `setup` on: its tables, services its agents receive through
their context, listeners of run transitions, its templates, static files, menu link,
its part of a run's page, of the live figures, of the API's answers. Its `routes` are
matched before the engine's own; `retain` is its share of each retention pass.

    class BackupApp(App):           # every hook has a default that brings nothing
        name = "backup"
        schemas = (SCHEMA,)
        def agents(self): return {"session.exported": ("mypkg.agent:copy",)}
        def setup(self, host): self.copies = Copies(host.tables())
        def routes(self): return [Route("/copies", self.page)]
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from agentbox.config import ConfigError, Settings, check_apps, env_name
from agentbox.engine.agents import AgentRegistry
from agentbox.engine.dispatcher import Dispatcher, Listener
from agentbox.engine.retention import REST_RATIO, PruneReport, Retention
from agentbox.events import PAYLOAD_MODELS
from agentbox.http.openapi import ApiPart, document
from agentbox.store import IngestResult, RunView, Schema, Store, Tables

if TYPE_CHECKING:
    from agentbox.http.api import RunsApi
    from agentbox.http.pages import StatusPages
    from agentbox.http.receiver import Receiver

T = TypeVar("T")
APP_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")  # a path segment, a template folder, a log word

# An app's page of a run: None when the run is not one its agents tell.
RunPage = Callable[[Request, str, "RunView | None"], Awaitable["Response | None"]]
# The file an event's payload names (a run's `file` in the API), or None.
FileNamer = Callable[[Mapping[str, Any]], "str | None"]
# What the API says of a run id retention removed: where the app kept it, or None.
RemovedNote = Callable[[str], Awaitable["str | None"]]


class App:
    """The hooks of an app, each a default that brings nothing: subclass and
    override what your app brings."""

    # A lowercase word: in logs, errors, and the prefix of its files (/static/<name>/,
    # templates "<name>/...").
    name = "app"
    # The app's own tables (agentbox.store.Schema): migrated with the store's, by the
    # server, `agentbox migrate` and `agentbox prune` alike; `Host.tables` hands them.
    schemas: ClassVar[Sequence[Schema]] = ()
    # The apps (by name) this one stands on: whose event types its agents take, whose
    # services it borrows. Each must be in the configuration's apps, before this one.
    requires: ClassVar[Sequence[str]] = ()
    # Folders of the app's package: its templates (named "<name>/<file>" on the pages)
    # and static files (served at /static/<name>/<file>). None: it has none.
    templates: ClassVar[Path | None] = None
    static: ClassVar[Path | None] = None

    def agents(self) -> Mapping[str, Sequence[str]]:
        """The agents (import strings) this app runs for each event type, unless the
        configuration names that type's agents (AGENTBOX_AGENTS) itself."""
        return {}

    def setup(self, host: Host) -> None:
        """Make the app's objects (once, as the server is assembled, before the store
        opens): tables, services, listeners, pages."""

    def routes(self) -> Sequence[BaseRoute]:
        """The app's routes; matched before the engine's (an app may own `/`)."""
        return []

    def api(self) -> ApiPart | None:
        """The app's part of the OpenAPI document (`/openapi.json`): its answers'
        models and its paths."""
        return None

    async def start(self) -> None:
        """Once the store is open, before any run starts."""

    async def stopping(self) -> None:
        """As the server begins to stop, before anything else stops: bring no new work."""

    async def stop(self) -> None:
        """Once runs have stopped, before the store closes."""

    async def retain(self, report: PruneReport) -> None:
        """The app's share of a retention pass, after the store's steps (a dry one too:
        `report.dry_run`): hold its own bounds, say what it kept or let go
        (`report.counts`, `report.notes`)."""

    async def retain_alone(self, tables: Mapping[str, Tables], settings: Settings,
                           report: PruneReport, own_files: bool) -> None:
        """As `retain`, for `agentbox prune` with no server running (`setup` was not
        called): `tables` by line; `own_files`: this process may bound the app's files
        (a SQLite store; on PostgreSQL each running instance bounds its own)."""


class Host:
    """What the engine lends one app's `setup`: the one door between them."""

    def __init__(self, app: App, *, settings: Settings, store: Store, registry: AgentRegistry,
                 dispatcher: Dispatcher, clock: Callable[[], float], pages: StatusPages,
                 api: RunsApi, receiver: Receiver, admin_token: str,
                 tables: Mapping[str, Tables]) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher
        self.clock = clock
        self.pages = pages  # templates (env), page(), error(), run_context(), access, csrf
        self.admin_token = admin_token
        self._api = api
        self._receiver = receiver
        self._tables = tables

    def __repr__(self) -> str:  # the admin token stays out of logs
        return f"Host({self.app.name!r})"

    # -- its data --------------------------------------------------------------------------

    def tables(self, schema: Schema | None = None) -> Tables:
        """The handle on the app's tables (store/tables.py), migrated when the store
        opens: those of `App.schemas` (None: its only one)."""
        own = [each for each in self.app.schemas if schema is None or each is schema]
        if len(own) == 1:
            return self._tables[own[0].line]
        name = self.app.name
        if schema is not None:
            raise ConfigError(f"the app {name!r} asks for the tables of the line "
                              f"{schema.line!r}, which is not in its App.schemas: add it there")
        raise ConfigError(f"the app {name!r} has " + ("no tables: declare their Schema in "
                          "App.schemas" if not own else "several lines of tables: name one, "
                          "host.tables(SCHEMA)"))

    # -- its agents' services --------------------------------------------------------------

    def provide(self, kind: type[T], service: T) -> None:
        """Lend `service` to every agent (AgentContext.service(kind)), and to the apps
        set up after this one (`Host.service(kind)`)."""
        self.dispatcher.services[kind] = service

    def service(self, kind: type[T]) -> T | None:
        """What an app set up before this one provided as `kind` (None: none did)."""
        found = self.dispatcher.services.get(kind)
        return found if isinstance(found, kind) else None

    def on_transition(self, listener: Listener) -> None:
        """Told of every run transition of this instance, as it commits."""
        self.dispatcher.listeners.append(listener)

    async def take(self, body: bytes) -> IngestResult:
        """Store an event the app vouches for (a form of its page, a call with the
        admin token: no webhook signature) and start its runs, as the receiver does a
        signed one. agentbox.http.receiver.Rejected (its `status`, `code`, `message`,
        `errors`) when it is not taken."""
        return await self._receiver.take(body)

    # -- its pages ------------------------------------------------------------------------

    def add_run_page(self, page: RunPage) -> None:
        """Tell the runs of the app's agents on their page, in its own words: asked
        before the engine's page, in the apps' order; None lets the next one tell it."""
        self.pages.run_pages.append(page)

    def add_menu_link(self, label: str, href: str, area: str | None = None) -> None:
        """A link in every page's menu, before the engine's (Operations, Manual); shown
        as the current one on the app's pages (those of its templates; `area`: default
        the app's name, `pages.page(..., area=)` names it)."""
        area = area or self.app.name
        self.pages.menu.append({"label": label, "href": href, "area": area,
                                "id": f"nav-{area}", "app": self.app.name})

    def add_run_field_link(self, name: str, link: Callable[[str], str]) -> None:
        """Link each value of the app's run field `name` (its tables' `run_fields`: a
        column of the run list) to the page `link(value)`."""
        if not any(name in schema.run_fields for schema in self.app.schemas):
            raise ConfigError(f"the app {self.app.name!r} links the run field {name!r}, "
                              "which none of its App.schemas' run_fields names")
        self.pages.link_run_field(name, link)

    def add_stats(self, figures: Callable[[], dict[str, Any]]) -> None:
        """Figures added to the live stream's `stats` (every page gets them)."""
        self.pages.stats_extras.append(figures)

    # -- its say in the API ----------------------------------------------------------------

    def add_file_namer(self, namer: FileNamer) -> None:
        """Read the file an event's payload names: a run's `file` in the API."""
        self._api.file_namers.append(namer)

    def add_removed_note(self, note: RemovedNote) -> None:
        """Say where the app kept a run retention removed (the API's 404 tells it)."""
        self._api.removed_notes.append(note)


def load_apps(settings: Settings) -> list[App]:
    """The settings' apps, imported and checked (agentbox.config.check_apps): each an
    App, named alike by none, with every app it requires before it."""
    apps = check_apps(settings)
    where = env_name("apps")
    for app in apps:
        if not isinstance(app, App):
            raise ConfigError(f"{where}: {app!r} is not an agentbox.apps.App")
        if not APP_NAME.fullmatch(app.name):
            raise ConfigError(f"{where}: the app name {app.name!r} is not a lowercase word "
                              "(letters, digits, _; at most 40)")
    names = [app.name for app in apps]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: two apps are named alike ({', '.join(names)})")
    for i, app in enumerate(apps):
        for needed in app.requires:
            if needed in names[i + 1:]:
                raise ConfigError(f"the app {app.name!r} requires the app {needed!r}, which "
                                  f"{where} lists after it: list the app {needed!r} "
                                  f"before {app.name!r}")
            if needed not in names:
                raise ConfigError(f"the app {app.name!r} requires the app {needed!r}, which "
                                  f"{where} does not run: add the app {needed!r} to "
                                  f"{where}, before {app.name!r}")
    return apps


def default_agents(apps: Sequence[App]) -> dict[str, tuple[str, ...]]:
    """Each event type's agents as the apps bring them, in the apps' order. An app's
    event type no app registered is the app's error, said with the app's name."""
    found: dict[str, list[str]] = {}
    for app in apps:
        for event_type, targets in app.agents().items():
            if event_type not in PAYLOAD_MODELS:
                raise ConfigError(
                    f"the app {app.name!r} runs agents for the event type {event_type!r}, "
                    "which no app registers: if another app brings it, add that app to "
                    f"{env_name('apps')} and name it in {type(app).__name__}.requires; "
                    "else register its payload model (agentbox.register_event_type)")
            have = found.setdefault(event_type, [])
            have.extend(target for target in targets if target not in have)
    return {event_type: tuple(targets) for event_type, targets in found.items()}


def api_document(apps: Sequence[App]) -> dict[str, Any]:
    """The OpenAPI document of the engine and these apps."""
    return document([part for app in apps if (part := app.api()) is not None])


def schemas_of(settings: Settings) -> list[Schema]:
    """Every table schema of the settings' apps (for `agentbox migrate`)."""
    return [schema for app in load_apps(settings) for schema in app.schemas]


async def prune_alone(settings: Settings, dry_run: bool = False,
                      clock: Callable[[], float] = time.time) -> PruneReport:
    """`agentbox prune` on a store no server of this machine holds: a stopped SQLite
    store, or PostgreSQL (beside running instances: its steps take their locks as
    theirs do, and rest as the servers' do). StoreInUse: a server holds the
    SQLite file; ask it (POST /prune). The apps keep what they keep of removed runs
    (their tables are the store's to migrate and prune with), and on SQLite hold
    their own bounds too."""
    from agentbox.store.engines import create_store

    apps = load_apps(settings)
    store = create_store(settings, settings.callback_retry_schedule[0], "agentbox-prune")
    tables = {schema.line: store.add_tables(schema) for app in apps for schema in app.schemas}
    await store.open()
    try:
        shares = [_alone(app, tables, settings, not store.shared) for app in apps]
        retention = Retention(store, settings, clock,
                              rest_ratio=REST_RATIO if store.shared else 0.0, apps=shares)
        return await retention.prune(dry_run=dry_run)
    finally:
        await store.close()


def _alone(app: App, tables: Mapping[str, Tables], settings: Settings, own_files: bool
           ) -> Callable[[PruneReport], Any]:
    async def share(report: PruneReport) -> None:
        await app.retain_alone(tables, settings, report, own_files)
    return share
