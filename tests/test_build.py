"""The one-file executable (scripts/build), used as a musician would: `agentbox serve`
with a fresh home, `agentbox send --wait` of a real WAV, the review, the page.

Slow: PyInstaller takes minutes, so the executable is built once per test session,
into a temporary folder (not the checkout's dist/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests import test_notifications
from tests.conftest import ROOT, free_port, wait_until
from tests.test_notifications import notifications
from tests.test_tray import HOST_SECONDS, Desktop, desktop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
session_bus = test_notifications.session_bus  # a real D-Bus session bus, and on it
received = test_notifications.received  # the test's own notification server
tray_desktop = desktop  # Xvfb and a tray host (tests/test_tray.py)
BUILD_SECONDS = 1500
START_SECONDS = 120.0  # unpacking ~90 MB on a busy machine; typically a few seconds


@pytest.fixture(scope="module")
def executable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build")
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build"), "--python", sys.executable,
         "--dist", str(out / "dist"), "--work", str(out / "work")],
        capture_output=True, text=True, timeout=BUILD_SECONDS, check=False)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    name = "agentbox.exe" if os.name == "nt" else "agentbox"
    assert os.listdir(out / "dist") == [name]  # one file, nothing beside it
    return out / "dist" / name


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A musician's fresh account: nothing configured, nothing stored yet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")}
    for name, folder in (("HOME", "home"), ("XDG_CONFIG_HOME", "home/.config"),
                         ("XDG_DATA_HOME", "home/.local/share"),
                         ("XDG_STATE_HOME", "home/.local/state"),
                         ("XDG_CACHE_HOME", "home/.cache"), ("TMPDIR", "tmp")):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        env[name] = str(tmp_path / folder)
    return env


@pytest.fixture
def server(executable: Path, home: dict[str, str], tmp_path: Path) -> Iterator[str]:
    with serving(executable, home, tmp_path / "serve.log") as url:
        yield url


@contextmanager
def serving(executable: Path, env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`agentbox serve` from the executable, on a free port: its URL once healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = log_path.open("w")
    started = time.monotonic()
    process = subprocess.Popen([str(executable), "serve", "--port", str(port)], env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _healthy(url) or process.poll() is not None, START_SECONDS,
                   "the executable's /healthz")
        assert process.poll() is None, log_path.read_text()
        print(f"one-file agentbox answered /healthz {time.monotonic() - started:.1f} s "
              f"after start ({executable.stat().st_size / 1e6:.0f} MB)")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        log.close()


def as_the_user(home: dict[str, str]) -> dict[str, str]:
    """The admin token the executable made for this account, as the page needs it."""
    token = (Path(home["XDG_CONFIG_HOME"]) / "agentbox" / "admin_token").read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def a_mix(path: Path) -> Path:
    """Five seconds of a stereo 48 kHz 24-bit mix, finished writing a while ago."""
    rate = 48_000
    t = np.arange(rate * 5) / rate
    noise = np.random.default_rng(7).standard_normal(t.size) * 0.01
    left = 0.3 * np.sin(2 * np.pi * 220 * t) + noise
    sf.write(path, np.stack([left, 0.8 * left], axis=1), rate, subtype="PCM_24")
    os.utime(path, (time.time() - 60, time.time() - 60))  # not "still being written"
    return path


def test_the_executable_reviews_a_mix_sent_by_its_own_send(
        executable: Path, server: str, home: dict[str, str], tmp_path: Path) -> None:
    mix = a_mix(tmp_path / "night drive.wav")
    sent = subprocess.run(
        [str(executable), "send", "--type", "session.exported", "--project", "night-drive",
         "--mix", str(mix), "--wait", "--json", "--wait-timeout", "300", "--url", server],
        env=home, capture_output=True, text=True, timeout=600, check=False)
    # The analysis runs in a spawned process: the executable starting itself again.
    assert sent.returncode == 0, sent.stdout[-2000:] + sent.stderr[-2000:]
    run = json.loads(sent.stdout[sent.stdout.index("\n{") + 1:])
    assert run["status"] == "succeeded"
    assert run["result"]["metrics"]["sample_rate"] == 48_000
    assert -20 < run["result"]["metrics"]["integrated_lufs"] < -5
    assert run["result"]["review_notes"]
    page = httpx.get(f"{server}/", timeout=30, headers=as_the_user(home))
    assert page.status_code == 200 and "night-drive" in page.text


def test_the_executable_shows_a_desktop_notification(
        executable: Path, home: dict[str, str], session_bus: str, received: Path,
        tmp_path: Path) -> None:
    """desktop-notifier and its D-Bus backend are in the file: a finished review is a
    notification on a real session bus, as from a checkout (the test's own
    notification server owns org.freedesktop.Notifications there)."""
    env = {**home, "DBUS_SESSION_BUS_ADDRESS": session_bus}
    with serving(executable, env, tmp_path / "serve.log") as url:
        mix = a_mix(tmp_path / "night drive.wav")
        sent = subprocess.run(
            [str(executable), "send", "--type", "session.exported", "--project",
             "night-drive", "--mix", str(mix), "--wait", "--wait-timeout", "300",
             "--url", url], env=env, capture_output=True, text=True, timeout=600,
            check=False)
        assert sent.returncode == 0, sent.stdout[-2000:] + sent.stderr[-2000:]
        note = wait_until(lambda: notifications(received), 30, "the notification")[0]
    assert note["app_name"] == "agentbox"
    assert note["summary"].startswith("Review") and note["summary"].endswith(
        "· night drive.wav"), note
    assert " LUFS · true peak " in note["body"], note
    assert "need desktop-notifier" not in (tmp_path / "serve.log").read_text()


@pytest.mark.anyio
async def test_the_executable_serves_agentbox_mcp(
        executable: Path, server: str, home: dict[str, str], tmp_path: Path) -> None:
    """A musician's assistant starts the executable's `mcp`, as it would an installed
    agentbox's: the SDK is in the file, and its tools reach the running server."""
    params = StdioServerParameters(command=str(executable), args=["mcp"],
                                   env={**home, "AGENTBOX_URL": server}, cwd=tmp_path)
    with open(tmp_path / "mcp.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name for tool in (await session.list_tools()).tools}
            runs = await session.call_tool("list_runs", {})
    assert {"send_export", "request_review", "list_runs", "show_run"} <= tools
    assert not runs.is_error, runs.content
    assert runs.structured_content == {"runs": []}  # the fresh home's server holds none yet


def test_the_executable_cleans_up_after_itself(executable: Path, home: dict[str, str]) -> None:
    version = subprocess.run([str(executable), "--version"], env=home, capture_output=True,
                             text=True, timeout=300, check=False)
    assert version.returncode == 0 and "version" in version.stdout
    assert os.listdir(home["TMPDIR"]) == []  # its unpacked files are gone when it exits


def test_the_executables_service_runs_the_executable(executable: Path,
                                                     home: dict[str, str]) -> None:
    planned = subprocess.run([str(executable), "service", "install", "--dry-run"], env=home,
                             capture_output=True, text=True, timeout=300, check=False)
    assert planned.returncode == 0, planned.stderr
    assert f"ExecStart={executable} serve\n" in planned.stdout
    assert f"Exec={executable} tray\n" in planned.stdout  # the tray icon at login


def test_the_executables_tray_docks_in_a_tray_host(
        executable: Path, server: str, home: dict[str, str], tray_desktop: Desktop,
        tmp_path: Path) -> None:
    """pystray and its XEmbed backend (python-xlib) are in the file: the executable's
    tray docks in a real tray host and says the server is idle."""
    with (tmp_path / "tray.log").open("w") as log:
        tray = subprocess.Popen([str(executable), "tray", "--url", server],
                                env={**home, "DISPLAY": tray_desktop.name}, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        docked = wait_until(lambda: tray_desktop.title() or tray.poll() is not None,
                            START_SECONDS, "the icon docked")
        assert tray.poll() is None, (tmp_path / "tray.log").read_text()
        assert str(docked).startswith("agentbox: ")
        # It finds the server at once, or at its next look (backoff: 30 s at most).
        if not wait_until_or_none(lambda: tray_desktop.title().startswith("agentbox: idle"),
                                  START_SECONDS):
            raise AssertionError(f"the icon says {tray_desktop.title()!r}:\n"
                                 + (tmp_path / "tray.log").read_text())
    finally:
        tray.terminate()
        tray.wait(HOST_SECONDS)


def test_the_executable_carries_the_manual(executable: Path, server: str,
                                           home: dict[str, str]) -> None:
    """The Markdown of agentbox/docs/ is inside the file: served at /docs, printed by
    `agentbox docs`."""
    contents = httpx.get(f"{server}/docs", timeout=30, headers=as_the_user(home))
    assert contents.status_code == 200 and 'href="/docs/review"' in contents.text
    topic = httpx.get(f"{server}/docs/review", timeout=30, headers=as_the_user(home))
    assert topic.status_code == 200 and "<h1>The review</h1>" in topic.text
    printed = subprocess.run([str(executable), "docs", "configuration"], env=home,
                             capture_output=True, text=True, timeout=300, check=False)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == (ROOT / "agentbox" / "docs" / "configuration.md").read_text(
        encoding="utf-8") + "\n"


def wait_until_or_none(condition: Any, timeout: float) -> Any:
    try:
        return wait_until(condition, timeout, "")
    except AssertionError:
        return None
