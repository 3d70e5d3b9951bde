"""A deliberately broken commit path, for the power-cut test to prove it catches a loss.

Python imports `sitecustomize` at start from the first directory on its path
that has one; the power-cut test puts this directory first on the server's
PYTHONPATH. The server then answers 202 for commits that are not yet on disk,
without a line of the store changed. It hooks two seams the store cannot
avoid, whatever its files and function names:

- `sqlite3.connect`: every connection the process opens runs with
  `PRAGMA synchronous = NORMAL` (the WAL is fsynced at checkpoints only, not
  at each commit; POWERCUT_SYNCHRONOUS=OFF: never), and gets an authorizer
  that turns any later `PRAGMA synchronous = ...` into a no-op, so the store's
  own `synchronous = FULL` does not take effect;
- `os.fsync` and `os.fdatasync`: no-ops, for a store that syncs files itself.

It says so on stderr (the server's log), so that a test can check it ran.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import Any

SYNCHRONOUS = os.environ.get("POWERCUT_SYNCHRONOUS", "NORMAL").upper()
assert SYNCHRONOUS in ("NORMAL", "OFF"), SYNCHRONOUS

_connect = sqlite3.connect


def _authorize(action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() == "synchronous" \
            and arg2 is not None:
        return sqlite3.SQLITE_IGNORE  # a no-op, not an error: the store goes on
    return sqlite3.SQLITE_OK


def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _connect(*args, **kwargs)
    conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")
    conn.set_authorizer(_authorize)
    return conn


def _no_sync(fd: int) -> None:
    pass


sqlite3.connect = connect  # type: ignore[assignment]
os.fsync = _no_sync
os.fdatasync = _no_sync
print(f"power-cut test: broken commit path: synchronous={SYNCHRONOUS}, os.fsync off",
      file=sys.stderr, flush=True)
