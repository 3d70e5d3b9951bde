"""Agents for the end-to-end tests, loaded by a real `agentbox serve` subprocess
through AGENTBOX_AGENTS. Their behaviour is chosen by the event's project_id, so
one server can host every scenario:

    ok              succeed at once
    fail-N          raise RetryableAgentError on attempts 1..N, then succeed
    always-fail     raise RetryableAgentError every time
    permanent       raise PermanentAgentError
    bad-output      return something that is not a JSON object
    sleep-S         sleep S seconds, then succeed
    slow-return-S   succeed, but the result takes S seconds to serialise: a window
                    between the agent's return and the state write

Every start and every return is appended (fsynced) to the file named by
AGENTBOX_TEST_JOURNAL, so tests can tell which attempts ran and when.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from pydantic import BaseModel, field_serializer

from agentbox import (
    AgentContext,
    Event,
    PermanentAgentError,
    RetryableAgentError,
    register_event_type,
)


def journal(kind: str, ctx: AgentContext) -> None:
    path = os.environ.get("AGENTBOX_TEST_JOURNAL")
    if not path:
        return
    line = json.dumps({"kind": kind, "run_id": ctx.run_id, "attempt": ctx.attempt,
                       "pid": os.getpid(), "t": time.time(),
                       "lease_lost": ctx.lease_lost}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class SlowResult(BaseModel):
    project_id: str
    delay: float

    @field_serializer("delay")
    def _stall(self, delay: float) -> float:
        time.sleep(delay)  # blocks the loop on purpose: the crash window after return
        return delay


async def scripted(event: Event, ctx: AgentContext) -> Any:
    project = event.payload.project_id
    journal("start", ctx)
    try:
        if project.startswith("fail-") and ctx.attempt <= int(project.removeprefix("fail-")):
            raise RetryableAgentError(f"scripted failure on attempt {ctx.attempt}")
        if project == "always-fail":
            raise RetryableAgentError("scripted failure, every time")
        if project == "permanent":
            raise PermanentAgentError("scripted permanent failure", code="scripted_permanent")
        if project == "bad-output":
            return ["not", "an", "object"]
        if project == "review-lookalike":  # a result with a mix review's key names only
            return {"metrics": {"bpm": 120, "short_term_lufs": ["-14"]},
                    "profile": {"name": "house"}, "summary": 3, "review_notes": 5}
        if project.startswith("sleep-"):
            await asyncio.sleep(float(project.removeprefix("sleep-")))
        if project.startswith("slow-return-"):
            journal("return", ctx)
            return SlowResult(project_id=project, delay=float(project.removeprefix("slow-return-")))
        journal("return", ctx)
        return {"project_id": project, "attempt": ctx.attempt}
    except BaseException:
        journal("raise", ctx)
        raise


async def second(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """A second subscriber, for fan-out tests."""
    return {"agent": "second", "project_id": event.payload.project_id}


def not_async(event: Event, ctx: AgentContext) -> None:
    """Misconfiguration bait: agents must be async."""


# -- agent chains: two event types of the tests' own, and agents that bounce them -------------


class Ping(BaseModel):
    """chain.ping / chain.pong payloads (registered below, as a plugin author would)."""

    label: str


register_event_type("chain.ping", Ping)
register_event_type("chain.pong", Ping)


async def ping_agent(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """Handles chain.ping, answers with chain.pong."""
    emitted = ctx.emit("chain.pong", Ping(label=event.payload.label))
    return {"emitted": emitted}


async def pong_agent(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """Handles chain.pong, answers with chain.ping: ping -> pong -> ping is a loop."""
    emitted = ctx.emit("chain.ping", {"label": event.payload.label})
    return {"emitted": emitted}


HOLD_SECONDS = 120  # the most `held` waits for its file


async def held(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """Handles chain.ping: runs until the file its label names exists (a test's way
    to keep the only worker busy, so that the runs accepted meanwhile wait queued)."""
    journal("start", ctx)
    deadline = time.monotonic() + HOLD_SECONDS
    while not os.path.exists(event.payload.label):
        if time.monotonic() > deadline:
            raise PermanentAgentError(f"{event.payload.label} never came", code="not_released")
        await asyncio.sleep(0.05)
    journal("return", ctx)
    return {"released": event.payload.label}


async def bad_emitter(event: Event, ctx: AgentContext) -> dict[str, Any]:
    ctx.emit("chain.pong", {"label": 5})  # not a string: the payload does not validate
    return {}


async def always_permanent(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """A third subscriber that always fails, for fan-out tests."""
    raise PermanentAgentError("this agent never succeeds", code="scripted_permanent")


async def subscribing(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """Changes its own subscriptions by the event's project_id: `unsubscribe` or
    `subscribe` (to session.exported), `subscribe-pong` (to chain.pong), succeeding;
    `unsubscribe-then-fail` unsubscribes, then fails every attempt (the change must
    never land). A chain.pong it subscribed to succeeds with its label."""
    journal("start", ctx)
    if event.envelope.event_type == "chain.pong":
        return {"agent": "subscribing", "label": event.payload.label}
    project = event.payload.project_id
    if project.startswith("unsubscribe"):
        ctx.unsubscribe("session.exported")
    elif project == "subscribe":
        ctx.subscribe("session.exported")
    elif project == "subscribe-pong":
        ctx.subscribe("chain.pong")
    if project == "unsubscribe-then-fail":
        raise RetryableAgentError("changed my mind")
    journal("return", ctx)
    return {"agent": "subscribing", "project_id": project}


async def chatty(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """Writes outside the log, as agents do: print() (a line in pieces, one from a
    thread it starts), warnings.warn, a library's logger, a stray stderr write."""
    import logging
    import sys
    import warnings

    print("printed by", ctx.run_id, end="")
    print(" (the rest of the line)")
    await asyncio.to_thread(print, f"printed in a thread for {ctx.run_id}")
    warnings.warn(f"a warning of {ctx.run_id}", UserWarning, stacklevel=1)
    logging.getLogger("somelibrary.client").warning("a library says %s", ctx.run_id)
    sys.stderr.write(f"written to stderr by {ctx.run_id}\n")
    return {"chatted": True}
