"""agentbox: a local appliance for event-driven AI agents.

The agent API lives here::

    from agentbox import AgentContext, Event, PermanentAgentError, RetryableAgentError
"""

from agentbox.engine.agents import (
    AgentContext,
    AgentPlugin,
    PermanentAgentError,
    RetryableAgentError,
    admission,
)
from agentbox.events import Event, register_event_type

__all__ = [
    "AgentContext",
    "AgentPlugin",
    "Event",
    "PermanentAgentError",
    "RetryableAgentError",
    "admission",
    "register_event_type",
]
