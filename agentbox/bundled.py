"""The apps this distribution of agentbox runs when AGENTBOX_APPS does not say: the
review, and the desktop side beside it. The engine names none of them (agentbox.config
takes the list from here); a server with `AGENTBOX_APPS=""` runs the engine alone."""

from __future__ import annotations

DEFAULT_APPS = ("agentbox.review.app:app", "agentbox.desktop.app:app")
