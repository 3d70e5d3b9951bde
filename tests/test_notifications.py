"""A desktop notification when a mix review finishes, on a real D-Bus session bus.

The bus is a real `dbus-daemon --session` started by the test; the notification
server on it (tests/support/notification_server.py) is made by the test, in
place of a desktop's (GNOME Shell, KDE, dunst), which a test machine has none
of. agentbox's server process sends through desktop-notifier as it would on a
Linux desktop.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Server, wait_until
from tests.test_client import tone


@pytest.fixture
def session_bus() -> Iterator[str]:
    """The address of a fresh D-Bus session bus."""
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        pytest.skip("dbus-daemon is missing: install Debian's `dbus` package "
                    "(apt-get install dbus) to test desktop notifications on a real bus")
    folder = tempfile.mkdtemp(prefix="agentbox-bus-")  # short: a socket path has a limit
    process = subprocess.Popen(
        [daemon, "--session", "--nofork", "--print-address=1",
         f"--address=unix:path={folder}/bus"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        assert address.startswith("unix:"), address
        yield address
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()  # type: ignore[union-attr]
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def received(session_bus: str, tmp_path: Path) -> Iterator[Path]:
    """The file the test's notification server writes each notification to."""
    found = tmp_path / "notifications.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.notification_server", str(found)],
        env={**os.environ, "DBUS_SESSION_BUS_ADDRESS": session_bus,
             "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        yield found
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()  # type: ignore[union-attr]


def notifications(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def review_server(server_factory: Any, home: Path, bus: str, **env: str) -> Server:
    """A server running the built-in mix review, its session bus `bus`."""
    home.mkdir(parents=True, exist_ok=True)
    return server_factory({"AGENTBOX_AGENTS": "", "DBUS_SESSION_BUS_ADDRESS": bus,
                           "AGENTBOX_NOTIFY": "1", **env}, home=home).start()


def review(server: Server, mix: Path, project: str = "night-drive") -> dict[str, Any]:
    from tests.conftest import make_event

    answer = server.post(make_event(payload={"project_id": project, "mix_url": str(mix)}))
    assert answer.status_code == 202, answer.text
    return server.wait_terminal(answer.json()["run_id"], timeout=90)


def test_a_finished_review_is_a_desktop_notification(
        server_factory: Any, session_bus: str, received: Path, tmp_path: Path) -> None:
    server = review_server(server_factory, tmp_path / "on", session_bus)
    run = review(server, tone(tmp_path / "night-drive.wav"))
    assert run["status"] == "succeeded", run
    note = wait_until(lambda: notifications(received), 20, "the notification")[0]
    metrics = run["result"]["metrics"]
    assert note["app_name"] == "agentbox"
    verdict = run["result"].get("verdict")
    assert note["summary"] == (f"Review: {verdict} · night-drive.wav" if verdict
                               else "Review · night-drive.wav")
    assert note["body"].startswith(f"{metrics['integrated_lufs']:.1f} LUFS · true peak "
                                   f"{metrics['true_peak_dbtp']:+.1f} dBTP · LRA ")
    # a review that fails is told too (a file there, so taken, but not audio)
    broken = tmp_path / "missing.wav"
    broken.write_text("not audio")
    failed = review(server, broken, project="b-side")
    assert failed["status"] == "failed_permanent"
    second = wait_until(lambda: notifications(received)[1:], 20, "the second notification")[0]
    assert second["summary"] == "Review failed · missing.wav"  # named by the event
    assert "missing.wav" in second["body"]


def test_notifications_can_be_turned_off_in_the_config_file(
        server_factory: Any, session_bus: str, received: Path, tmp_path: Path) -> None:
    quiet_home = tmp_path / "quiet"
    (quiet_home / "config" / "agentbox").mkdir(parents=True)
    (quiet_home / "config" / "agentbox" / "agentbox.toml").write_text("notify = false\n")
    quiet = server_factory({"AGENTBOX_AGENTS": "", "DBUS_SESSION_BUS_ADDRESS": session_bus},
                           home=quiet_home)
    del quiet.env["AGENTBOX_NOTIFY"]  # the file's setting, nothing else, decides
    quiet.start()
    assert review(quiet, tone(tmp_path / "quiet.wav"))["status"] == "succeeded"
    quiet.stop()
    # Then one that notifies, on the same bus: its notification is the first to arrive.
    loud = review_server(server_factory, tmp_path / "loud", session_bus)
    assert review(loud, tone(tmp_path / "loud.wav"))["status"] == "succeeded"
    first = wait_until(lambda: notifications(received), 20, "the notification")[0]
    assert first["summary"].endswith("· loud.wav")
    assert [n["summary"] for n in notifications(received)] == [first["summary"]]


def test_no_notification_server_never_fails_a_review(server_factory: Any,
                                                     tmp_path: Path) -> None:
    nowhere = f"unix:path={tmp_path}/no-bus-here"
    server = review_server(server_factory, tmp_path / "home", nowhere)
    for name, level in (("a.wav", 0.25), ("b.wav", 0.2)):  # two renders: other bytes
        assert review(server, tone(tmp_path / name, level=level))["status"] == "succeeded"
    wait_until(lambda: "a desktop notification could not be shown" in
               server.log_path.read_text(), 20, "the failure to be logged")
    server.stop()
    assert server.log_path.read_text().count("a desktop notification could not be shown") == 1


def test_clicking_a_notification_opens_the_review_it_speaks_of(
        server_factory: Any, session_bus: str, tmp_path: Path) -> None:
    """The test's notification server clicks each notification as it comes; the
    server opens the run's page with the browser $BROWSER names (a script here)."""
    found, opened = tmp_path / "clicked.jsonl", tmp_path / "opened.txt"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> "{opened}"\n')
    browser.chmod(0o755)
    clicker = subprocess.Popen(
        [sys.executable, "-m", "tests.support.notification_server", str(found), "--click"],
        env={**os.environ, "DBUS_SESSION_BUS_ADDRESS": session_bus,
             "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert clicker.stdout is not None and clicker.stdout.readline().strip() == "ready"
        server = review_server(server_factory, tmp_path / "home", session_bus,
                               BROWSER=str(browser))
        run = review(server, tone(tmp_path / "night-drive.wav"))
        note = wait_until(lambda: notifications(found), 20, "the notification")[0]
        assert note["actions"][:1] == ["default"]  # the body clicks
        page = wait_until(lambda: opened.exists() and opened.read_text().split(), 20,
                          "the browser to be asked for the review")
        # on the page's private name, where a browser's session is
        named = f"http://{server.page_name()}:{server.port}"
        assert page == [f"{named}/ui/runs/{run['run_id']}"]
        assert server.client.get(server.on_page(page[0])).status_code == 200
    finally:
        clicker.terminate()
        clicker.wait(10)
        assert clicker.stdout is not None
        clicker.stdout.close()
