"""agentbox: a local appliance for event-driven AI agents.

The agent API lives here::

    from agentbox import AgentContext, Event, PermanentAgentError, RetryableAgentError

Its names load when first asked for (PEP 562), so that a program importing any part
of agentbox (the CLI's `agentbox --version`, say) does not pay for the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentbox.engine.agents import (
        AgentContext,
        AgentPlugin,
        PermanentAgentError,
        RetryableAgentError,
        admission,
    )
    from agentbox.events import Event, register_event_type

# Each name of the agent API, and the module it comes from.
_HOMES = {"AgentContext": "agentbox.engine.agents", "AgentPlugin": "agentbox.engine.agents",
          "PermanentAgentError": "agentbox.engine.agents",
          "RetryableAgentError": "agentbox.engine.agents", "admission": "agentbox.engine.agents",
          "Event": "agentbox.events", "register_event_type": "agentbox.events"}

__all__ = [
    "AgentContext",
    "AgentPlugin",
    "Event",
    "PermanentAgentError",
    "RetryableAgentError",
    "admission",
    "register_event_type",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'agentbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
