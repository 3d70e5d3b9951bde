"""Agents: async functions that turn an event into a result, found by import string.

    async def my_agent(event: Event, ctx: AgentContext) -> MyResult | dict: ...

An agent raises RetryableAgentError (or anything else) to be retried with
backoff, PermanentAgentError to fail for good. It receives `ctx.run_id` and
must use it as the idempotency key of its own side effects: after a crash a
run may be attempted again, and only its terminal state is exactly-once.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel, ValidationError

from agentbox.config import AgentBinding, ConfigError, Settings, env_name
from agentbox.events import (
    PAYLOAD_MODELS,
    SCHEMA_VERSION,
    Event,
    InvalidEvent,
    parse_event,
    register_event_type,
)

Agent = Callable[[Event, "AgentContext"], Awaitable[Any]]
# An agent's check of an event before it is accepted: its field errors ({loc, msg,
# type}), none when the agent can take it (see `admission`).
Admit = Callable[[Event], Awaitable[list[dict[str, Any]]]]
# Which events an agent's check must see one after another (`admission`'s `serial`).
Serial = Callable[[Event], str | None]
Service = TypeVar("Service")
AgentFunction = TypeVar("AgentFunction", bound=Callable[..., Any])
EMIT_SOURCE = "agentbox"  # the source of events agents emit
_STRICT_JSON = json.JSONEncoder(allow_nan=False)  # json.dumps(allow_nan=False), made once
# Agents that moved: a configuration, or a run stored before the move, may name them
# by their old import string; both names find the same agent. Apps add theirs
# (`rename_agent`) as their module is imported.
RENAMED_AGENTS: dict[str, str] = {}


def rename_agent(old: str, new: str) -> None:
    """An agent that moved from import string `old` to `new`: both find it."""
    RENAMED_AGENTS[old] = new


class AgentError(Exception):
    """Base of the errors agents raise to say how they failed."""

    code = "agent_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class RetryableAgentError(AgentError):
    """Try again later (with backoff) while the retry budget lasts."""

    code = "agent_retryable_error"


class PermanentAgentError(AgentError):
    """Retrying cannot help: the run ends failed_permanent."""

    code = "agent_permanent_error"


class AttemptGivenBack(AgentError):
    """The agent had not started its work when the server began to stop (it was
    waiting for a resource, such as an analysis slot): the attempt is given back
    like one that never started, costing no retry. Raised at any other time, it
    is retried like RetryableAgentError."""

    code = "attempt_given_back"


@dataclass
class AgentContext:
    run_id: str
    attempt: int
    agent: str
    log: logging.LoggerAdapter[logging.Logger]
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    settings: Settings | None = None  # the server's configuration, for agents that need it
    event: Event | None = None  # the event this run handles
    emitted: list[tuple[Event, bytes]] = field(default_factory=list)
    # When the run's time (AGENTBOX_RUN_TIMEOUT_SECONDS) is up, on time.monotonic().
    deadline: float | None = None
    # (event_type, subscribed) as subscribe/unsubscribe were called, in order.
    subscriptions: list[tuple[str, bool]] = field(default_factory=list)
    # What the app lends its agents, by type (the review's analysis processes):
    # objects it owns, starts and stops, shared by every run.
    services: Mapping[type, object] = field(default_factory=dict)
    # Set when this attempt's lease was lost (not renewed by its deadline, or taken by
    # another claim): the agent is then cancelled (asyncio.CancelledError) and its
    # outcome refused. An agent that cleans up on cancellation reads it to know why.
    lease_lost: bool = False

    def service(self, kind: type[Service]) -> Service | None:
        """The app's `kind` of service, or None (a context made elsewhere: the agent
        makes do, as with a context from a test or a script)."""
        found = self.services.get(kind)
        return found if isinstance(found, kind) else None

    def time_left(self) -> float | None:
        """Seconds until the run is cut off as a timeout (None: no limit known).
        Callable from the agent's worker threads too."""
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def emit(self, event_type: str, payload: BaseModel | Mapping[str, Any]) -> str:
        """Publish a follow-up event; returns its event_id.

        It is stored when this run succeeds, in the same transaction as the
        success (so a crash can neither lose it nor emit it twice), and runs the
        agents subscribed to `event_type`. It carries the chain's correlation_id,
        causation_id = this event's id and hop + 1. Raises PermanentAgentError
        (code invalid_emit) when the payload does not validate.
        """
        if self.event is None:
            raise PermanentAgentError("emit() needs the run's event", "invalid_emit")
        parent = self.event.envelope
        event_id = f"{self.run_id}.e{len(self.emitted)}"
        data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
        envelope = {
            "schema_version": SCHEMA_VERSION, "event_id": event_id,
            "idempotency_key": f"{EMIT_SOURCE}:{event_type}:{event_id}",
            "event_type": event_type, "source": EMIT_SOURCE,
            "timestamp": datetime.now(UTC).isoformat(),
            "correlation_id": parent.correlation_id or parent.event_id,
            "causation_id": parent.event_id, "hop": parent.hop + 1, "payload": data,
        }
        try:
            body = json.dumps(envelope, separators=(",", ":")).encode()
            event = parse_event(body)
        except (InvalidEvent, TypeError, ValueError) as exc:
            raise PermanentAgentError(f"emit({event_type!r}): {exc}", "invalid_emit") from None
        self.emitted.append((event, body))
        return event_id


    def subscribe(self, event_type: str) -> None:
        """Receive events of `event_type` from the next event on.

        Like `emit`, it takes effect when this run succeeds, in the same
        transaction (a run that fails or is retried changes nothing), and before
        the events this run emitted are routed. The change lasts until this agent
        changes it again: the configuration's routing is only the starting set.
        Raises PermanentAgentError (code invalid_subscription) for an event type
        agentbox does not know.
        """
        self._change_subscription(event_type, True)

    def unsubscribe(self, event_type: str) -> None:
        """Stop receiving events of `event_type` from the next event on (including
        one this run emits after the call); see `subscribe`."""
        self._change_subscription(event_type, False)

    def _change_subscription(self, event_type: str, subscribed: bool) -> None:
        if event_type not in PAYLOAD_MODELS:
            raise PermanentAgentError(
                f"{'subscribe' if subscribed else 'unsubscribe'}({event_type!r}): unknown "
                f"event type (known: {', '.join(sorted(PAYLOAD_MODELS))})",
                "invalid_subscription")
        self.subscriptions.append((event_type, subscribed))


class Known(Exception):
    """Raised by an admission check: the event is one the agent already has (a file
    identical to one it was sent before). The receiver stores nothing and answers
    with `run_id` as a duplicate, as it answers an idempotency key it knows."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class InvalidAgentOutput(Exception):
    """The agent returned something that is not its result model (or a JSON object)."""


def admission(check: Admit, serial: Serial | None = None
              ) -> Callable[[AgentFunction], AgentFunction]:
    """Give an agent a check the receiver runs before it accepts an event for it:
    an event the agent could never handle (a file that is not there) is refused at
    once with 422 invalid_event and the check's field errors, instead of accepted
    and failed later. The check must be quick (the receiver waits for it): a look,
    not the work. It may instead raise `Known(run_id)`: the event is one the agent
    already has, answered by that run.

    `serial(event)`, when given, names what the check decides against (a project,
    say): events of one name are checked and stored one after another in this
    process, so that a check sees every event of that name accepted before it (two
    sends of one file at once are one run and a duplicate, not two runs).

        async def no_missing_file(event: Event) -> list[dict[str, Any]]: ...

        @admission(no_missing_file)
        async def my_agent(event: Event, ctx: AgentContext) -> Result: ...
    """
    def give(function: AgentFunction) -> AgentFunction:
        setattr(function, "admit", check)  # noqa: B010 - an attribute of the function
        setattr(function, "admit_serial", serial)  # noqa: B010
        return function
    return give


@dataclass(frozen=True)
class AgentSpec:
    name: str  # the import string, stored on each run
    function: Agent
    result_model: type[BaseModel] | None

    @property
    def admit(self) -> Admit | None:
        """The agent's check of an event before it is accepted (`admission`), if any."""
        check = getattr(self.function, "admit", None)
        return check if callable(check) else None

    @property
    def serial(self) -> Serial | None:
        """What the agent's admission check decides against (`admission`), if said."""
        serial = getattr(self.function, "admit_serial", None)
        return serial if callable(serial) else None

    def to_json(self, value: Any) -> dict[str, Any]:
        """Validate an agent's return value into the JSON object stored as the result."""
        try:
            if self.result_model is not None and not isinstance(value, self.result_model):
                value = self.result_model.model_validate(value)
            if isinstance(value, BaseModel):
                dumped: dict[str, Any] = value.model_dump(mode="json")
                return dumped
        except ValidationError as exc:
            raise InvalidAgentOutput(_summarise(exc)) from None
        if not isinstance(value, dict):
            raise InvalidAgentOutput(f"returned {type(value).__name__}, not a model or a dict")
        try:
            result: dict[str, Any] = json.loads(_STRICT_JSON.encode(value))
        except (TypeError, ValueError) as exc:
            raise InvalidAgentOutput(f"result is not JSON: {exc}") from None
        return result


def _summarise(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[:3]
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'result'}: {e['msg']}" for e in first)


def load_agent(target: str) -> AgentSpec:
    """Import `module:function` and check that it is an async function."""
    target = RENAMED_AGENTS.get(target, target)
    module_name, _, attr = target.partition(":")
    where = env_name("agents")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is a configuration error
        raise ConfigError(f"{where}: cannot import {module_name!r}: {exc}") from None
    function: Any = module
    for part in attr.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise ConfigError(f"{where}: {module_name!r} has no {attr!r}")
    if not inspect.iscoroutinefunction(function):
        raise ConfigError(f"{where}: {target} must be an async function (async def)")
    return AgentSpec(target, function, _result_model(function))


def _result_model(function: Callable[..., Any]) -> type[BaseModel] | None:
    try:
        hint = get_type_hints(function).get("return")
    except Exception:  # unresolvable annotations: validate as a plain JSON object
        return None
    return hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None


ENTRY_POINT_GROUP = "agentbox.agents"  # as docs/agents.md says
# Read too: the group releases before this one read (a plugin registered under it
# still loads).
OLD_ENTRY_POINT_GROUPS = ("agentbox.engine.agents",)


@dataclass(frozen=True)
class AgentPlugin:
    """What a package's `agentbox.agents` entry point names: an agent, the event
    types it subscribes to, and the payload models of event types it brings.

        # pyproject.toml of the plugin package
        [project.entry-points."agentbox.agents"]
        stems = "stemcheck.agent:plugin"

        # stemcheck/agent.py
        plugin = AgentPlugin(check_stems, event_types=("stem.bounced",),
                             payload_models={"stem.bounced": StemBounced})
    """

    agent: Agent
    event_types: tuple[str, ...]
    payload_models: Mapping[str, type[BaseModel]] = field(default_factory=dict)


def discover_plugins() -> list[tuple[str, AgentPlugin]]:
    """Every installed `agentbox.agents` entry point (and the former group's), loaded
    and checked; one registered under both groups loads once."""
    found = []
    seen: set[tuple[str, str]] = set()
    entries = [entry for group in (ENTRY_POINT_GROUP, *OLD_ENTRY_POINT_GROUPS)
               for entry in importlib.metadata.entry_points(group=group)]
    for entry in entries:
        if (entry.name, entry.value) in seen:
            continue
        seen.add((entry.name, entry.value))
        try:
            plugin = entry.load()
        except Exception as exc:  # any failure to import is the plugin's configuration error
            raise ConfigError(f"agent plugin {entry.name} ({entry.value}) cannot be loaded: "
                              f"{type(exc).__name__}: {exc}") from None
        if not isinstance(plugin, AgentPlugin):
            raise ConfigError(f"agent plugin {entry.name} ({entry.value}) is not an "
                              "agentbox.engine.agents.AgentPlugin")
        found.append((entry.name, plugin))
    return found


def _plugin_spec(name: str, plugin: AgentPlugin) -> AgentSpec:
    function = plugin.agent
    if not inspect.iscoroutinefunction(function):
        raise ConfigError(f"agent plugin {name}: its agent must be an async function")
    return AgentSpec(f"{function.__module__}:{function.__qualname__}", function,
                     _result_model(function))


class AgentRegistry:
    """Which agents run for which event type (several per type: one run each)."""

    def __init__(self, routes: Mapping[str, Sequence[AgentSpec]]) -> None:
        self._routes = {k: tuple(v) for k, v in routes.items()}
        self._by_name = {spec.name: spec for specs in self._routes.values() for spec in specs}
        self._checks = {k: tuple(check for spec in v if (check := spec.admit) is not None)
                        for k, v in self._routes.items()}
        self._serials = {k: tuple(serial for spec in v if (serial := spec.serial) is not None)
                         for k, v in self._routes.items()}

    @classmethod
    def from_bindings(cls, bindings: Sequence[AgentBinding],
                      plugins: Sequence[tuple[str, AgentPlugin]] | None = None,
                      defaults: Mapping[str, Sequence[str]] | None = None) -> AgentRegistry:
        """The apps' agents (`defaults`: event type -> import strings) and those of
        installed plugins, except that an event type named in `bindings`
        (AGENTBOX_AGENTS) gets exactly the agents named there.

        Modules named in bindings are imported first: they may register event
        types (events.register_event_type) beside their agents.
        """
        plugins = discover_plugins() if plugins is None else plugins
        for name, plugin in plugins:
            for event_type, model in plugin.payload_models.items():
                try:
                    register_event_type(event_type, model)
                except ValueError as exc:
                    raise ConfigError(f"agent plugin {name}: {exc}") from None
        named: dict[str, list[str]] = {}
        for binding in bindings:
            named.setdefault(binding.event_type, []).append(binding.target)
        targets = {k: list(v) for k, v in (defaults or {}).items() if k not in named}
        loaded: dict[str, AgentSpec] = {}
        for target in {t for names in [*named.values(), *targets.values()] for t in names}:
            loaded[target] = load_agent(target)
        routes: dict[str, list[AgentSpec]] = {
            et: [loaded[t] for t in names] for et, names in {**targets, **named}.items()}
        for name, plugin in plugins:
            spec = _plugin_spec(name, plugin)
            for event_type in plugin.event_types:
                if event_type not in named:
                    routes.setdefault(event_type, []).append(spec)
        for event_type in routes:
            if event_type not in PAYLOAD_MODELS:
                known = ", ".join(sorted(PAYLOAD_MODELS))
                raise ConfigError(f"{env_name('agents')}: unknown event type {event_type!r} "
                                  f"(known: {known}); register its payload model beside "
                                  "the agent (agentbox.register_event_type)")
        # The same agent named twice for one type still gets one run.
        return cls({et: list({s.name: s for s in specs}.values())
                    for et, specs in routes.items()})

    def event_types(self) -> list[str]:
        return list(self._routes)

    def agent_names(self) -> list[str]:
        return list(self._by_name)

    def for_event_type(self, event_type: str) -> tuple[AgentSpec, ...]:
        return self._routes.get(event_type, ())

    def checks(self, event_type: str) -> tuple[Admit, ...]:
        """The admission checks of the agents of `event_type` (most types: none)."""
        return self._checks.get(event_type, ())

    def serial_keys(self, event: Event) -> list[str]:
        """The names under which the event's admission and storing wait for others
        (`admission`'s `serial`), sorted, each once: none for most events."""
        keys = {serial(event) for serial in self._serials.get(event.envelope.event_type, ())}
        return sorted(key for key in keys if key is not None)

    async def admit(self, event: Event) -> list[dict[str, Any]]:
        """Every field error the agents of the event's type find in it (`admission`);
        Known when one of them already has it. A check that fails is logged and
        passes: it cannot refuse what it could not look at, and the run says what is
        wrong."""
        errors: list[dict[str, Any]] = []
        for check in self.checks(event.envelope.event_type):
            try:
                errors += await check(event)
            except Known:
                raise
            except Exception:
                logging.getLogger("agentbox.agents").exception("an admission check failed")
        return errors

    def get(self, name: str) -> AgentSpec | None:
        return self._by_name.get(RENAMED_AGENTS.get(name, name))
