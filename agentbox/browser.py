"""The page handed to a browser, logged in, with no secret in an argument list.

A browser is started with what it should open on its command line, and every
account of the machine can read every process's command line (`/proc/*/cmdline`,
`ps`). So `agentbox open` and the tray never give it the one-time login link:
they write a small page that forwards to the link into a file of the user's
alone (mode 0600, in the user's runtime folder), give the browser that file's
name, wait until the link is used (or HANDOFF_SECONDS pass), and remove the file.
Jupyter's local server hands its browser over the same way, for the same reason.
"""

from __future__ import annotations

import html
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from agentbox import portable
from agentbox.client import Client, load_settings, runtime_file

HANDOFF_SECONDS = 60.0  # how long the file waits for the browser to use the link
HANDOFF_CHECK_SECONDS = 0.25  # how often the server is asked whether it was used


def handoff_folder(client: Client) -> Path:
    """Where the file goes: the folder of the server's address file (the user's runtime
    folder, or the data directory where there is none), the user's alone."""
    folder = runtime_file(load_settings(client.config_file).data_dir).parent
    portable.private_directory(folder)
    return folder


def handoff_page(link: str) -> str:
    """A page that forwards the browser to `link` at once (and says where, for one that
    does not follow a refresh)."""
    quoted = html.escape(link, quote=True)
    # The script moves on while the page is still parsed (a headless browser that
    # dumps the page once loaded follows it too); the refresh, where scripts are off.
    scripted = json.dumps(link).replace("<", "\\u003c")
    return ("<!doctype html>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"referrer\" content=\"no-referrer\">\n"
            f"<meta http-equiv=\"refresh\" content=\"0;url={quoted}\">\n"
            "<title>agentbox</title>\n"
            f"<script>location.replace({scripted});</script>\n"
            f"<p><a href=\"{quoted}\">Open agentbox</a></p>\n")


def write_handoff(folder: Path, link: str) -> Path:
    """The forwarding page in a new file of its own, mode 0600 from its first byte."""
    path = folder / f"open-{secrets.token_hex(8)}.html"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, portable.PRIVATE_FILE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(handoff_page(link))
    return path


def open_logged_in(client: Client, open_file: Callable[[str], object],
                   next_path: str | None = None, timeout: float = HANDOFF_SECONDS,
                   sleep: Callable[[float], None] = time.sleep) -> bool | None:
    """Open the page in a browser (`open_file`, given the file's URI; webbrowser.open),
    logged in by a one-time link, showing `next_path`. True once the browser used the
    link; False when `open_file` said no browser could be started; None when none used
    it in `timeout` seconds. The file is gone when this returns."""
    link = client.login_link(next_path)
    path = write_handoff(handoff_folder(client), link)
    try:
        if not open_file(path.as_uri()):
            return False
        deadline = time.monotonic() + timeout
        while (used := client.login_link_used(link)) is False:
            if time.monotonic() > deadline:
                return None
            sleep(HANDOFF_CHECK_SECONDS)
        return used
    finally:
        path.unlink(missing_ok=True)
