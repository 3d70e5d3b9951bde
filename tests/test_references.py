"""Projects' reference tracks: added by the API (the CLI's way) or the page's form
(its CSRF token), measured once, kept in the archive, and compared with in every
later review of the project, in a musician's words; the event's reference_url
wins for its event. The real app in process with the real mix review."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import soundfile

from agentbox.review.web import references
from tests.conftest import ADMIN_TOKEN, InProcess, in_process, make_event

RATE = 48_000
TOKEN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def noise(path: Path, seconds: float, level: float, top_hz: float | None = None,
          seed: int = 1) -> bytes:
    """Pink-ish stereo noise, 8 dB down above `top_hz` (a dull mix)."""
    rng = np.random.default_rng(seed)
    n = int(RATE * seconds)
    spectrum = np.fft.rfft(rng.standard_normal((n, 2)), axis=0)
    hz = np.fft.rfftfreq(n, 1 / RATE)
    spectrum[1:] /= np.sqrt(hz[1:, None])
    spectrum[0] = 0
    if top_hz is not None:
        spectrum[hz > top_hz] *= 10 ** (-8 / 20)
    audio = np.fft.irfft(spectrum, n, axis=0)
    soundfile.write(path, level * audio / np.abs(audio).max(), RATE, subtype="PCM_24")
    settled = time.time() - 60
    os.utime(path, (settled, settled))
    return path.read_bytes()


async def add(box: InProcess, project: str, path: Path, client: Any = None,
              **headers: str) -> Any:
    return await (client or box.client).put(
        f"/projects/{quote(project, safe='')}/reference", params={"name": path.name},
        content=path.read_bytes(), headers=headers or TOKEN)


async def review(box: InProcess, path: Path, project: str, **payload: Any) -> dict[str, Any]:
    answer = await box.post(make_event(payload={"project_id": project, "mix_url": str(path),
                                                **payload}))
    run = await box.wait_status(answer.json()["run_id"], timeout=60)
    assert run["status"] == "succeeded", run
    return run


@pytest.mark.anyio
async def test_a_projects_reference_is_compared_in_every_review(tmp_path: Path) -> None:
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        heard = noise(tmp_path / "Their Record.wav", 12, 0.9)
        added = await add(box, "Night Drive", tmp_path / "Their Record.wav")
        assert added.status_code == 201, added.text
        shown = added.json()
        assert shown["name"] == "Their Record.wav" and shown["project"] == "Night Drive"
        assert shown["sha256"] == hashlib.sha256(heard).hexdigest()
        assert shown["integrated_lufs"] < -5 and len(shown["octave_bands"]) >= 9
        assert (await box.client.get("/projects/Night%20Drive/reference")).json() == shown
        assert [r["project"] for r in (await box.client.get("/references")).json()[
            "references"]] == ["Night Drive"]
        played = await box.client.get(shown["audio_url"])
        assert played.status_code == 200 and played.content == heard

        # two exports, dull and quieter: both compared with it, in a musician's words
        for take in (1, 2):
            noise(tmp_path / "mix.wav", 12, 0.3, top_hz=6000, seed=take + 1)
            run = await review(box, tmp_path / "mix.wav", "Night Drive")
            reference = run["result"]["reference"]
            assert reference["source"] == "project" and reference["file"] == "Their Record.wav"
            note = reference["note"]
            assert "quieter than your reference Their Record.wav" in note, note
            assert "less air at 8-16 kHz than your reference" in note, note
            assert -9.5 < reference["deltas"]["band_16000_hz_db"] < -6.5
            assert {"plr_db", "stereo_correlation", "loudness_range_lu"} <= set(
                reference["deltas"])
            # the octaves held against the reference's own balance, not the genre curve
            bands = {b["hz"]: b for b in run["result"]["metrics"]["octave_bands"]}
            theirs = {b["hz"]: b["db"] for b in shown["octave_bands"]}
            offsets = [bands[hz]["reference_db"] - theirs[hz] for hz in theirs if hz in bands]
            assert max(offsets) - min(offsets) < 0.11, offsets  # its curve, moved whole
            assert any(n["code"] == "reference" for n in run["result"]["notes"])

        # the event's own reference wins for that event (a new render: the latest's very
        # bytes again would be that export, docs/cli.md "What counts as a render")
        noise(tmp_path / "other.wav", 12, 0.5, seed=9)
        noise(tmp_path / "mix.wav", 12, 0.3, top_hz=6000, seed=4)
        own = await review(box, tmp_path / "mix.wav", "Night Drive",
                           reference_url=str(tmp_path / "other.wav"))
        assert own["result"]["reference"]["source"] == "event"
        assert "the reference track other.wav" in own["result"]["reference"]["note"]

        # removed: later reviews compare with nothing, and its bytes go
        removed = await box.client.delete("/projects/Night%20Drive/reference", headers=TOKEN)
        assert removed.json()["removed"]["name"] == "Their Record.wav"
        assert not box.app.state.apps["review"].archive.blobs.has(shown["sha256"])
        gone = await box.client.get("/projects/Night%20Drive/reference")
        assert (gone.status_code, gone.json()["error_code"]) == (404, "reference_not_found")
        noise(tmp_path / "mix.wav", 12, 0.3, top_hz=6000, seed=5)  # the next render
        later = await review(box, tmp_path / "mix.wav", "Night Drive")
        assert later["result"]["reference"] is None


@pytest.mark.anyio
async def test_changing_a_reference_takes_the_token_or_the_pages_csrf(tmp_path: Path) -> None:
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        track = tmp_path / "ref.wav"
        noise(track, 3, 0.5)
        assert (await add(box, "Song", track, Authorization="Bearer wrong")).status_code == 401
        async with box.browser() as page:  # a browser, logged in: a session, no token
            assert (await page.post("/ui/login", data={"token": ADMIN_TOKEN})
                    ).status_code == 303
            assert (await add(box, "Song", track, page, **{"X-CSRF-Token": "forged"})
                    ).status_code == 401
            csrf = await box.csrf()
            elsewhere = await add(box, "Song", track, page, **{
                "X-CSRF-Token": csrf, "Origin": "https://evil.example"})
            assert elsewhere.status_code == 401
            assert (await add(box, "Song", track, page, **{"X-CSRF-Token": csrf})
                    ).status_code == 201
            no_delete = await page.delete("/projects/Song/reference")
            assert no_delete.status_code == 401
            assert (await page.get("/projects/Song/reference")).status_code == 200


@pytest.mark.anyio
async def test_a_reference_that_is_not_audio_or_too_big_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        text = tmp_path / "notes.wav"
        text.write_bytes(b"not audio at all" * 100)
        refused = await add(box, "Song", text)
        assert refused.status_code == 422 and refused.json()["error_code"] == (
            "reference_unreadable")
        assert "notes.wav cannot be used as a reference" in refused.json()["message"]
        assert "incoming" not in refused.json()["message"]  # not where it was written
        empty = tmp_path / "empty.wav"
        empty.write_bytes(b"")
        assert (await add(box, "Song", empty)).json()["error_code"] == "reference_unreadable"
        monkeypatch.setattr(references, "MAX_REFERENCE_BYTES", 1000)
        noise(tmp_path / "big.wav", 1, 0.5)
        big = await add(box, "Song", tmp_path / "big.wav")
        assert (big.status_code, big.json()["error_code"]) == (413, "reference_too_large")
        bad = await box.client.put("/projects/%0A/reference", content=b"x", headers=TOKEN)
        assert bad.status_code == 404
        # nothing was kept of any of them
        assert list(box.app.state.apps["review"].archive.blobs.committed()) == []
        assert list(box.app.state.apps["review"].archive.blobs.incoming.iterdir()) == []
        assert (await box.client.get("/references")).json() == {"references": []}


@pytest.mark.anyio
async def test_a_project_named_like_a_reference_keeps_its_page(tmp_path: Path) -> None:
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        noise(tmp_path / "mix.wav", 2, 0.5)
        await review(box, tmp_path / "mix.wav", "Tape/reference")
        page = await box.client.get("/projects/Tape%2Freference")
        assert page.status_code == 200 and "Tape/reference" in page.text
        assert (await box.client.get("/projects/Tape/reference")).json()["error_code"] == (
            "reference_not_found")


@pytest.mark.anyio
async def test_the_archives_bounds_never_drop_a_reference_in_use(tmp_path: Path) -> None:
    # room for the reference and one export (576 kB each): the older exports go
    environ = {"AGENTBOX_AGENTS": "", "AGENTBOX_ARCHIVE_MAX_GB": "0.0012"}
    async with in_process(tmp_path, **environ) as box:
        noise(tmp_path / "ref.wav", 2, 0.5)
        shown = (await add(box, "Song", tmp_path / "ref.wav")).json()
        for seed in (1, 2, 3):
            noise(tmp_path / "mix.wav", 2, 0.3, seed=seed)
            await review(box, tmp_path / "mix.wav", "Song")
            await box.app.state.apps["review"].archive.settled()
        archive = box.app.state.apps["review"].archive
        assert archive.blobs.has(shown["sha256"])  # in use, never let go
        kept = [k for k in await box.app.state.apps["review"].archive.history.kept_audio(
            "Song") if not k.dropped_at]
        assert len(kept) == 1  # and the project's latest export
        assert (await box.client.get(shown["audio_url"])).status_code == 200


def test_the_reference_commands_against_a_real_server(server_factory: Any,
                                                     tmp_path: Path) -> None:
    import subprocess
    import sys

    server = server_factory({"AGENTBOX_AGENTS": ""}).start()

    def agentbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                              env=server.env, capture_output=True, text=True, timeout=120,
                              cwd=server.home)

    none = agentbox("reference", "list")
    assert none.returncode == 0 and "No project has a reference track" in none.stdout
    noise(tmp_path / "Their Record.wav", 4, 0.8)
    added = agentbox("reference", "add", str(tmp_path / "Their Record.wav"), "--project",
                     "Über Nacht")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("Their Record.wav is the reference of Über Nacht: -")
    assert "LUFS" in added.stdout and " dBTP" in added.stdout
    true_peak = added.stdout.split(" dBTP")[0].rsplit(", ", 1)[1]
    assert true_peak[0] in "+-"  # signed, as every review says a peak
    assert "no export of Über Nacht has arrived yet" in added.stderr  # a typo is told
    listed = agentbox("reference", "list", "--json")
    assert [r["name"] for r in json.loads(listed.stdout)] == ["Their Record.wav"]
    (tmp_path / "notes.txt").write_text("not audio")
    refused = agentbox("reference", "add", str(tmp_path / "notes.txt"), "--project", "x")
    assert refused.returncode == 1 and "cannot be used as a reference" in refused.stderr
    removed = agentbox("reference", "remove", "Über Nacht")
    assert removed.returncode == 0 and "no longer has a reference track" in removed.stdout
    again = agentbox("reference", "remove", "Über Nacht")
    assert again.returncode == 1 and "has no reference track" in again.stderr
