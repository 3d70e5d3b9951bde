"""The archive's budget holds: every kept byte counts (each project's latest export
and the reference tracks too), a file bigger than the archive is never copied
(a sparse one is judged by what its copy would take), what cannot be kept is said
on the review, and on a small disk filled for real (lazyfs with a capacity,
tests/support/lazyfs.py) uploads and copies stop at the free-space margin with 507
`insufficient_storage`, never a 500, while events and /healthz go on.

The real app in process with the real mix review (its analysis processes), over
httpx's ASGI transport.
"""

from __future__ import annotations

import html
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import soundfile

from agentbox.archive import budget
from agentbox.archive.blobs import too_big, too_full
from tests.conftest import ADMIN_TOKEN, InProcess, in_process, make_event
from tests.support.powercut import Disk, skip_or_fail_without_fuse
from tests.test_archive import audio, render, review

TOKEN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
RATE = 48_000
SPARSE_BLOCK = 1 << 16


async def put_reference(box: InProcess, project: str, body: bytes | AsyncIterator[bytes],
                        name: str = "ref.wav") -> Any:
    return await box.client.put(f"/projects/{quote(project, safe='')}/reference",
                                params={"name": name}, content=body, headers=TOKEN)


async def gone_on_page(box: InProcess, run_id: str) -> str:
    page = (await box.client.get(f"/ui/runs/{run_id}")).text
    assert 'id="audio-gone"' in page, page
    start = page.index('id="audio-gone"')
    return html.unescape(page[start:page.index("</p>", start)])


def sparse_wav(path: Path, seconds: float) -> int:
    """A 24-bit stereo WAV of `seconds`, a short burst of noise and then digital
    silence, written with holes where the silence is (a sparse file); its size."""
    rng = np.random.default_rng(7)
    audio = np.zeros((int(RATE * seconds), 2))
    audio[:RATE] = 0.3 * np.tanh(rng.standard_normal((RATE, 2)))
    dense = path.with_name("dense.wav")
    soundfile.write(dense, audio, RATE, subtype="PCM_24")
    with open(dense, "rb") as source, open(path, "wb") as out:
        while block := source.read(SPARSE_BLOCK):
            if block.count(0) == len(block):
                out.seek(len(block), os.SEEK_CUR)  # a hole, not written blocks
            else:
                out.write(block)
        out.truncate()
    dense.unlink()
    settled = path.stat().st_mtime - 60
    os.utime(path, (settled, settled))
    return path.stat().st_size


@pytest.mark.anyio
async def test_every_projects_latest_export_and_the_references_count(tmp_path: Path) -> None:
    """An archive of 1.75 MB (three renders): a reference and four projects' single
    exports. The total never passes the size; the oldest project's latest export goes,
    saying why on its review, and the reference stays."""
    environ = {"AGENTBOX_AGENTS": "", "AGENTBOX_ARCHIVE_MAX_GB": "0.00175"}
    async with in_process(tmp_path, **environ) as box:
        archive = box.app.state.apps["review"].archive
        reference = render(tmp_path / "ref.wav", 99)
        assert (await put_reference(box, "Song 0", reference)).status_code == 201
        runs = []
        for n in range(4):
            render(tmp_path / f"s{n}.wav", n)
            runs.append(await review(box, tmp_path / f"s{n}.wav", f"Song {n}"))
            await archive.settled()
            used, bound = await archive.usage()
            files = sum(size for _, size in archive.blobs.committed())
            assert used == files <= bound == 1_750_000, (n, used, files)
        played = [(await audio(box, run["run_id"])).status_code for run in runs]
        assert played == [404, 404, 200, 200]  # each the only export of its project
        assert budget.over_size(1_750_000) in await gone_on_page(box, runs[0]["run_id"])
        assert (await box.client.get("/projects/Song%200/reference/audio")).status_code == 200


@pytest.mark.skipif(sys.platform == "win32", reason="holes and st_blocks: POSIX")
@pytest.mark.anyio
async def test_a_sparse_file_bigger_than_the_archive_is_not_copied_and_says_so(
        tmp_path: Path) -> None:
    """A 12 s WAV that is mostly holes takes little disk, but its copy would take all
    3.5 MB: over an archive of 1 MB, it is only hashed, and its review says why."""
    mix = tmp_path / "sparse.wav"
    size = sparse_wav(mix, 12.0)
    assert mix.stat().st_blocks * 512 < size / 2  # the file system made holes
    environ = {"AGENTBOX_AGENTS": "", "AGENTBOX_ARCHIVE_MAX_GB": "0.001"}
    async with in_process(tmp_path, **environ) as box:
        archive = box.app.state.apps["review"].archive
        run = await review(box, mix)
        await archive.settled()
        assert list(archive.blobs.committed()) == []
        assert list(archive.blobs.incoming.iterdir()) == []
        assert too_big(1_000_000) in await gone_on_page(box, run["run_id"])
        answer = await audio(box, run["run_id"])
        assert (answer.status_code, answer.json()["error_code"]) == (404, "audio_gone")


@pytest.mark.anyio
async def test_a_reference_the_archive_cannot_hold_is_refused_with_507(tmp_path: Path) -> None:
    """References are never let go, so two that together pass the archive's size are
    refused (507 insufficient_storage), before the body is read, naming the setting."""
    async with in_process(tmp_path, AGENTBOX_AGENTS="",
                          AGENTBOX_ARCHIVE_MAX_GB="0.001") as box:
        first = render(tmp_path / "a.wav", 1, seconds=1.5)  # 432 kB
        assert (await put_reference(box, "A", first)).status_code == 201
        refused = await put_reference(box, "B", render(tmp_path / "b.wav", 2, seconds=2.0))
        assert refused.status_code == 507, refused.text
        assert refused.json()["error_code"] == "insufficient_storage"
        assert "AGENTBOX_ARCHIVE_MAX_GB" in refused.json()["message"]
        # the project's own reference is replaced, not added to
        again = await put_reference(box, "A", render(tmp_path / "c.wav", 3, seconds=2.0))
        assert again.status_code == 201, again.text


# -- a small disk, filled for real -----------------------------------------------------------


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    skip_or_fail_without_fuse()
    disk = Disk(tmp_path / "disk", tmp_path / "data", tmp_path / "lazyfs.log")
    disk.mount()
    yield disk
    disk.unmount()


async def chunks(data: bytes, size: int = 1 << 18) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_nearly_full_disk_refuses_uploads_and_copies_with_507_never_500(
        tmp_path: Path, disk: Disk) -> None:
    """The data directory on a disk with 1.5 MB left and a margin of 1 MB: a
    reference declared bigger than the room, and one streamed without a length, are
    refused with 507 and leave nothing behind; a review still runs, but its mix is
    not copied (said on the review); events are taken and /healthz stays healthy."""
    environ = {"AGENTBOX_AGENTS": "", "AGENTBOX_DATA_DIR": str(disk.mount_point),
               "AGENTBOX_MIN_FREE_MB": "1"}
    async with in_process(tmp_path, **environ) as box:
        archive = box.app.state.apps["review"].archive
        reference = render(tmp_path / "ref.wav", 5, seconds=3.0)  # 864 kB
        mix = tmp_path / "mix.wav"
        render(mix, 6)
        disk.room(1_500_000)
        declared = await put_reference(box, "Song", reference)
        assert (declared.status_code, declared.json()["error_code"]) == (
            507, "insufficient_storage"), declared.text
        assert "AGENTBOX_MIN_FREE_MB" in declared.json()["message"]
        streamed = await put_reference(box, "Song", chunks(reference))
        assert (streamed.status_code, streamed.json()["error_code"]) == (
            507, "insufficient_storage"), streamed.text
        assert list(archive.blobs.incoming.iterdir()) == []
        run = await review(box, mix)
        await archive.settled()
        assert list(archive.blobs.committed()) == []
        assert too_full(1_000_000) in await gone_on_page(box, run["run_id"])
        health = await box.client.get("/healthz")
        assert health.status_code == 200, health.text
        answer = await box.post(make_event(payload={"project_id": "Other",
                                                    "mix_url": str(mix)}))
        assert answer.status_code == 202, answer.text
        disk.room(None)  # room again: the same upload is kept
        kept = await put_reference(box, "Song", reference)
        assert kept.status_code == 201, kept.text
