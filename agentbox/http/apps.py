"""Apps: what a feature brings to the engine, through one hook (docs/apps.md).

The engine (receiver, dispatcher, callbacks, subscriptions, retention, the store's
events, runs and outbox) knows no app by name. An app is an object the
configuration names by import string (`apps`, AGENTBOX_APPS); importing its module
registers its event types (agentbox.events.register_event_type) and its checks of
the settings (agentbox.config.settings_check). `create_app` then gives each app,
in order, the `Host` to `setup` on: its own tables (`Host.tables`), services its
agents receive through their context (`Host.provide`), listeners of run
transitions, templates and filters for its pages. Its `routes` are matched before
the engine's own; `run_page` may tell a run of its agents on the run's page;
`retain` is its share of each retention pass.

    class BackupApp(App):           # every hook has a default that brings nothing
        name = "backup"
        schemas = (SCHEMA,)
        def agents(self): return {"session.exported": ("mypkg.agent:copy",)}
        def setup(self, host): self.copies = Copies(host.tables(SCHEMA))
        def routes(self): return [Route("/copies", self.page)]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from agentbox.config import ConfigError, Settings, check_apps
from agentbox.engine.agents import AgentRegistry
from agentbox.engine.dispatcher import Dispatcher, Listener
from agentbox.engine.retention import REST_RATIO, PruneReport, Retention
from agentbox.store import RunView, Schema, Store, Tables

if TYPE_CHECKING:
    from agentbox.http.api import RunsApi
    from agentbox.http.pages import StatusPages


class App:
    """The hooks of an app, each a default that brings nothing: subclass and
    override what your app brings."""

    name = "app"  # a lowercase word: in logs, and app.state.apps[name]
    # The app's own tables (agentbox.store.Schema): migrated with the store's, by the
    # server, `agentbox migrate` and `agentbox prune` alike.
    schemas: ClassVar[Sequence[Schema]] = ()

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

    async def run_page(self, request: Request, run_id: str, run: RunView | None
                       ) -> Response | None:
        """The page of run `run_id` (`run`: None when no run has that id), when this app
        tells it in its own words; None: the engine's page (or its 404)."""
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


@dataclass
class Host:
    """What the engine lends an app's `setup`."""

    settings: Settings
    store: Store
    registry: AgentRegistry
    dispatcher: Dispatcher
    clock: Callable[[], float]
    pages: StatusPages  # templates (add_templates, env), banners, CSRF, run pages
    api: RunsApi  # the JSON API's hooks: file_namers, removed_notes
    admin_token: str = field(repr=False)
    _tables: dict[str, Tables] = field(default_factory=dict)

    def tables(self, schema: Schema) -> Tables:
        """The app's handle on its tables (store/tables.py), migrated when the store
        opens (declare the schema in `App.schemas` too, for `agentbox migrate`)."""
        if schema.line not in self._tables:
            self._tables[schema.line] = self.store.add_tables(schema)
        return self._tables[schema.line]

    def provide(self, kind: Any, service: object) -> None:
        """Lend `service` to every agent (AgentContext.service(kind)), and to the apps
        set up after this one (`Host.service`)."""
        self.dispatcher.services[kind] = service

    def service(self, kind: Any) -> Any:
        """A service an app set up before this one provided (None: none did)."""
        return self.dispatcher.services.get(kind)

    def on_transition(self, listener: Listener) -> None:
        """Told of every run transition of this instance, as it commits."""
        self.dispatcher.listeners.append(listener)


def load_apps(settings: Settings) -> list[App]:
    """The settings' apps, imported and checked (agentbox.config.check_apps)."""
    apps = check_apps(settings)
    for app in apps:
        if not isinstance(app, App):
            raise ConfigError(f"AGENTBOX_APPS: {app!r} is not an agentbox.http.apps.App")
    names = [app.name for app in apps]
    if len(set(names)) != len(names):
        raise ConfigError(f"AGENTBOX_APPS: two apps are named alike ({', '.join(names)})")
    return apps


def default_agents(apps: Sequence[App]) -> dict[str, tuple[str, ...]]:
    """Each event type's agents as the apps bring them, in the apps' order."""
    found: dict[str, list[str]] = {}
    for app in apps:
        for event_type, targets in app.agents().items():
            have = found.setdefault(event_type, [])
            have.extend(target for target in targets if target not in have)
    return {event_type: tuple(targets) for event_type, targets in found.items()}


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
