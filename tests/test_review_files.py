"""A sender's file, read safely by the real analysis processes: a FIFO or a symbolic
link swapped in for the mix is refused at once (never followed, never waited on:
the analysis process goes on with the next review), and a file whose channels,
sample rate or declared length no mix has is refused before a sample is decoded,
naming the limit."""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from agentbox.archive.blobs import Keep
from agentbox.review import meter
from agentbox.review.analysis import Analysis

# FIFOs and symbolic links as any user makes them: POSIX (on Windows agentbox looks at
# the path first and checks the file it opened is the one it looked at).
POSIX = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and symlinks: POSIX")
ANSWER_SECONDS = 60.0  # a deadline for an answer, not a measure of its speed
RATE = 48_000


@pytest.fixture
async def analysis() -> AsyncIterator[Analysis]:
    made = Analysis(1)
    yield made
    await asyncio.to_thread(made.shutdown)


def mix(path: Path, seconds: float = 1.0, channels: int = 2, rate: int = RATE) -> Path:
    rng = np.random.default_rng(3)
    soundfile.write(path, 0.2 * np.tanh(rng.standard_normal((int(rate * seconds), channels))),
                    rate, subtype="PCM_16")
    return path


async def analysed(analysis: Analysis, path: Path, keep: Keep | None = None
                   ) -> tuple[Any, ...]:
    return await asyncio.wait_for(analysis.run((str(path), keep)), ANSWER_SECONDS)


@POSIX
@pytest.mark.anyio
@pytest.mark.parametrize("keeping", [False, True], ids=["hashed", "copied"])
async def test_a_fifo_or_a_link_swapped_in_is_refused_without_blocking(
        tmp_path: Path, analysis: Analysis, keeping: bool) -> None:
    keep = None
    if keeping:
        (tmp_path / "incoming").mkdir()
        keep = Keep(tmp_path / "incoming", 1 << 40, 0)
    fifo = tmp_path / "swapped.wav"
    os.mkfifo(fifo)  # no writer ever comes: an open that waits would wait for ever
    refused = await analysed(analysis, fifo, keep)
    assert refused[:2] == ("error", "mix_unreadable"), refused
    assert "regular file" in refused[2]
    private = mix(tmp_path / "private.wav")
    link = tmp_path / "link.wav"
    link.symlink_to(private)
    refused = await analysed(analysis, link, keep)
    assert refused[:2] == ("error", "mix_unreadable"), refused
    assert "symbolic link" in refused[2]
    # the same process goes on with the next mix
    answer = await analysed(analysis, private, keep)
    assert answer[0] == "ok", answer
    assert answer[1]["channels"] == 2


@POSIX
def test_the_meter_opens_the_file_itself_never_a_link_or_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.wav"
    os.mkfifo(fifo)
    with pytest.raises(meter.AudioError, match="regular file"):
        meter.measure(str(fifo))
    link = tmp_path / "link.wav"
    link.symlink_to(mix(tmp_path / "real.wav"))
    with pytest.raises(meter.AudioError, match="symbolic link"):
        meter.measure(str(link))
    assert meter.measure(str(tmp_path / "real.wav")).channels == 2


def wav_header(channels: int, rate: int, frames: int, bits: int = 16) -> bytes:
    """A PCM WAV header that declares `frames` frames (the data need not follow)."""
    align = channels * bits // 8
    data = frames * align
    return (b"RIFF" + struct.pack("<I", 36 + data) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * align, align,
                                    bits)
            + b"data" + struct.pack("<I", data))


@pytest.mark.anyio
async def test_a_file_no_mix_is_refused_before_decoding_naming_the_limit(
        tmp_path: Path, analysis: Analysis) -> None:
    """1024 channels (a 3 s file of them took minutes and gigabytes), 1 MHz, and a
    header that declares five hours: each refused as mix_out_of_limits, the message
    naming the limit."""
    many = tmp_path / "many.wav"
    many.write_bytes(wav_header(1024, RATE, 100) + bytes(1024 * 2 * 100))
    fast = tmp_path / "fast.wav"
    fast.write_bytes(wav_header(2, 1_000_000, 1000) + bytes(2 * 2 * 1000))
    long = tmp_path / "long.wav"
    long.write_bytes(wav_header(2, RATE, 5 * 3600 * RATE) + bytes(2 * 2 * RATE))
    for path, limit in ((many, f"at most {meter.MAX_CHANNELS}"),
                        (fast, f"{meter.MAX_SAMPLE_RATE} Hz"),
                        (long, "at most 4:00:00")):
        refused = await analysed(analysis, path)
        assert refused[:2] == ("error", "mix_out_of_limits"), (path.name, refused)
        assert limit in refused[2], refused[2]
    within = mix(tmp_path / "surround.wav", seconds=0.5, channels=12)
    answer = await analysed(analysis, within)
    assert answer[0] == "ok" and answer[1]["channels"] == 12, answer


# -- AGENTBOX_MIX_ROOTS: the folders a signed sender may name ----------------------------------


@POSIX
@pytest.mark.anyio
async def test_a_mix_outside_the_mix_roots_is_refused_naming_the_field(tmp_path: Path) -> None:
    """Without roots a signed sender can name any file the user can read; with them,
    a mix_url (or reference_url) outside every root, a link out of a root included,
    is refused at once with 422 invalid_event naming the field."""
    from agentbox.review.agent import confine_mixes
    from tests.conftest import in_process, make_event

    allowed, private = tmp_path / "exports", tmp_path / "private"
    allowed.mkdir()
    private.mkdir()
    inside = mix(allowed / "song.wav")
    secret = mix(private / "unreleased.wav")
    (allowed / "link.wav").symlink_to(secret)
    settled = inside.stat().st_mtime - 60
    os.utime(inside, (settled, settled))
    roots = os.pathsep.join([str(allowed), str(tmp_path / "elsewhere")])
    try:
        async with in_process(tmp_path, AGENTBOX_AGENTS="", AGENTBOX_MIX_ROOTS=roots) as box:
            for payload, field in (({"mix_url": str(secret)}, "mix_url"),
                                   ({"mix_url": str(allowed / "link.wav")}, "mix_url"),
                                   ({"mix_url": str(inside), "reference_url": str(secret)},
                                    "reference_url")):
                answer = await box.post(make_event(payload={"project_id": "Song", **payload}))
                assert answer.status_code == 422, answer.text
                body = answer.json()
                assert body["error_code"] == "invalid_event"
                assert [e["loc"] for e in body["errors"]] == [["payload", field]], body
                assert "AGENTBOX_MIX_ROOTS" in body["errors"][0]["msg"]
            taken = await box.post(make_event(payload={"project_id": "Song",
                                                       "mix_url": inside.as_uri()}))
            assert taken.status_code == 202, taken.text
            run = await box.wait_status(taken.json()["run_id"], timeout=60)
            assert run["status"] == "succeeded", run
    finally:
        confine_mixes(())


# -- what the audio routes answer ---------------------------------------------------------------


@pytest.mark.anyio
async def test_the_audio_routes_answer_only_audio_types(tmp_path: Path) -> None:
    """The sender names the file: a WAV named evil.html is downloaded, never shown as
    a page of this site; a .wav is audio/wav, to be played."""
    from tests.conftest import ADMIN_TOKEN, in_process
    from tests.test_archive import render, review

    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        for name, project in (("evil.html", "Evil"), ("mix.wav", "Song")):
            heard = render(tmp_path / name, 1)
            run = await review(box, tmp_path / name, project)
            await box.app.state.apps["review"].archive.settled()
            played = await box.client.get(f"/runs/{run['run_id']}/audio")
            assert played.status_code == 200 and played.content == heard
            if name == "mix.wav":
                assert played.headers["content-type"] == "audio/wav"
                assert "content-disposition" not in played.headers
            else:
                assert played.headers["content-type"] == "application/octet-stream"
                assert played.headers["content-disposition"].startswith("attachment")
        put = await box.client.put("/projects/Evil/reference", params={"name": "ref.svg"},
                                   content=(tmp_path / "mix.wav").read_bytes(),
                                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert put.status_code == 201, put.text
        reference = await box.client.get("/projects/Evil/reference/audio")
        assert reference.headers["content-type"] == "application/octet-stream"
        assert reference.headers["content-disposition"] == (
            "attachment; filename*=UTF-8''ref.svg")
