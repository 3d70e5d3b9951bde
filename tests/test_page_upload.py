"""Review a file from the page (POST /exports, agentbox.review.web.drops): the home
page's and a project page's form, through a real server with the built-in mix
review and real audio the test makes, and the refusals said in words; in process,
the limits an upload is held to (size, the disk's margin) and the CSRF check."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import soundfile
from playwright.sync_api import Browser, Page, expect

from agentbox.client import project_of
from agentbox.review.contract import project_of_file
from agentbox.review.web import drops, references
from tests.conftest import InProcess, Server, in_process, wait_until
from tests.support.browser import as_the_user, chromium, fresh_page
from tests.support.corpus import Song, song_audio, write

AS_PAGE = {"Accept": "text/html"}  # what a browser's form asks for
AS_SCRIPT = {"Accept": "application/json"}  # what the page's script asks for


def tone(seconds: float = 1.0, rate: int = 48_000) -> bytes:
    """A short stereo WAV, made here."""
    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    soundfile.write(out, np.stack([0.3 * np.sin(2 * np.pi * 440 * t)] * 2, axis=1), rate,
                    format="WAV", subtype="PCM_24")
    return out.getvalue()


def dropped_files(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "archive" / drops.DROPPED).rglob("*") if p.is_file()] \
        if (data_dir / "archive" / drops.DROPPED).exists() else []


def form(csrf: str, **fields: str) -> dict[str, str]:
    return {"csrf": csrf, **fields}


# -- in process: refusals before anything is reviewed ------------------------------------


@pytest.mark.anyio
async def test_a_forged_or_tokenless_form_keeps_nothing(box: InProcess) -> None:
    forged = await box.client.post("/exports", data=form("forged"), headers=AS_SCRIPT,
                                   files={"file": ("mix.wav", tone())})
    assert forged.status_code == 403 and forged.json()["error_code"] == "csrf_failed"
    anonymous = box.anonymous()  # another program, without the admin token
    try:
        wrong = await anonymous.post("/exports", files={"file": ("mix.wav", tone())},
                                     headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    finally:
        await anonymous.aclose()
    assert dropped_files(box.settings.data_dir) == []


@pytest.mark.anyio
async def test_what_is_not_a_form_or_not_audio_is_refused_in_words(box: InProcess) -> None:
    csrf = await box.csrf()
    raw = await box.client.post("/exports", content=tone(), headers={
        "Content-Type": "audio/wav", **AS_SCRIPT})
    assert raw.status_code == 415 and "multipart/form-data" in raw.json()["message"]
    for name, body, said in (("notes.wav", b"these are my notes\n", "not an audio file"),
                             ("empty.wav", b"", "empty")):
        page = await box.client.post("/exports", data=form(csrf),
                                     files={"file": (name, body)}, headers=AS_PAGE)
        assert page.status_code == 422, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert f"{name} cannot be reviewed: it is {said}" in page.text
    none = await box.client.post("/exports", data=form(csrf), headers=AS_SCRIPT,
                                 files={"file": ("", b"")})
    assert none.status_code == 422
    two = await box.client.post("/exports", data=form(csrf), headers=AS_SCRIPT,
                                files=[("file", ("a.wav", tone())), ("file", ("b.wav", tone()))])
    assert two.status_code == 422 and two.json()["error_code"] == "one_file"
    stage = await box.client.post("/exports", data=form(csrf, stage="final"),
                                  files={"file": ("mix.wav", tone())}, headers=AS_SCRIPT)
    assert stage.status_code == 422 and stage.json()["error_code"] == "invalid_stage"
    long = await box.client.post("/exports", data=form(csrf, project="x" * 2000),
                                 files={"file": ("mix.wav", tone())}, headers=AS_SCRIPT)
    assert long.status_code == 422 and long.json()["error_code"] == "form_field_too_large"
    assert dropped_files(box.settings.data_dir) == []  # refused: nothing kept
    assert (await box.client.get("/exports")).json()["exports"] == []  # no project made


@pytest.mark.anyio
async def test_the_limits_of_an_upload_hold(box: InProcess,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    csrf = await box.csrf()
    monkeypatch.setattr(references, "MAX_REFERENCE_BYTES", 10_000)  # receive's limit
    large = await box.client.post("/exports", data=form(csrf), headers=AS_SCRIPT,
                                  files={"file": ("long.wav", tone(2.0))})
    assert large.status_code == 413 and "shorter or compressed" in large.json()["message"]
    monkeypatch.setattr(drops, "MAX_DROP_BYTES", 10_000)  # said before the body is read
    page = await box.client.post("/exports", data=form(csrf), headers=AS_PAGE,
                                 files={"file": ("long.wav", tone(2.0))})
    assert page.status_code == 413 and "larger than" in page.text
    assert dropped_files(box.settings.data_dir) == []


@pytest.mark.anyio
async def test_no_room_on_the_disk_is_a_507_in_words(tmp_path: Path) -> None:
    async with in_process(tmp_path, AGENTBOX_MIN_FREE_MB=str(10 ** 12)) as full:
        answer = await full.client.post("/exports", data=form(await full.csrf()),
                                        files={"file": ("mix.wav", tone())}, headers=AS_PAGE)
        assert answer.status_code == 507, answer.text
        assert "no room to keep the file" in answer.text
        assert dropped_files(full.settings.data_dir) == []


@pytest.mark.slow
@pytest.mark.anyio
async def test_with_mix_roots_the_archive_folder_listed_lets_the_page_send(
        tmp_path: Path) -> None:
    """A file dropped on the page is in agentbox's archive folder: outside the mix
    roots it is refused in words; with the folder listed among them, reviewed."""
    elsewhere = tmp_path / "Exports"
    elsewhere.mkdir()
    archive = tmp_path / "data" / "archive"
    for roots, status in ((str(elsewhere), 422),
                          (os.pathsep.join([str(elsewhere), str(archive)]), 202)):
        async with in_process(tmp_path, AGENTBOX_AGENTS="", AGENTBOX_MIX_ROOTS=roots) as app:
            answer = await app.client.post("/exports", data=form(await app.csrf()),
                                           files={"file": ("mix.wav", tone())},
                                           headers=AS_SCRIPT)
            assert answer.status_code == status, answer.text
            if status == 422:
                assert "outside the folders agentbox may read" in answer.json()["message"]
            else:
                run = await app.wait_status(answer.json()["run_id"], timeout=120)
                assert run["status"] == "succeeded", run


def test_the_page_names_a_project_as_send_does() -> None:
    for name in ("Night Drive.wav", "Über Nacht (final).flac", "a\u200bb.wav", ".wav"):
        assert project_of_file(Path(name)) == project_of(Path(name))
    assert project_of_file(Path("Night Drive.wav")) == "Night Drive"


# -- through a real server with the mix review ---------------------------------------------


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("drop")
    server = Server(home, {"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    try:
        yield server
    finally:
        server.close()


@pytest.mark.slow
def test_a_file_given_on_the_home_page_is_reviewed_as_its_own_project(
        studio: Server, tmp_path: Path) -> None:
    mix = write(tmp_path / "Night Drive.wav", song_audio(Song(lufs=-20.0)))
    home = studio.client.get("/").text
    assert 'id="drop-form"' in home and 'enctype="multipart/form-data"' in home
    csrf = home.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    sent = studio.client.post("/exports", data=form(csrf), headers=AS_PAGE,
                              files={"file": (mix.name, mix.read_bytes(), "audio/wav")},
                              follow_redirects=False)
    assert sent.status_code == 303, sent.text
    run_id = sent.headers["location"].removeprefix("/ui/runs/")
    run = studio.wait_terminal(run_id, timeout=120)
    assert run["status"] == "succeeded", run
    assert run["result"]["project_id"] == "Night Drive"
    assert run["result"]["file"]["name"] == "Night Drive.wav"  # its own name, not a hash
    assert run["result"]["stage_source"] != "event"  # no stage asked: as send does
    page = studio.client.get(f"/ui/runs/{run_id}").text
    assert "Night Drive.wav" in page
    # The archive holds the bytes the review heard: the dropped copy goes, once.
    dropped = studio.home / "data" / "archive" / drops.DROPPED / run["event_id"]
    assert f"/{drops.DROPPED}/{run['event_id']}/" in run["result"]["mix_url"]
    wait_until(lambda: not dropped.exists(), 30, "the dropped copy to go")
    played = studio.client.get(f"/runs/{run_id}/audio")
    assert played.status_code == 200 and played.content == mix.read_bytes()  # from the archive


@pytest.mark.slow
def test_a_file_given_on_a_project_page_joins_it_at_the_stage_chosen(
        studio: Server, tmp_path: Path) -> None:
    first = write(tmp_path / "take 1.wav", song_audio(Song(lufs=-20.0)))
    csrf = studio.csrf()
    made = studio.client.post("/exports", data=form(csrf, project="Heroes Rite"),
                              files={"file": (first.name, first.read_bytes())},
                              headers=AS_SCRIPT)
    assert made.status_code == 202, made.text
    studio.wait_terminal(made.json()["run_id"], timeout=120)
    page = studio.client.get("/projects/" + quote("Heroes Rite", safe="")).text
    assert 'name="project" value="Heroes Rite"' in page and 'id="drop-form"' in page

    master = write(tmp_path / "master.wav", song_audio(Song(lufs=-14.0, seed=2)))
    sent = studio.client.post("/exports", data=form(csrf, project="Heroes Rite",
                                                    stage="master"),
                              files={"file": (master.name, master.read_bytes())},
                              headers=AS_SCRIPT)
    assert sent.status_code == 202, sent.text
    answer = sent.json()
    run = studio.wait_terminal(answer["run_id"], timeout=120)
    assert run["status"] == "succeeded", run
    review = run["result"]
    assert (review["project_id"], review["stage"], review["stage_source"]) == (
        "Heroes Rite", "master", "event")
    assert review["comparison"]["previous_run_id"] == made.json()["run_id"]
    exports = studio.client.get("/exports", params={"project": "Heroes Rite"}).json()
    assert [e["run_id"] for e in exports["exports"]] == [answer["run_id"],
                                                          made.json()["run_id"]]


# -- in Chromium: the drop zone, and the plain form without a script ---------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


def _review_shown(page: Page, name: str) -> str:
    """The review's page the browser landed on, once its review has come in."""
    expect(page).to_have_url(re.compile(r"/ui/runs/run_[0-9a-f]+$"), timeout=30_000)
    expect(page.locator("h1")).to_contain_text(name, timeout=120_000)
    return str(page.url.rsplit("/", 1)[1])


@pytest.mark.slow
def test_a_file_picked_in_the_drop_zone_is_reviewed(studio: Server, browser: Browser,
                                                    tmp_path: Path) -> None:
    mix = write(tmp_path / "Picked Song.wav", song_audio(Song(lufs=-19.0, seed=4)))
    notes = tmp_path / "notes.wav"
    notes.write_text("not audio at all\n")
    with fresh_page(browser) as page:
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(studio.url + "/")
        page.set_input_files("#drop-file", str(notes))  # chosen: not sent until Review
        status = page.locator("#drop-status")
        expect(status).to_contain_text("notes.wav: choose how to judge it, then Review")
        page.click("#drop-send")
        expect(status).to_contain_text("notes.wav cannot be reviewed", timeout=30_000)
        expect(status).to_have_class("refused")  # it stands out, not a muted aside
        assert page.url == studio.url + "/"  # refused: said where it was asked
        page.set_input_files("#drop-file", str(mix))
        page.select_option("#drop-stage", "mix")  # after the file: read when sent
        page.click("#drop-send")
        run_id = _review_shown(page, "Picked Song.wav")
        assert problems == []
    run = studio.wait_terminal(run_id, timeout=120)
    assert (run["result"]["project_id"], run["result"]["stage"]) == ("Picked Song", "mix")


@pytest.mark.slow
def test_a_file_dropped_on_the_zone_is_reviewed(studio: Server, browser: Browser) -> None:
    with fresh_page(browser) as page:
        page.goto(studio.url + "/")
        # What a file dragged from the desktop brings: a DataTransfer holding it.
        page.evaluate("""(bytes) => {
            const zone = document.getElementById("drop-form");
            const moved = new DataTransfer();
            moved.items.add(new File([new Uint8Array(bytes)], "Dropped Take.wav",
                                     {type: "audio/wav"}));
            zone.dispatchEvent(new DragEvent("dragover", {dataTransfer: moved,
                                                          cancelable: true}));
            zone.dispatchEvent(new DragEvent("drop", {dataTransfer: moved,
                                                      cancelable: true}));
        }""", list(tone(2.0)))
        run_id = _review_shown(page, "Dropped Take.wav")
    assert studio.wait_terminal(run_id, timeout=120)["result"]["project_id"] == "Dropped Take"


@pytest.mark.slow
def test_the_form_works_without_a_script(studio: Server, browser: Browser,
                                         tmp_path: Path) -> None:
    mix = write(tmp_path / "No Script.wav", song_audio(Song(lufs=-17.0, seed=5)))
    context = browser.new_context(**as_the_user(java_script_enabled=False))
    try:
        page = context.new_page()
        page.goto(studio.url + "/")
        page.set_input_files("#drop-file", str(mix))
        page.click("#drop-send")
        run_id = _review_shown(page, "No Script.wav")
    finally:
        context.close()
    assert studio.wait_terminal(run_id, timeout=120)["status"] == "succeeded"



@pytest.mark.slow
def test_the_latest_export_given_again_on_the_page_is_that_export(
        studio: Server, browser: Browser, tmp_path: Path) -> None:
    mix = write(tmp_path / "Given Twice.wav", song_audio(Song(lufs=-18.0, seed=6)))
    run_ids = []
    with fresh_page(browser) as page:
        for _ in range(2):
            page.goto(studio.url + "/")
            page.set_input_files("#drop-file", str(mix))
            page.click("#drop-send")
            run_ids.append(_review_shown(page, "Given Twice.wav"))
            studio.wait_terminal(run_ids[-1], timeout=120)
    assert run_ids[1] == run_ids[0]  # the same bytes as the latest: its review
    listed = studio.client.get("/exports", params={"project": "Given Twice"}).json()
    assert [e["run_id"] for e in listed["exports"]] == [run_ids[0]]
    again = studio.client.post("/exports", headers=AS_SCRIPT, data=form(studio.csrf()),
                               files={"file": ("Given Twice.wav", mix.read_bytes())})
    assert again.status_code == 200, again.text
    assert (again.json()["duplicate"], again.json()["run_id"]) == (True, run_ids[0])
