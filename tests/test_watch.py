"""`agentbox watch` against a real server: exports are never dropped for a reason that
heals, one export is one run however its writer stalls, every format the review
reads is picked up, and each review is printed when it finishes."""

from __future__ import annotations

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

from agentbox.watch import AUDIO_SUFFIXES, Watcher, audio_complete
from tests.conftest import make_event, wait_until
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
            assert watched.count("stalled.wav") == 0  # not taken for finished
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
        assert watched.count("stalled.wav: duplicate") == 0
    listed = server.client.get("/runs").json()["runs"]
    assert [r["run_id"] for r in listed] == [run_id]  # one export, one run


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
    now[0] = 31.0
    assert watcher.poll() == [half]  # unchanged that long: sent, the review says it is cut
    for fmt, suffix in (("AIFF", ".aiff"), ("RF64", ".rf64")):
        path = tmp_path / f"x{suffix}"
        sf.write(path, audio, rate, subtype="PCM_16", format=fmt)
        assert audio_complete(path) is True, fmt
        path.write_bytes(path.read_bytes()[:-1000])
        assert audio_complete(path) is False, fmt
    mp3 = tmp_path / "x.mp3"
    sf.write(mp3, audio, rate, format="MP3")
    assert audio_complete(mp3) is None  # no declared length: the settle time decides
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
