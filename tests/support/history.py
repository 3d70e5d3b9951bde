"""A review's history that answers one question, the agent's only one of it: the
project's previous export. For tests of the review agent alone, with no store; the
real `History` runs on both engines in tests/store/ and through the server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agentbox.archive.history import History
from agentbox.archive.records import ProjectExport

Previous = Callable[[str], Awaitable[ProjectExport | None]]


class PreviousOnly(History):
    def __init__(self, previous: Previous) -> None:  # no tables: nothing else is asked
        self._previous = previous

    async def previous_export(self, project: str, *, agent: str,
                              before_run_id: str) -> ProjectExport | None:
        return await self._previous(project)


def services_with(previous: Previous | None, **more: Any) -> dict[Any, object]:
    """An agent context's services with the previous export `previous` finds."""
    found: dict[Any, object] = dict(more)
    if previous is not None:
        found[History] = PreviousOnly(previous)
    return found
