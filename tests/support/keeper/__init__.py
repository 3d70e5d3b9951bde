"""An app that keeps a value of each event stored (store/tables.py's Schema.keeps), for
tests/store/test_kept_by_apps.py: what the engine binds for its statements."""

from __future__ import annotations

from typing import Any

from agentbox.events import Event
from agentbox.store.tables import Schema


def kept(event: Event) -> Any:
    """By the event's id: a text, an object (one field left out), or nothing."""
    given: dict[str, Any] = {"scalar": "a text", "object": {"name": "n", "tags": [1, "two"]},
                             "quote": {"name": "it's"}}
    return given.get(event.envelope.event_id.split("-")[0])


SCHEMA = Schema(line="keeper", package="tests.support.keeper", keeps=kept)
