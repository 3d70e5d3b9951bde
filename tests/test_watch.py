"""`agentbox watch` against a real server: exports are never dropped for a reason that
heals, one export is one run however its writer stalls, every format the review
reads is picked up, and each review is printed when it finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from agentbox.desktop.watch import AUDIO_SUFFIXES, Watcher, reviewed_whole
from agentbox.review.containers import audio_complete
from tests.conftest import make_event, wait_until
from tests.support.runs import made_run
from tests.test_client import agentbox, tone


class Watching:
    """A running `agentbox watch`, its output (stdout and stderr) read line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, ""):
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, start: str, timeout: float = 30) -> str:
        found: str = wait_until(lambda: next((line for line in self.lines
                                              if line.startswith(start)), None),
                                timeout, f"a line starting {start!r} in {self.lines}")
        return found

    def count(self, start: str) -> int:
        return sum(line.startswith(start) for line in self.lines)


@contextmanager
def watching(env: dict[str, str], cwd: Path, folder: Path, *args: str) -> Iterator[Watching]:
    process = subprocess.Popen(
        [sys.executable, "-m", "agentbox", "watch", str(folder), "--interval", "0.05", *args],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watched = Watching(process)
    try:
        watched.wait_for("agentbox: watching")  # its first scan is done
        yield watched
    finally:
        process.terminate()
        process.wait(10)
        watched._reader.join(10)
        assert process.stdout is not None
        process.stdout.close()


def test_a_signature_refused_keeps_the_export_until_the_secret_is_right(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory()
    del server.env["AGENTBOX_WEBHOOK_SECRET"]  # kept in the server's config dir
    server.start()
    right = agentbox(server.env, server.home, "secret").stdout.strip()
    # The watcher's own configuration (another machine, say) holds a stale secret.
    mine = tmp_path / "watcher"
    mine.mkdir()
    (mine / "agentbox.toml").write_text(f'port = {server.port}\n')
    (mine / "webhook_secret").write_text("a-stale-secret\n")
    folder = tmp_path / "exports"
    folder.mkdir()
    with watching(server.env, server.home, folder, "--settle", "0.2", "--config",
                  str(mine / "agentbox.toml")) as watched:
        tone(folder / "first.wav", seconds=0.5)
        watched.wait_for("first.wav: waiting: 401 signature_invalid")
        time.sleep(2.5)  # a few retries with backoff: still pending, said once
        assert watched.count("first.wav: accepted") == 0
        assert watched.count("first.wav: waiting") == 1
        (mine / "webhook_secret").write_text(right + "\n")  # the sender is given the secret
        run_id = watched.wait_for("first.wav: accepted").split()[-1]
        assert server.wait_terminal(run_id)["status"] == "succeeded"
        assert not any(": refused" in line for line in watched.lines), watched.lines


def test_watch_picks_up_a_rotated_secret(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory()
    del server.env["AGENTBOX_WEBHOOK_SECRET"]  # kept in the config dir, shared with watch
    server.start()
    folder = tmp_path / "exports"
    folder.mkdir()
    with watching(server.env, server.home, folder, "--settle", "0.2", "--url",
                  server.url) as watched:
        tone(folder / "before.wav", seconds=0.5)
        watched.wait_for("before.wav: accepted")
        old = agentbox(server.env, server.home, "secret").stdout.strip()
        assert agentbox(server.env, server.home, "secret", "rotate").returncode == 0
        assert agentbox(server.env, server.home, "secret", "retire").returncode == 0
        wait_until(lambda: server.post(make_event(), secret=old).status_code == 401, 10,
                   "the old secret to be refused")
        tone(folder / "after.wav", seconds=0.5)
        run_id = watched.wait_for("after.wav: accepted", timeout=40).split()[-1]
        assert server.wait_terminal(run_id)["status"] == "succeeded"


def test_an_unreachable_agentbox_is_waited_for(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory()  # not started yet: its port is known, nothing listens there
    folder = tmp_path / "exports"
    folder.mkdir()
    with watching(server.env, server.home, folder, "--settle", "0.2", "--url",
                  server.url) as watched:
        tone(folder / "early.wav", seconds=0.5)
        watched.wait_for("early.wav: waiting: cannot reach agentbox")
        server.start()
        run_id = watched.wait_for("early.wav: accepted", timeout=90).split()[-1]
        assert server.wait_terminal(run_id)["status"] == "succeeded"
        assert watched.count("early.wav: waiting") == 1  # said once, however many retries
        # and its review, once finished (the test agent's result has no figures)
        watched.wait_for("early.wav: succeeded")


def test_a_writer_that_stalls_makes_one_run_and_the_review_is_printed(
        server_factory: Any, tmp_path: Path) -> None:
    # The built-in mix review; retries spaced so that the review's own "modified in
    # the last 2 s" wait does not use them up.
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_RETRY_BASE_SECONDS": "1",
                             "AGENTBOX_RETRY_MAX_SECONDS": "2"}).start()
    folder = tmp_path / "exports"
    folder.mkdir()
    settle = 0.3
    rate = 48_000
    t = np.arange(rate * 4) / rate
    audio = np.column_stack([0.3 * np.sin(2 * np.pi * 220 * t)] * 2).astype("float32")
    with watching(server.env, server.home, folder, "--settle", str(settle), "--url",
                  server.url) as watched:
        mix = folder / "stalled.wav"
        # A DAW-like writer: libsndfile fills in the WAV header's sizes when it closes.
        with sf.SoundFile(mix, "w", rate, 2, "PCM_24") as f:
            f.write(audio[: len(audio) // 2])
            f.flush()
            time.sleep(settle * 8)  # stalls far longer than the settle time
            assert audio_complete(mix) is False
            # not taken for finished: waited for, and said so
            assert watched.lines[-1] == "stalled.wav: still being written…", watched.lines
            f.write(audio[len(audio) // 2:])
        run_id = watched.wait_for("stalled.wav: accepted").split()[-1]
        run = server.wait_terminal(run_id, timeout=90)
        assert run["status"] == "succeeded", run
        assert run["result"]["metrics"]["duration_seconds"] == pytest.approx(4.0, abs=0.01)
        told = watched.wait_for(f"stalled.wav: {run['result'].get('verdict', 'succeeded')}")
        figures = watched.lines[watched.lines.index(told) + 1]
        assert "LUFS" in figures and "true peak" in figures
        time.sleep(settle * 4)
        assert watched.count("stalled.wav: accepted") == 1
        assert watched.count("stalled.wav: sent before") == 0
        assert watched.count("stalled.wav: still being written") == 1
    listed = server.client.get("/runs").json()["runs"]
    assert [r["run_id"] for r in listed] == [run_id]  # one export, one run


def test_a_stalled_render_is_said_to_be_still_written_once(
        server_factory: Any, tmp_path: Path) -> None:
    """A render that stalls halfway is waited for, and the watcher says so: one line,
    however many scans it waits through, then the usual lines once it is whole."""
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_RETRY_BASE_SECONDS": "1",
                             "AGENTBOX_RETRY_MAX_SECONDS": "2"}).start()
    folder = tmp_path / "exports"
    folder.mkdir()
    whole = tmp_path / "render.wav"
    sf.write(whole, np.zeros((48_000 * 3, 2)) + 0.1, 48_000, "PCM_24")
    data = whole.read_bytes()
    settle, go_on = 0.3, threading.Event()
    with watching(server.env, server.home, folder, "--settle", str(settle), "--url",
                  server.url) as watched:
        writer = stalling_writer(folder / "hung.wav", data, len(data) // 2, 0, go_on)
        waiting = watched.wait_for("hung.wav: still being written…")
        polls = len(watched.lines)
        time.sleep(settle * 5)  # many scans (every 0.05 s) while it waits
        assert watched.count("hung.wav") == 1, watched.lines[polls - 1:]
        go_on.set()
        writer.join(30)
        run_id = watched.wait_for("hung.wav: accepted").split()[-1]
        run = server.wait_terminal(run_id, timeout=90)
        verdict = watched.wait_for(f"hung.wav: {run['result']['verdict']}")
    said = [line for line in watched.lines if line.startswith("hung.wav")]
    assert said == [waiting, f"hung.wav: accepted {run_id}", verdict]


def test_a_header_that_promises_more_than_is_there_is_waited_for(tmp_path: Path) -> None:
    rate = 8000
    audio = np.zeros((rate, 2), dtype="float32")
    whole = tmp_path / "whole.wav"
    sf.write(whole, audio, rate, subtype="PCM_16")
    assert audio_complete(whole) is True
    half = tmp_path / "half.wav"  # a writer that wrote the final header first
    half.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert audio_complete(half) is False
    now = [0.0]
    watcher = Watcher(tmp_path, settle=1.0, include_existing=True, clock=lambda: now[0],
                      incomplete_grace=30.0)
    watcher.poll()
    now[0] = 5.0
    assert watcher.poll() == [whole]  # settled and whole; the half one waits
    watcher.sent(whole)
    empty = tmp_path / "failed.wav"  # a render that wrote nothing (or has not begun)
    empty.write_bytes(b"")
    now[0] = 6.0
    assert watcher.poll() == []
    now[0] = 25.0
    assert watcher.poll() == [] and watcher.busy
    now[0] = 37.0
    # unchanged that long: sent, the review says it is cut short / empty
    assert sorted(watcher.poll()) == [empty, half]
    watcher.sent(empty, "watch-empty")
    watcher.sent(half)
    now[0] = 40.0
    assert watcher.poll() == [] and not watcher.busy  # `watch --once` can end
    empty.write_bytes(whole.read_bytes())  # the renderer writes it after all
    watcher.poll()
    now[0] = 42.0
    assert watcher.poll() == [empty]
    earlier = watcher.continues(empty)  # the same export, written on: its run, then
    assert earlier is not None and earlier.event_id == "watch-empty"
    failed = made_run(status="failed_permanent")  # "the file is empty"
    assert not reviewed_whole(failed, empty.stat().st_size)  # so: the follow-up, whole
    for fmt, suffix in (("AIFF", ".aiff"), ("RF64", ".rf64")):
        path = tmp_path / f"x{suffix}"
        sf.write(path, audio, rate, subtype="PCM_16", format=fmt)
        assert audio_complete(path) is True, fmt
        path.write_bytes(path.read_bytes()[:-1000])
        assert audio_complete(path) is False, fmt
    mp3 = tmp_path / "x.mp3"
    sf.write(mp3, audio, rate, format="MP3")
    assert audio_complete(mp3) is True  # its Xing frame says how many bytes follow
    mp3.write_bytes(mp3.read_bytes()[:-500])
    assert audio_complete(mp3) is False
    bare = tmp_path / "bare.mp3"  # no Xing/Info frame: the headerless settle time decides
    bare.write_bytes(ffmpeg_render(tmp_path / "r.mp3", 1.0, "-write_xing", "0"))
    assert audio_complete(bare) is None
    flac = tmp_path / "x.flac"
    with sf.SoundFile(flac, "w", rate, 2, "PCM_24") as f:  # libsndfile's FLAC writer
        f.write(audio[: rate // 2])
        f.flush()
        assert audio_complete(flac) is False  # its sample count is filled in at the end
        f.write(audio[rate // 2:])
    assert audio_complete(flac) is None  # written: its frames are not counted


# (format, subtype, suffixes): what the review decodes through soundfile/libsndfile.
FORMATS = [("WAV", "PCM_24", (".wav", ".wave", ".bwf")), ("RF64", "PCM_24", (".rf64",)),
           ("W64", "PCM_24", (".w64",)), ("FLAC", "PCM_24", (".flac",)),
           ("AIFF", "PCM_24", (".aif", ".aiff", ".aifc")), ("MP3", "MPEG_LAYER_III", (".mp3",)),
           ("OGG", "VORBIS", (".ogg", ".oga")), ("OGG", "OPUS", (".opus",)),
           ("CAF", "PCM_24", (".caf",))]


def test_every_format_the_review_reads_is_watched(tmp_path: Path) -> None:
    assert set(AUDIO_SUFFIXES) == {s for _, _, suffixes in FORMATS for s in suffixes}
    rate = 48_000
    audio = np.zeros((rate // 2, 2), dtype="float32")
    made = []
    for fmt, subtype, suffixes in FORMATS:
        for suffix in suffixes:
            path = tmp_path / f"mix-{fmt.lower()}-{subtype.lower()}{suffix}"
            sf.write(path, audio, rate, subtype=subtype, format=fmt)
            assert sf.info(path).frames > 0, path  # the review can read it
            made.append(path)
    (tmp_path / "notes.txt").write_text("not audio")
    (tmp_path / ".hidden.wav").write_bytes((tmp_path / made[0].name).read_bytes())
    now = [0.0]
    watcher = Watcher(tmp_path, settle=1.0, include_existing=True, clock=lambda: now[0])
    watcher.poll()
    now[0] = 2.0
    assert sorted(watcher.poll()) == sorted(made)


# -- one export, one run, however the writer stalls (every format) -----------------------------


def ffmpeg_render(path: Path, seconds: float, *options: str) -> bytes:
    """A finished render made by ffmpeg (a real encoder: MP3 with its Xing/Info frame
    unless told otherwise, Ogg Vorbis, WAV), as the bytes a writer would put out."""
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi",
                    "-i", f"sine=frequency=330:duration={seconds}", "-ac", "2", "-ar", "48000",
                    *options, str(path)], check=True, timeout=120)
    data = path.read_bytes()
    path.unlink()
    return data


def stalling_writer(path: Path, data: bytes, cut: int, stall: float,
                    before_rest: threading.Event | None = None) -> threading.Thread:
    """A writer that puts out `data[:cut]`, stalls for `stall` seconds (or until
    `before_rest` is set), then writes the rest: a DAW whose render hangs halfway."""
    def write() -> None:
        with open(path, "wb") as f:
            f.write(data[:cut])
            f.flush()
            if before_rest is not None:
                before_rest.wait(120)
            else:
                time.sleep(stall)
            f.write(data[cut:])
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


@pytest.mark.parametrize(("suffix", "options", "headerless_settle"), [
    (".mp3", (), "10"),  # its Xing/Info frame says how many bytes follow
    (".mp3", ("-write_xing", "0"), "8"),  # says nothing: the headerless settle time decides
    (".ogg", ("-c:a", "libvorbis"), "10"),  # the last page flagged end-of-stream
    (".wav", ("-c:a", "pcm_s24le"), "10"),  # the header's data size
], ids=["mp3", "mp3-no-xing", "ogg", "wav"])
def test_a_stalling_writer_makes_one_run_of_the_whole_file(
        server_factory: Any, tmp_path: Path, suffix: str, options: tuple[str, ...],
        headerless_settle: str) -> None:
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_RETRY_BASE_SECONDS": "1",
                             "AGENTBOX_RETRY_MAX_SECONDS": "2"}).start()
    folder = tmp_path / "exports"
    folder.mkdir()
    data = ffmpeg_render(tmp_path / f"render{suffix}", 6.0, *options)
    settle = 0.3
    mix = folder / f"stalled{suffix}"
    with watching(server.env, server.home, folder, "--settle", str(settle), "--url",
                  server.url, "--headerless-settle", headerless_settle) as watched:
        writer = stalling_writer(mix, data, len(data) // 2, stall=settle * 10)
        writer.join(60)
        run_id = watched.wait_for(f"stalled{suffix}: accepted").split()[-1]
        assert [line for line in watched.lines if line.startswith("stalled")] == [
            f"stalled{suffix}: still being written…", f"stalled{suffix}: accepted {run_id}"]
        run = server.wait_terminal(run_id, timeout=90)
        assert run["status"] == "succeeded", run
        reviewed = run["result"]["file"]
        assert reviewed["size_bytes"] == len(data)  # the whole file, not the half
        assert reviewed["duration_seconds"] == pytest.approx(sf.info(mix).duration, abs=0.05)
        assert reviewed["duration_seconds"] > 5.5
        watched.wait_for(f"stalled{suffix}: {run['result']['verdict']}")
        time.sleep(settle * 4)
        assert watched.count("stalled") == 2 + watched.count(f"stalled{suffix}: "
                                                             f"{run['result']['verdict']}")
    listed = server.client.get("/runs").json()["runs"]
    assert [r["run_id"] for r in listed] == [run_id]  # one export, one run


def headerless_export(server_factory: Any, tmp_path: Path) -> tuple[Any, Path, bytes, Path]:
    """A server with quick retries, a watched folder, the bytes of an MP3 without a
    Xing frame (nothing in it says its length) and where it is to be written."""
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_RETRY_BASE_SECONDS": "1",
                             "AGENTBOX_RETRY_MAX_SECONDS": "2"}).start()
    folder = tmp_path / "exports"
    folder.mkdir()
    data = ffmpeg_render(tmp_path / "render.mp3", 6.0, "-write_xing", "0")
    return server, folder, data, folder / "late.mp3"


def test_a_file_written_on_after_its_review_is_reviewed_whole_in_a_follow_up(
        server_factory: Any, tmp_path: Path) -> None:
    """The one case the watcher cannot see coming: a file that says nothing of its
    length, stalled longer than even the headerless settle time, reviewed meanwhile.
    The export keeps its one session.exported run; the whole file is reviewed by a
    mix.review_requested that names that run."""
    server, folder, data, mix = headerless_export(server_factory, tmp_path)
    go_on = threading.Event()
    with watching(server.env, server.home, folder, "--settle", "0.3", "--url", server.url,
                  "--headerless-settle", "0.6") as watched:
        writer = stalling_writer(mix, data, len(data) // 2, stall=0, before_rest=go_on)
        first = watched.wait_for("late.mp3: accepted").split()[-1]
        run = server.wait_terminal(first, timeout=90)
        assert run["result"]["file"]["size_bytes"] == len(data) // 2  # it read the half
        go_on.set()
        writer.join(60)
        watched.wait_for(f"late.mp3: written on after it was sent; still {first}")
        again = watched.wait_for("late.mp3: reviewed whole again").split()[-1]
        assert f"(run {first} read it unfinished)" in watched.wait_for("late.mp3: reviewed")
        whole = server.wait_terminal(again, timeout=90)
        assert whole["status"] == "succeeded", whole
        assert whole["event_type"] == "mix.review_requested"
        assert whole["causation_id"] == first
        assert whole["result"]["file"]["size_bytes"] == len(data)
        assert whole["result"]["file"]["duration_seconds"] > 5.5
    listed = server.client.get("/runs").json()["runs"]
    assert sorted(r["run_id"] for r in listed) == sorted([first, again])
    assert sum(r["event_type"] == "session.exported" for r in listed) == 1


def test_a_file_rewritten_under_the_same_name_is_a_new_export(tmp_path: Path) -> None:
    now = [0.0]
    watcher = Watcher(tmp_path, settle=1.0, clock=lambda: now[0], headerless_settle=3.0)
    watcher.poll()
    first, second = (ffmpeg_render(tmp_path / "r.mp3", s, "-write_xing", "0")
                     for s in (2.0, 3.0))
    mix = tmp_path / "song.mp3"
    mix.write_bytes(first[: len(first) // 2])
    watcher.poll()
    now[0] = 2.0
    assert watcher.poll() == []  # no Xing/Info frame: 1 s is not enough
    now[0] = 3.5
    assert watcher.poll() == [mix]
    watcher.sent(mix, "watch-first")
    with open(mix, "ab") as f:  # the same writer, on again
        f.write(first[len(first) // 2:])
    now[0] = 4.0
    watcher.poll()
    now[0] = 8.0
    assert watcher.poll() == [mix]
    assert watcher.continues(mix) is not None and watcher.continues(mix).event_id == "watch-first"
    watcher.sent(mix, "watch-first")
    mix.write_bytes(second)  # a new render under the same name
    now[0] = 9.0
    watcher.poll()
    now[0] = 13.0
    assert watcher.poll() == [mix]
    assert watcher.continues(mix) is None


@pytest.mark.parametrize("grows", ["while-stopped", "after-the-restart"])
def test_a_restarted_watcher_keeps_one_export_for_a_file_written_on(
        server_factory: Any, tmp_path: Path, grows: str) -> None:
    """The watcher is killed (SIGKILL: nothing saved at exit) after it sent half a
    file that says nothing of its length, and started again; the file is written on
    while it is stopped, or after it started again. Still one session.exported run,
    and the whole file reviewed by the follow-up that names it."""
    server, folder, data, mix = headerless_export(server_factory, tmp_path)
    go_on = threading.Event()
    options = ("--settle", "0.3", "--url", server.url, "--headerless-settle", "0.6")
    with watching(server.env, server.home, folder, *options) as watched:
        writer = stalling_writer(mix, data, len(data) // 2, stall=0, before_rest=go_on)
        first = watched.wait_for("late.mp3: accepted").split()[-1]
        watched.process.kill()
        watched.process.wait(10)
    assert server.wait_terminal(first, timeout=90)["result"]["file"]["size_bytes"] == (
        len(data) // 2)
    if grows == "while-stopped":
        go_on.set()
        writer.join(60)
    with watching(server.env, server.home, folder, *options) as watched:
        go_on.set()
        writer.join(60)
        watched.wait_for(f"late.mp3: written on after it was sent; still {first}")
        again = watched.wait_for("late.mp3: reviewed whole again").split()[-1]
        whole = server.wait_terminal(again, timeout=90)
        assert (whole["status"], whole["causation_id"]) == ("succeeded", first), whole
        assert whole["result"]["file"]["size_bytes"] == len(data)
        assert watched.count("late.mp3: accepted") == 0  # no second export
    listed = server.client.get("/runs").json()["runs"]
    assert sorted(r["run_id"] for r in listed) == sorted([first, again])
    assert sum(r["event_type"] == "session.exported" for r in listed) == 1


def test_what_a_watcher_sent_is_kept_for_the_next_one(tmp_path: Path) -> None:
    """The state file in process: a file sent and handed over is left alone by the
    next watcher while unchanged; one written on since is still that export; one
    sent but not handed over is sent again, and so is one found being written and
    not yet sent; a state file that cannot be read is said once, and the watcher
    starts afresh."""
    folder, state = tmp_path / "exports", tmp_path / "data" / "watch" / "state.json"
    folder.mkdir()
    now = [0.0]

    def watcher(**options: Any) -> Watcher:
        found = Watcher(folder, settle=1.0, clock=lambda: now[0], state=state, **options)
        assert found.poll() == []  # its first scan
        return found

    first = watcher()
    taken, waiting = folder / "taken.wav", folder / "waiting.wav"
    taken.write_bytes(b"RIFF" + b"\0" * 100)
    waiting.write_bytes(b"RIFF" + b"\1" * 100)
    first.poll()
    now[0] = 2.0
    assert sorted(first.poll()) == [taken, waiting]
    first.sent(taken, "watch-taken")
    first.taken(taken)
    first.sent(waiting, "watch-waiting")  # the watcher stops before agentbox answers
    assert json.loads(state.read_text())["exports"]["taken.wav"]["taken"] is True

    second = watcher()
    now[0] = 4.0
    assert second.poll() == [waiting]  # sent again; the one handed over is left alone
    assert second.continues(waiting).event_id == "watch-waiting"  # type: ignore[union-attr]
    second.sent(waiting, "watch-waiting")
    with open(taken, "ab") as f:  # written on
        f.write(b"\2" * 50)
    second.poll()
    now[0] = 6.0
    assert second.poll() == [taken]
    assert second.continues(taken).event_id == "watch-taken"  # type: ignore[union-attr]

    # Found being written, and the watcher stops before it is sent: the next one sends
    # it once it is done, though it was there when that one started.
    second.sent(taken, "watch-taken")
    second.taken(taken)
    second.taken(waiting)
    rendering = folder / "rendering.wav"
    rendering.write_bytes(b"RIFF" + b"\3" * 40)
    second.poll()
    assert json.loads(state.read_text())["found"] == ["rendering.wav"]
    with open(rendering, "ab") as f:  # the render goes on while no watcher runs
        f.write(b"\3" * 60)
    fourth = watcher()
    now[0] = 8.0
    assert fourth.poll() == [rendering]
    fourth.sent(rendering, "watch-rendering")
    assert json.loads(state.read_text())["found"] == []
    assert watcher().poll() == []  # sent: not found again

    state.write_text("{not json")
    said: list[str] = []
    third = watcher(warn=said.append)
    assert third.continues(taken) is None
    third.sent(taken, "watch-again")
    third.sent(taken, "watch-again")
    assert len(said) == 1 and "cannot be read" in said[0] and "starting afresh" in said[0]
    assert json.loads(state.read_text())["exports"]["taken.wav"]["event_id"] == "watch-again"


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and symlinks: POSIX")
def test_a_link_out_of_the_folder_is_skipped_and_one_inside_is_watched(
        tmp_path: Path) -> None:
    """Another account that may write in the watched folder plants links: one to the
    user's private mix outside it is never picked up (agentbox would review it and
    serve its bytes), nor a folder link out, nor a FIFO; a link to a render inside
    it is."""
    folder, private = tmp_path / "exports", tmp_path / "private"
    (folder / "takes").mkdir(parents=True)
    private.mkdir()
    rate = 48_000
    audio = np.zeros((rate // 2, 2), dtype="float32")
    sf.write(private / "unreleased.wav", audio, rate)
    sf.write(folder / "takes" / "take1.wav", audio, rate)
    (folder / "x.wav").symlink_to(private / "unreleased.wav")
    (folder / "relative.wav").symlink_to(Path("..") / "private" / "unreleased.wav")
    (folder / "elsewhere").symlink_to(private, target_is_directory=True)
    (folder / "take.wav").symlink_to(folder / "takes" / "take1.wav")
    os.mkfifo(folder / "pipe.wav")  # reading it would wait for a writer for ever
    now = [0.0]
    watcher = Watcher(folder, settle=1.0, include_existing=True, clock=lambda: now[0])
    watcher.poll()
    now[0] = 2.0
    assert sorted(watcher.poll()) == [folder / "take.wav", folder / "takes" / "take1.wav"]
