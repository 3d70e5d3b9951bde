"""What counts as a render: one rule for every door that sends a file for review
(`agentbox watch`, the server's watched folders, `agentbox send`, the page's drop
box and `POST /exports`, a signed event naming a local file).

A render is known by its bytes against its project's history:

- bytes identical to the project's latest export are that export: nothing new is
  stored, and the answer names it (`duplicate: true`, its `run_id`), however the
  file came (a touch, a watcher restarted, the same file given again on the page);
- bytes identical to an older export are a new export (a musician going back to an
  old version), which the project's list marks `same_audio_as` that one;
- anything else is a new export.

The project's latest export is its newest render: a re-judgment (a new judgment
of an export it has) is not one. Its bytes are known from its admission on: the
check reads each render's bytes (their size and SHA-256), and the ingest keeps them
with its run (the review's `run_projects`), so that the same bytes sent again while
the latest export is still queued or being reviewed are that export too. A run
stored before the review kept them is known by its review's `file.sha256`.

The receiver asks through the review agent's admission check (`identify`), which
raises `Known` for a file that is the latest export. Renders of one project are
checked and stored one after another (`serial`: the admission's turn is the
project's), so two sends of the same bytes at once are one export and its
duplicate, whichever door each came by.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentbox.archive import blobs
from agentbox.archive.history import ADMITTED, History
from agentbox.archive.records import ProjectExport
from agentbox.engine.agents import Known
from agentbox.events import Event
from agentbox.review.contract import MIX_REVIEW

NEW_RENDER_EVENT = "session.exported"  # the event a render arrives as, from every door
LOOK_BACK = 20  # exports read to find the latest render past a project's re-judgments

_history: History | None = None  # the review's, given at the app's setup (`know`)


def know(history: History | None) -> None:
    """The history the admission check reads (None: it knows no export)."""
    global _history
    _history = history


def heard(result: Any) -> tuple[int, str] | None:
    """The size and SHA-256 of the bytes a review heard, if its result says."""
    file = result.get("file") if isinstance(result, dict) else None
    if not isinstance(file, dict):
        return None
    size, sha = file.get("size_bytes"), file.get("sha256")
    return (size, sha) if isinstance(size, int) and isinstance(sha, str) and sha else None


def is_rejudgment(export: ProjectExport) -> bool:
    """A new judgment of an export the project has, not a render of its own."""
    return isinstance(export.result, dict) and bool(export.result.get("rejudge_of"))


async def latest_render(history: History, project: str) -> ProjectExport | None:
    """The project's newest export that is a render (not a re-judgment), or None."""
    for export in await history.project_exports(project, agent=MIX_REVIEW, limit=LOOK_BACK):
        if not is_rejudgment(export):
            return export
    return None


async def latest_digest(history: History, latest: ProjectExport) -> tuple[int, str] | None:
    """The size and SHA-256 of the latest export's bytes: as its review heard them, or
    as its admission read them (its review not done yet), or None (not known)."""
    return heard(latest.result) or await history.admitted_digest(latest.run_id)


async def read(path: Path) -> tuple[int, str] | None:
    """The size and SHA-256 of a file's bytes, read as the review reads them
    (`blobs.fingerprint`: the regular file itself, never a pipe whose read could wait
    for ever, nor what a link points to). None: it cannot be read, or was written to
    while it was read; the review says what is wrong with it."""
    try:
        found = await asyncio.to_thread(blobs.fingerprint, path)
    except OSError:
        return None
    return found.size, found.sha256


def project_of(event: Event) -> str | None:
    """The project of a render (None: the event is no render, or names none)."""
    if event.envelope.event_type != NEW_RENDER_EVENT:
        return None
    project = getattr(event.payload, "project_id", None)
    return project if isinstance(project, str) and project else None


def serial(event: Event) -> str | None:
    """The name under which renders are admitted in turn: their project's."""
    project = project_of(event)
    return None if project is None else f"render:{project}"


async def identify(event: Event, path: Path) -> None:
    """The rule, as the admission check applies it: Known(run_id) when the event's
    file is its project's latest export; otherwise the bytes read are noted for the
    ingest to keep with the new run."""
    project = project_of(event)
    if _history is None or project is None:
        return
    found = await read(path)
    if found is None:
        return
    latest = await latest_render(_history, project)
    if latest is not None and await latest_digest(_history, latest) == found:
        raise Known(latest.run_id)
    ADMITTED.note(event.envelope.idempotency_key, *found)
