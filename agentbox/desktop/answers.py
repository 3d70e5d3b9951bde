"""The desktop side's answers, as models (agentbox.models' `Answer`): the watched
folders (`GET /watch`, `POST /watch/pause`, `/watch/resume`), as the server answers
them and the client (agentbox.client) reads them.
"""

from __future__ import annotations

from agentbox.models import Answer


class WatchedFolderOut(Answer):
    """One folder the server watches, as `GET /watch` shows it."""

    path: str
    stage: str | None  # mix or master: how its exports are judged, when the folder says
    state: str  # starting, watching, missing or unreadable
    said: str  # the state in a musician's words
    note: str = ""  # the last trouble told of it, cleared by success
    last_file: str = ""  # the last file handed over
    last_at: float | None = None  # when (Unix seconds)


class WatchState(Answer):
    """`GET /watch`, `POST /watch/pause`, `POST /watch/resume`: whether the watched
    folders are paused (renders found meanwhile are sent on resume), and each folder."""

    paused: bool
    folders: list[WatchedFolderOut]
