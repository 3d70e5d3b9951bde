"""Import every agentbox module as if on another OS, and report what the portable
layer picked there.

    python -m tests.support.other_os win32|darwin DIRECTORY

This machine runs Linux, so the other OS is simulated: `sys.platform` says
"win32" or "darwin"; on "win32" the POSIX-only modules (fcntl, termios,
resource, pwd, grp, ...) cannot be imported and POSIX-only functions of os,
signal and time are gone; on "darwin" the Linux-only ones are. Windows'
kernel APIs (kernel32 through ctypes, msvcrt) cannot run here: they are
replaced by doubles that answer as Windows would. The third-party libraries
agentbox uses (and asyncio, subprocess) are imported before the switch: their
makers test them on each OS, and some need Windows' own C modules to load.
filelock is imported after it, since its choice of lock is what is checked.

Prints one JSON object (see `report`).
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import importlib.abc
import importlib.util
import json
import os
import pkgutil
import signal
import sqlite3
import sys
import time
import types
from pathlib import Path
from typing import Any

# Tested by their makers on each OS; loaded under the real platform.
LIBRARIES = ("asyncio", "subprocess", "concurrent.futures", "multiprocessing", "numpy",
             "scipy.signal", "soundfile", "pyloudnorm", "starlette.applications",
             "starlette.routing", "uvicorn", "pydantic", "platformdirs", "httpx", "click",
             "jinja2", "sse_starlette", "prometheus_client", "mimetypes", "email.utils",
             "http.client", "urllib.request", "ssl", "tomllib", "hmac", "hashlib",
             "logging.handlers", "mcp", "mcp.server.mcpserver")
POSIX_ONLY = {"fcntl", "termios", "tty", "pty", "resource", "pwd", "grp", "syslog", "crypt",
              "spwd", "nis", "ossaudiodev", "posixshmem", "_posixsubprocess", "uvloop"}
LINUX_ONLY = {"spwd", "ossaudiodev"}
POSIX_OS_FUNCTIONS = ("fork", "nice", "getpriority", "setpriority", "getuid", "geteuid",
                      "getgid", "killpg", "setsid", "getpgid", "sched_setaffinity")
POSIX_SIGNALS = ("SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM",
                 "SIGCHLD", "SIGCONT", "SIGSTOP")
INTERRUPT_TIME = 1_234_567_890_123  # what the kernel32 double reports, in 100 ns units


class Unimportable(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} on this OS", name=name)
        return None


class Kernel32Double:
    """Windows' kernel32 as far as agentbox and filelock touch it."""

    def __getattr__(self, name: str) -> Any:
        return FunctionDouble(name)


class FunctionDouble:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any) -> int:
        if self.name == "QueryInterruptTimePrecise":
            ctypes.cast(args[0], ctypes.POINTER(ctypes.c_ulonglong))[0] = INTERRUPT_TIME
        return 1


def become(system: str) -> None:
    for name in LIBRARIES:
        importlib.import_module(name)
    assert not [m for m in sys.modules if m.split(".")[0] in ("agentbox", "filelock")]
    gone = POSIX_ONLY if system == "win32" else LINUX_ONLY
    for name in list(sys.modules):
        if name.split(".")[0] in gone:
            del sys.modules[name]
    sys.meta_path.insert(0, Unimportable(gone))
    if hasattr(time, "CLOCK_BOOTTIME"):
        del time.CLOCK_BOOTTIME  # Linux only
    if system == "win32":
        for name in POSIX_OS_FUNCTIONS:
            if hasattr(os, name):
                delattr(os, name)
        for name in POSIX_SIGNALS:
            if hasattr(signal, name):
                delattr(signal, name)
        signal.SIGBREAK = 21  # type: ignore[attr-defined]
        signal.CTRL_C_EVENT, signal.CTRL_BREAK_EVENT = 0, 1  # type: ignore[attr-defined]
        ctypes.WinDLL = lambda name, **_: Kernel32Double()  # type: ignore[attr-defined]
        msvcrt = types.ModuleType("msvcrt")
        msvcrt.get_osfhandle = lambda fd: fd  # type: ignore[attr-defined]
        sys.modules["msvcrt"] = msvcrt
    sys.platform = system


def import_everything() -> list[str]:
    import agentbox

    names = ["agentbox"]
    for module in pkgutil.walk_packages(agentbox.__path__, "agentbox."):
        if module.name == "agentbox.__main__":  # it runs the CLI: imported by name only
            importlib.util.find_spec(module.name)
            continue
        importlib.import_module(module.name)
        names.append(module.name)
    return names


def sqlite_pragmas(directory: Path) -> list[dict[str, int]]:
    """Open a real SQLite store and read back, from every connection it made, the
    PRAGMAs that decide how SQLite flushes."""
    made: list[sqlite3.Connection] = []
    connect = sqlite3.connect

    def recording(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        made.append(conn)
        return conn

    sqlite3.connect = recording  # type: ignore[assignment]
    from agentbox.store.sqlite import SqliteStore

    async def run() -> list[dict[str, int]]:
        store = SqliteStore(directory / "agentbox.sqlite3")
        await store.open()
        try:
            return [{pragma: conn.execute(f"PRAGMA {pragma}").fetchone()[0]
                     for pragma in ("fullfsync", "checkpoint_fullfsync", "synchronous")}
                    for conn in made]
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    finally:
        sqlite3.connect = connect


def report(system: str, directory: Path) -> dict[str, Any]:
    if system != sys.platform:
        become(system)
    modules = import_everything()
    import filelock

    from agentbox import portable
    from agentbox.review.analysis import local_path

    found: dict[str, Any] = {
        "platform": portable.PLATFORM,
        "modules": modules,
        "lock": filelock.FileLock.__name__,
        "flush": portable.durable_flush.__name__,
        "sqlite_fullfsync": portable.SQLITE_FULLFSYNC,
        "clock": portable.since_boot.__name__,
        "clock_reads": portable.since_boot(),
        "loop": portable.event_loop(),
        "event_loop_setting": portable.EVENT_LOOP,
        "stop": portable.request_stop.__name__,
        "priority": [step.__name__ for step in portable.PRIORITY_STEPS],
        "path": portable.path_from_url("/C:/Mixes/Night%20Drive.wav"),
        "mix_path": str(local_path("file:///C:/Mixes/a.wav")),
        "posix_mix_path": str(local_path("file:///Users/me/Mixes/a%20b.wav")),
    }
    if system != "win32":  # a real store: its lock is flock, which runs here
        found["sqlite_pragmas"] = sqlite_pragmas(directory)
    return found


if __name__ == "__main__":
    print(json.dumps(report(sys.argv[1], Path(sys.argv[2]))))
