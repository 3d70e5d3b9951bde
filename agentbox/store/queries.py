"""Each engine's SQL, read from its file of named statements at import.

A file holds blocks that start with `-- name: <name>`; a block's text up to the
next one is the statement (the comments at its head included, those that head
the next section not). Callers
pass keyword parameters and name the statement; nothing builds SQL from
another dialect's text.
"""

from __future__ import annotations

import re
from importlib.resources import files

_NAME = re.compile(r"^-- name: (\S+)\s*$", re.MULTILINE)
_TRAILING_COMMENTS = re.compile(r"(\s*\n--[^\n]*)+\s*$")


def parse(text: str) -> dict[str, str]:
    """`{name: statement}` from a file's text, in file order."""
    parts = _NAME.split(text)
    return {name: _TRAILING_COMMENTS.sub("", body).strip()
            for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def load(filename: str) -> dict[str, str]:
    """The statements of `agentbox/store/<filename>`."""
    return parse(files("agentbox.store").joinpath(filename).read_text(encoding="utf-8"))


def operations(statements: dict[str, str]) -> set[str]:
    """The operations a file names: `store_events.key` is a step of `store_events`."""
    return {name.split(".", 1)[0] for name in statements}
