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
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import BaseModel, ValidationError

from agentbox.config import AgentBinding, ConfigError, Settings, env_name
from agentbox.events import PAYLOAD_MODELS, Event

Agent = Callable[[Event, "AgentContext"], Awaitable[Any]]

BUILTIN_AGENTS: dict[str, tuple[str, ...]] = {
    "session.exported": ("agentbox.mix_review:mix_review",),
    "mix.review_requested": ("agentbox.mix_review:mix_review",),
}


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


@dataclass
class AgentContext:
    run_id: str
    attempt: int
    agent: str
    log: logging.LoggerAdapter[logging.Logger]
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    settings: Settings | None = None  # the server's configuration, for agents that need it


class InvalidAgentOutput(Exception):
    """The agent returned something that is not its result model (or a JSON object)."""


@dataclass(frozen=True)
class AgentSpec:
    name: str  # the import string, stored on each run
    function: Agent
    result_model: type[BaseModel] | None

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
            result: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidAgentOutput(f"result is not JSON: {exc}") from None
        return result


def _summarise(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[:3]
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'result'}: {e['msg']}" for e in first)


def load_agent(target: str) -> AgentSpec:
    """Import `module:function` and check that it is an async function."""
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


class AgentRegistry:
    """Which agents run for which event type (several per type: one run each)."""

    def __init__(self, routes: Mapping[str, Sequence[AgentSpec]]) -> None:
        self._routes = {k: tuple(v) for k, v in routes.items()}
        self._by_name = {spec.name: spec for specs in self._routes.values() for spec in specs}

    @classmethod
    def from_bindings(cls, bindings: Sequence[AgentBinding]) -> AgentRegistry:
        """Built-in routes, with each event type named in `bindings` replaced by those."""
        targets: dict[str, list[str]] = {k: list(v) for k, v in BUILTIN_AGENTS.items()}
        named: dict[str, list[str]] = {}
        for binding in bindings:
            named.setdefault(binding.event_type, []).append(binding.target)
        targets.update(named)
        for event_type in targets:
            if event_type not in PAYLOAD_MODELS:
                known = ", ".join(sorted(PAYLOAD_MODELS))
                raise ConfigError(f"{env_name('agents')}: unknown event type {event_type!r} "
                                  f"(known: {known})")
        loaded: dict[str, AgentSpec] = {}
        for target in {t for names in targets.values() for t in names}:
            loaded[target] = load_agent(target)
        # dict.fromkeys: the same agent named twice for one type still gets one run.
        return cls({et: [loaded[t] for t in dict.fromkeys(names)] for et, names in targets.items()})

    def for_event_type(self, event_type: str) -> tuple[AgentSpec, ...]:
        return self._routes.get(event_type, ())

    def get(self, name: str) -> AgentSpec | None:
        return self._by_name.get(name)
