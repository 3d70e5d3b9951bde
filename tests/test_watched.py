"""The folders `agentbox serve` watches itself (the `watch` setting): real server
subprocesses, real WAV files written by the test, no `agentbox watch` running.
The setting's parsing is at the end (fast)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given
from hypothesis import strategies as st

from agentbox.config import ConfigError, load_settings
from agentbox.desktop.settings import DesktopSettings, WatchedFolder, parse_watch
from agentbox.desktop.watch import state_file
from tests.conftest import Server, wait_until
from tests.test_idle import WINDOW_SECONDS, cpu_seconds

RATE = 48_000
KEEP_ALIVE_SECONDS = 5.0  # the server closes an idle kept-alive connection after it
REVIEW_SECONDS = 120.0


def render(seconds: float, seed: int) -> bytes:
    """A stereo 24-bit WAV, as a DAW renders it."""
    t = np.arange(int(RATE * seconds)) / RATE
    noise = np.random.default_rng(seed).standard_normal(t.size) * 0.02
    left = 0.4 * np.sin(2 * np.pi * (110 + seed) * t) + noise
    out = io.BytesIO()
    sf.write(out, np.stack([left, 0.9 * left], axis=1), RATE, subtype="PCM_24", format="WAV")
    return out.getvalue()


def watching_server(server_factory: Callable[..., Server], home: Path,
                    watch: list[Any]) -> Server:
    """A server running the built-in mix review, `watch` in its config file."""
    config = home / "config" / "agentbox"
    config.mkdir(parents=True, exist_ok=True)
    items = [json.dumps(item) if isinstance(item, str) else  # a TOML inline table
             "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in item.items()) + "}"
             for item in watch]
    (config / "agentbox.toml").write_text(f"watch = [{', '.join(items)}]\n")
    return server_factory({"AGENTBOX_AGENTS": ""}, home=home)


def runs_of(server: Server, project: str) -> list[dict[str, Any]]:
    """`project`'s exports (their runs), newest first; none yet: []."""
    answer = server.client.get("/exports", params={"project": project})
    found: list[dict[str, Any]] = answer.json()["exports"] if answer.status_code == 200 else []
    return found


def reviewed(server: Server, project: str) -> dict[str, Any]:
    """The run of `project`'s latest export, once it is finished."""
    def done() -> dict[str, Any] | None:
        runs = runs_of(server, project)
        return runs[0] if runs and runs[0]["finished_at"] else None
    export: dict[str, Any] = wait_until(done, REVIEW_SECONDS, f"a review of {project}")
    return server.run(export["run_id"])


def folder_said(server: Server, folder: Path) -> str:
    """What the home page says of a watched folder."""
    page = server.client.get("/").text
    item = page[page.index(f'data-folder="{folder}"'):]
    return item[:item.index("</li>")]


@pytest.mark.slow
def test_a_configured_folder_is_reviewed_across_a_restart_of_serve(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    exports = tmp_path / "Exports"
    exports.mkdir()
    server = watching_server(server_factory, tmp_path / "home", [str(exports)]).start()
    wait_until(lambda: "watching" in folder_said(server, exports), 30, "the folder watched")
    (exports / "first song.wav").write_bytes(render(4, 1))
    first = reviewed(server, "first song")
    assert first["status"] == "succeeded", first
    assert first["result"]["metrics"]["sample_rate"] == RATE

    # A render under way when the server stops: found, not yet sent ...
    whole = render(6, 2)
    cut = exports / "second song.wav"
    cut.write_bytes(whole[: len(whole) // 2])  # its header promises the rest
    state = state_file(tmp_path / "home" / "data", exports)
    wait_until(lambda: state.exists() and "second song.wav" in json.loads(
        state.read_text())["found"], 30, "the half-written render to be noted")
    assert server.stop() in (0, -signal.SIGTERM)  # uvicorn ends by re-raising it
    with cut.open("ab") as rest:  # ... finished while nothing runs
        rest.write(whole[len(whole) // 2:])

    server.start()  # the service starting again at login: no agentbox watch anywhere
    second = reviewed(server, "second song")
    assert second["status"] == "succeeded", second
    assert second["result"]["file"]["size_bytes"] == len(whole)  # the whole render
    (exports / "third song.wav").write_bytes(render(3, 3))
    assert reviewed(server, "third song")["status"] == "succeeded"
    # one export, one run: the first was not sent again by the restarted server
    assert [len(runs_of(server, p)) for p in ("first song", "second song", "third song")] \
        == [1, 1, 1]
    assert "watching" in folder_said(server, exports)


@pytest.mark.slow
def test_a_missing_folder_says_so_and_is_watched_once_it_appears(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    later = tmp_path / "Drive" / "Bounces"
    there = tmp_path / "Mixes"
    there.mkdir()
    server = watching_server(server_factory, tmp_path / "home",
                             [str(later), {"path": str(there)}]).start()
    wait_until(lambda: "not there" in folder_said(server, later), 30, "the missing folder")
    wait_until(lambda: "watching" in folder_said(server, there), 30, "the other watched")
    later.mkdir(parents=True)
    wait_until(lambda: "watching" in folder_said(server, later), 30, "the folder picked up")
    (later / "bounce.wav").write_bytes(render(3, 4))
    assert reviewed(server, "bounce")["status"] == "succeeded"
    page = server.client.get("/").text
    assert "last sent: bounce.wav" in folder_said(server, later) and "Watched folders" in page


# -- the setting (fast) ---------------------------------------------------------------------


def test_the_setting_names_folders_and_their_stage(tmp_path: Path) -> None:
    sep = os.pathsep
    folders = parse_watch(f"/music/mixes{sep}/music/masters=master{sep}~/Bounces=mix")
    assert folders == (WatchedFolder(Path("/music/mixes")),
                       WatchedFolder(Path("/music/masters"), "master"),
                       WatchedFolder(Path.home() / "Bounces", "mix"))
    config = tmp_path / "agentbox.toml"
    config.write_text('watch = ["/a", "/b=mix", {path = "/c=d", stage = "master"}]\n')
    settings = load_settings(config, environ={})
    assert settings.of(DesktopSettings).watch == (
        WatchedFolder(Path("/a")), WatchedFolder(Path("/b"), "mix"),
        WatchedFolder(Path("/c=d"), "master"))
    from_env = load_settings(config, environ={"AGENTBOX_WATCH": "/e"})
    # The environment wins.
    assert from_env.of(DesktopSettings).watch == (WatchedFolder(Path("/e")),)
    assert load_settings(config, environ={"AGENTBOX_WATCH": ""}).of(DesktopSettings).watch == ()


@pytest.mark.parametrize(("value", "says"), [
    ("/a=loud", "the stage must be mix or master"),
    ("relative/folder", "not an absolute path"),
    (f"/a{os.pathsep}/a", "named twice"),
    ("/a=", "the stage must be mix or master"),
])
def test_a_wrong_folder_is_refused_with_what_to_change(value: str, says: str,
                                                       tmp_path: Path) -> None:
    config = tmp_path / "agentbox.toml"
    config.write_text("")
    with pytest.raises(ConfigError, match=says) as refused:
        load_settings(config, environ={"AGENTBOX_WATCH": value})
    assert "AGENTBOX_WATCH" in str(refused.value)


def test_a_wrong_table_in_the_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "agentbox.toml"
    for text in ('watch = [{folder = "/a"}]\n', "watch = 3\n", "watch = [3]\n"):
        config.write_text(text)
        with pytest.raises(ConfigError, match=r"watch in .*agentbox.toml"):
            load_settings(config, environ={})


ABSOLUTE = st.lists(st.text(st.characters(categories=("L", "N"), include_characters="_-."),
                            min_size=1, max_size=12), min_size=1, max_size=4).map(
    lambda parts: "/" + "/".join(parts))


@given(st.lists(st.tuples(ABSOLUTE, st.sampled_from([None, "mix", "master"])),
                max_size=5, unique_by=lambda item: item[0]))
def test_folders_written_as_the_environment_writes_them_read_back(
        folders: list[tuple[str, str | None]]) -> None:
    text = os.pathsep.join(path + (f"={stage}" if stage else "") for path, stage in folders)
    assert parse_watch(text) == tuple(WatchedFolder(Path(path), stage)
                                      for path, stage in folders)


# -- idle beside a DAW ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc counters")
@pytest.mark.timeout(600)
def test_two_watched_folders_cost_no_more_than_one_agentbox_watch(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    """Idle beside a DAW: what watching two folders (with renders already in them)
    adds to serve wakes it no more often than one `agentbox watch` of one of them
    wakes, and serve stays under 1 % of a core. The window:
    AGENTBOX_TEST_IDLE_SECONDS (10; the docs' figures: 60)."""
    folders = [tmp_path / "Mixes", tmp_path / "Masters"]
    for n, folder in enumerate(folders):
        folder.mkdir()
        for take in range(10):
            (folder / f"take {take}.wav").write_bytes(render(0.5, 10 * n + take))
    (tmp_path / "plain").mkdir()
    plain = server_factory({"AGENTBOX_AGENTS": ""}, home=tmp_path / "plain").start()
    baseline = idle(plain)
    plain.stop()
    server = watching_server(server_factory, tmp_path / "home",
                             [str(folders[0]), f"{folders[1]}=master"]).start()
    wait_until(lambda: all("watching" in folder_said(server, f) for f in folders), 30,
               "both folders watched")
    served = idle(server)
    with watching(folders[0], server) as watch:
        alone = measured(watch.pid)
    print(f"idle over {WINDOW_SECONDS:g} s: serve {baseline[0]:.2f} wakeups/s, "
          f"{baseline[1]:.3%} of a core; serve watching 2 folders {served[0]:.2f}, "
          f"{served[1]:.3%}; agentbox watch of 1 folder {alone[0]:.2f}, {alone[1]:.3%}")
    assert served[0] - baseline[0] <= alone[0] + 0.25, (served, baseline, alone)
    assert served[1] < 0.01, served


def idle(server: Server) -> tuple[float, float]:
    server.client.close()  # its kept-alive connection would tick the Date header
    assert server.process is not None
    return measured(server.process.pid)


def wakeups(pid: int) -> int:
    """Every thread's voluntary context switches so far: each time one slept and was
    woken (the involuntary ones, preemptions, count the machine's load, not ours)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total += sum(int(line.split()[1]) for line in
                         (task / "status").read_text().splitlines()
                         if line.startswith("voluntary_ctxt_switches"))
    return total


def measured(pid: int) -> tuple[float, float]:
    """Wakeups per second and share of a core of process `pid` over WINDOW_SECONDS,
    once connections kept alive have been closed (KEEP_ALIVE_SECONDS)."""
    time.sleep(KEEP_ALIVE_SECONDS + 1)
    woken, cpu, started = wakeups(pid), cpu_seconds(pid), time.monotonic()
    time.sleep(WINDOW_SECONDS)
    elapsed = time.monotonic() - started
    return (wakeups(pid) - woken) / elapsed, (cpu_seconds(pid) - cpu) / elapsed


@contextlib.contextmanager
def watching(folder: Path, server: Server) -> Iterator[subprocess.Popen[bytes]]:
    """`agentbox watch FOLDER` against `server`, as a musician runs it today."""
    log = (folder.parent / "watch.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "agentbox", "watch", str(folder),
                                "--url", server.url], env=server.env, stdout=log,
                               stderr=log, cwd=folder.parent)
    try:
        wait_until(lambda: b"watching" in (folder.parent / "watch.log").read_bytes(), 30,
                   "agentbox watch to start")
        yield process
    finally:
        process.terminate()
        process.wait(10)
        log.close()
