"""The archive of exports: the bytes each review heard, kept and played back.

The real app in process with the real mix review (its analysis processes, real
WAV files written here), over httpx's ASGI transport; a DAW that renders to the
same file name is played by rewriting the same file in place (the same inode,
truncated and written again), as DAWs do.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from hypothesis import given
from hypothesis import strategies as st

from agentbox import config
from agentbox.archive import budget
from agentbox.archive.blobs import Blobs, Keep, copy_in, is_hash, ready
from agentbox.archive.records import KeptAudio, ProjectReference
from agentbox.archive.settings import archive_path
from agentbox.review.web.audio import byte_range
from tests.conftest import InProcess, in_process, make_event

RATE = 48_000


def render(path: Path, seed: int, seconds: float = 2.0, level: float = 0.3) -> bytes:
    """Render into `path` as a DAW does: the same file, truncated and written again."""
    rng = np.random.default_rng(seed)
    audio = level * np.tanh(rng.standard_normal((int(RATE * seconds), 2)))
    scratch = path.with_name(f".scratch-{seed}.wav")
    soundfile.write(scratch, audio, RATE, subtype="PCM_24")
    data = scratch.read_bytes()
    scratch.unlink()
    with open(path, "r+b" if path.exists() else "wb") as out:  # same inode
        out.truncate(0)
        out.write(data)
    settled = time.time() - 60  # the review waits for a file still being written
    os.utime(path, (settled, settled))
    return data


async def review(box: InProcess, path: Path, project: str = "Song") -> dict[str, Any]:
    answer = await box.post(make_event(payload={"project_id": project, "mix_url": str(path)}))
    assert answer.status_code == 202, answer.text
    run = await box.wait_status(answer.json()["run_id"], timeout=60)
    assert run["status"] == "succeeded", run
    return run


async def audio(box: InProcess, run_id: str, **headers: str) -> Any:
    return await box.client.get(f"/runs/{run_id}/audio", headers=headers)


@pytest.mark.anyio
async def test_three_renders_to_one_file_name_leave_three_playable_exports(
        tmp_path: Path) -> None:
    mix = tmp_path / "Song.wav"
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        inode, renders = None, []
        for seed in (1, 2, 3):
            heard = render(mix, seed)
            inode = inode or mix.stat().st_ino
            assert mix.stat().st_ino == inode  # rewritten in place
            renders.append((heard, await review(box, mix)))
        await box.app.state.apps["review"].archive.settled()
        for heard, run in renders:
            assert run["result"]["file"]["sha256"] == hashlib.sha256(heard).hexdigest()
            whole = await audio(box, run["run_id"])
            assert whole.status_code == 200 and whole.content == heard
            assert whole.headers["content-type"] == "audio/wav"
            part = await audio(box, run["run_id"], Range="bytes=100-199")
            assert part.status_code == 206 and part.content == heard[100:200]
            assert part.headers["content-range"] == f"bytes 100-199/{len(heard)}"
            again = await audio(box, run["run_id"], **{"If-None-Match": whole.headers["etag"]})
            assert again.status_code == 304 and again.content == b""
            past = await audio(box, run["run_id"], Range=f"bytes={len(heard)}-")
            assert past.status_code == 416 and past.json()["error_code"] == (
                "range_not_satisfiable")
            assert past.headers["content-range"] == f"bytes */{len(heard)}"
            other = await audio(box, run["run_id"], Range="bytes=0-9", **{"If-Range": '"x"'})
            assert other.status_code == 200 and other.content == heard
        # the files are the user's alone, each kept once under its hash
        root = archive_path(box.settings.data_dir)
        kept = sorted(p for p in root.rglob("*") if p.is_file() and is_hash(p.name))
        assert [p.name for p in kept] == sorted(hashlib.sha256(h).hexdigest()
                                                for h, _ in renders)
        for path in [root, *(p.parent for p in kept)]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        for path in [*kept, root / "keeper"]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert not list((root / "incoming").iterdir())  # nothing left waiting


@pytest.mark.anyio
async def test_the_same_audio_twice_is_kept_once(tmp_path: Path) -> None:
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        heard = render(tmp_path / "a.wav", 7)
        render(tmp_path / "b.wav", 7)
        first = await review(box, tmp_path / "a.wav")
        second = await review(box, tmp_path / "b.wav", project="Other")
        await box.app.state.apps["review"].archive.settled()
        assert first["result"]["file"]["sha256"] == second["result"]["file"]["sha256"]
        kept = archive_path(box.settings.data_dir).rglob("*")
        assert len([p for p in kept if is_hash(p.name)]) == 1
        for run in (first, second):
            assert (await audio(box, run["run_id"])).content == heard


@pytest.mark.anyio
async def test_a_symlink_swapped_in_after_the_review_serves_nothing(tmp_path: Path) -> None:
    """The archive off: only the file at the path, and only while it is the one
    reviewed (size, modification time, SHA-256); never a symlink's target."""
    mix = tmp_path / "Song.wav"
    async with in_process(tmp_path, AGENTBOX_AGENTS="", AGENTBOX_ARCHIVE="0") as box:
        token = config.admin_token(box.settings)  # the file a swapped-in link names
        token_file = box.settings.config_dir / config.ADMIN_TOKEN_FILE
        heard = render(mix, 1)
        run = await review(box, mix)
        assert (await audio(box, run["run_id"])).content == heard
        assert not archive_path(box.settings.data_dir).exists()  # nothing kept

        mix.rename(tmp_path / "moved.wav")
        mix.symlink_to(token_file)
        refused = await audio(box, run["run_id"])
        assert refused.status_code == 404 and refused.json()["error_code"] == "audio_gone"
        assert token not in refused.text and "no longer where it was" in refused.text

        # the same size and modification time, other bytes: the hash tells
        mix.unlink()
        altered = bytearray(heard)
        altered[-100:] = bytes(100)
        mix.write_bytes(altered)
        reviewed = run["result"]["file"]["modified_ns"]
        os.utime(mix, ns=(reviewed, reviewed))
        assert (mix.stat().st_size, mix.stat().st_mtime_ns) == (len(heard), reviewed)
        assert (await audio(box, run["run_id"])).status_code == 404

        # the reviewed file back as it was: it plays again
        mix.unlink()
        (tmp_path / "moved.wav").rename(mix)
        assert (await audio(box, run["run_id"])).content == heard


@pytest.mark.anyio
async def test_the_archive_plays_what_was_reviewed_whatever_the_path_holds_now(
        tmp_path: Path) -> None:
    mix = tmp_path / "Song.wav"
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        heard = render(mix, 1)
        run = await review(box, mix)
        mix.unlink()
        mix.symlink_to(box.settings.config_dir / config.ADMIN_TOKEN_FILE)
        config.admin_token(box.settings)
        answer = await audio(box, run["run_id"])
        assert answer.status_code == 200 and answer.content == heard


def test_a_copy_is_private_and_named_by_its_hash_once_measured(tmp_path: Path) -> None:
    blobs = Blobs(tmp_path / "archive")
    blobs.prepare()
    source = tmp_path / "mix.wav"
    data = render(source, 4)
    identity, copy = copy_in(source, Keep(blobs.incoming, 1 << 40, 0))
    assert copy is not None and copy.read_bytes() == data and identity.kept
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert identity.sha256 == hashlib.sha256(data).hexdigest()
    assert (identity.size, identity.modified_ns) == (len(data), source.stat().st_mtime_ns)
    ready(copy, identity.sha256)
    assert blobs.commit(identity.sha256) and blobs.has(identity.sha256)
    assert blobs.path(identity.sha256).read_bytes() == data
    assert list(blobs.committed()) == [(identity.sha256, len(data))]
    assert blobs.commit(identity.sha256)  # again: already kept, nothing waiting
    assert blobs.remove(identity.sha256) == len(data) and not blobs.has(identity.sha256)
    stale = blobs.new_upload()
    stale.write_bytes(b"left by a review that never finished")
    assert blobs.sweep_incoming(now=time.time() + 7200) == 1 and not stale.exists()
    with pytest.raises(ValueError):
        blobs.path("../../etc/passwd")


# -- byte ranges --------------------------------------------------------------------------------


@given(size=st.integers(0, 10_000), first=st.integers(0, 12_000),
       length=st.integers(0, 12_000))
def test_a_byte_range_is_served_within_the_file(size: int, first: int, length: int) -> None:
    last = first + length
    span = byte_range(f"bytes={first}-{last}", size)
    if first >= size:
        assert span is None
    else:
        assert span == (first, min(last + 1, size))
    open_ended = byte_range(f"bytes={first}-", size)
    assert open_ended == (None if first >= size else (first, size))
    suffix = byte_range(f"bytes=-{length}", size)
    assert suffix == (None if length == 0 or size == 0 else (max(0, size - length), size))


@given(st.text(max_size=40))
def test_anything_else_is_not_one_range(header: str) -> None:
    try:
        span = byte_range(header, 1000)
    except ValueError:
        return
    assert span is None or 0 <= span[0] < span[1] <= 1000


def test_a_backwards_range_cannot_be_satisfied() -> None:
    assert byte_range("bytes=500-100", 1000) is None
    for header in ("bytes=0-1,5-6", "items=0-1", "bytes=-", "bytes=a-b"):
        with pytest.raises(ValueError):
            byte_range(header, 1000)


# -- the bounds ---------------------------------------------------------------------------------

kept_rows = st.lists(st.tuples(st.sampled_from(["Song", "Other", "Third"]),
                               st.integers(0, 5), st.integers(1, 50)),
                     max_size=30)


@given(kept_rows, st.lists(st.integers(0, 5), max_size=2), st.integers(0, 200),
       st.integers(1, 6))
def test_the_bounds_hold_dropping_the_oldest_and_a_latest_export_only_last(
        rows: list[tuple[str, int, int]], referenced: list[int], max_bytes: int,
        keep: int) -> None:
    live = [KeptAudio(run_id=f"r{i:02}", project=project, sha256=f"{audio:064x}",
                      size=audio * 10 + 1, file_name="x.wav", keeper="k", kept_at=float(at))
            for i, (project, audio, at) in enumerate(rows)]
    references = [ProjectReference(project=f"p{n}", name="ref.wav", sha256=f"{n:064x}",
                                   size=n * 10 + 1, keeper="k", measurements={},
                                   added_at=0.0) for n in referenced]
    drops = dict(budget.choose(live, references, budget.Bounds(max_bytes, keep)))
    order = {k.run_id: (k.kept_at, k.run_id) for k in live}
    latest = {max((k for k in live if k.project == p), key=lambda k: order[k.run_id]).run_id
              for p in {k.project for k in live}}
    left = [k for k in live if k.run_id not in drops]
    referenced = {r.sha256 for r in references}
    for project in {k.project for k in live}:
        assert len([k for k in left if k.project == project]) <= keep
    # every kept byte counts: over the size, only what a reference holds is left
    if budget.total_bytes(left, references) > max_bytes:
        assert all(k.sha256 in referenced for k in left)
    by_size = [run_id for run_id, why in drops.items() if why == budget.over_size(max_bytes)]
    for run_id in by_size:  # oldest first: nothing older that could go was kept instead
        could_go = [k for k in left if k.sha256 not in referenced
                    and (k.run_id in latest) == (run_id in latest)]
        assert all(order[k.run_id] > order[run_id] for k in could_go)
        if run_id in latest:  # a project's latest goes only once no older one is left
            assert all(k.run_id in latest or k.sha256 in referenced for k in left)


@pytest.mark.anyio
async def test_the_archive_stays_within_its_bounds_when_exports_exceed_them(
        tmp_path: Path) -> None:
    """Six renders of two songs, each 2 s (576 kB), into an archive of 1.75 MB (three
    of them) that keeps two exports a project: the oldest go, each project's latest
    stays, and what went says why, on the API's audio and the project page."""
    environ = {"AGENTBOX_AGENTS": "", "AGENTBOX_ARCHIVE_MAX_GB": "0.00175",
               "AGENTBOX_ARCHIVE_KEEP_PER_PROJECT": "2"}
    async with in_process(tmp_path, **environ) as box:
        archive, runs = box.app.state.apps["review"].archive, []
        for seed, song in enumerate(["A", "B", "A", "A", "B", "A"]):
            heard = render(tmp_path / f"{song}.wav", seed)
            runs.append((heard, await review(box, tmp_path / f"{song}.wav", song)))
            await archive.settled()
            files = [size for _, size in archive.blobs.committed()]
            assert sum(files) <= 1_750_000, (seed, files)
        played = []
        for heard, run in runs:
            answer = await audio(box, run["run_id"])
            played.append(answer.status_code)
            if answer.status_code == 200:
                assert answer.content == heard
            else:
                assert answer.json()["error_code"] == "audio_gone"
                assert "does not hold it any more" in answer.json()["message"]
        # A0 and A2: past two of A's; B1: the oldest when B4 made four files
        assert played == [404, 404, 404, 200, 200, 200]
        history = box.app.state.apps["review"].archive.history
        why = {k.run_id: k.dropped_because for song in "AB"
               for k in await history.kept_audio(song)}
        assert why[runs[0][1]["run_id"]] == budget.over_count(2)
        assert why[runs[1][1]["run_id"]] == budget.over_size(1_750_000)
        page = (await box.client.get("/projects/A")).text
        assert "within 0.00175 GB (0.00 GB now)" in page  # three files of 576 kB
        gone = (await box.client.get(f"/ui/runs/{runs[1][1]['run_id']}")).text
        assert 'id="audio-gone"' in gone and budget.over_size(1_750_000) in gone
        assert 'id="mix-audio"' not in gone
        kept = (await box.client.get(f"/ui/runs/{runs[5][1]['run_id']}")).text
        assert 'id="mix-audio"' in kept and 'id="audio-gone"' not in kept
        for seed in (0, 2, 3, 5):  # A's
            row = page[page.index('data-run-id="{}"'.format(runs[seed][1]["run_id"])):]
            assert ("no longer playable" in row[:row.index("</tr>")]) == (seed in (0, 2))


@pytest.mark.anyio
async def test_instances_sharing_a_database_each_bound_their_own_folder(
        tmp_path: Path) -> None:
    """Two archives (two machines' data directories) on one database: each keeps,
    bounds and deletes only what its own folder holds."""
    from agentbox.archive import Archive
    from agentbox.archive.history import SCHEMA, History
    from agentbox.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "shared.sqlite3")
    history = History(store.add_tables(SCHEMA))
    await store.open()
    try:
        archives = []
        for name in ("studio", "laptop"):
            settings = config.load_settings(environ={}, overrides={
                "data_dir": tmp_path / name, "archive_max_gb": 0.00012,
                "config_dir": tmp_path / "config"})
            archive = Archive(settings, history)
            await archive.open()
            archives.append(archive)
        studio, laptop = archives
        assert studio.keeper != laptop.keeper
        for n, archive in enumerate(archives):
            for seed in (1, 2):
                data = render(tmp_path / f"m{n}{seed}.wav", 10 * n + seed, seconds=0.2)
                sha = hashlib.sha256(data).hexdigest()
                (archive.blobs.incoming / sha).write_bytes(data)
                archive.keep(run_id=f"r{n}{seed}", project=f"p{seed}", sha256=sha,
                             size=len(data), file_name="m.wav")
            await archive.settled()
        for archive in archives:  # 120 kB each: two files, the four together over it
            assert len(list(archive.blobs.committed())) == 2
            assert len(await history.live_audio(archive.keeper)) == 2
        await studio.bound()
        assert len(list(laptop.blobs.committed())) == 2  # not the studio's to delete
    finally:
        await store.close()
