"""The archive of exports' records (schema version 7): the audio kept of each
reviewed export, dropped with a reason, and each project's reference track (every
engine)."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

from agentbox.archive.records import KeptAudio, ProjectReference
from agentbox.store import Store
from tests.store.support import T0, async_test, history

HASH_A, HASH_B, HASH_C = ("a" * 64, "b" * 64, "c" * 64)
SONG = unicodedata.normalize("NFC", "Über Nacht")


def kept(run_id: str, project: str, sha256: str, at: float, keeper: str = "here"
         ) -> KeptAudio:
    return KeptAudio(run_id=run_id, project=project, sha256=sha256, size=1000,
                     file_name=f"{run_id}.wav", keeper=keeper, kept_at=at)


def reference(project: str, sha256: str, name: str = "ref.wav") -> ProjectReference:
    return ProjectReference(project=project, name=name, sha256=sha256, size=2000,
                            keeper="here", added_at=T0,
                            measurements={"integrated_lufs": -9.1, "octave_bands": [
                                {"hz": 1000.0, "db": -8.0}]})


@async_test
async def test_kept_audio_is_listed_by_project_and_dropped_with_a_reason(
        store: Store, aio: Any) -> None:
    await history(store).keep_audio(kept("r1", SONG, HASH_A, T0))
    await history(store).keep_audio(kept("r2", SONG, HASH_B, T0 + 1))
    await history(store).keep_audio(kept("r3", "Other", HASH_A, T0 + 2))
    await history(store).keep_audio(kept("r4", SONG, HASH_C, T0 + 3, keeper="elsewhere"))
    decomposed = unicodedata.normalize("NFD", SONG)
    assert [k.run_id for k in await history(store).kept_audio(decomposed)] == ["r4", "r2", "r1"]
    assert [k.run_id for k in await history(store).live_audio("here")] == ["r1", "r2", "r3"]
    assert [k.run_id for k in await history(store).live_audio("elsewhere")] == ["r4"]

    drops = [("r1", "the archive's size"), ("nope", "x")]
    assert await history(store).drop_audio(drops, T0 + 9) == 1
    assert await history(store).drop_audio([("r1", "again")], T0 + 10) == 0  # once
    first = (await history(store).kept_audio(SONG))[-1]
    assert (first.run_id, first.dropped_at, first.dropped_because) == (
        "r1", T0 + 9, "the archive's size")
    assert [k.run_id for k in await history(store).live_audio("here")] == ["r2", "r3"]

    # a replayed run's new review replaces its row and is live again
    await history(store).keep_audio(kept("r1", SONG, HASH_C, T0 + 20))
    again = (await history(store).kept_audio(SONG))[0]
    assert (again.run_id, again.sha256, again.dropped_at, again.kept_at) == (
        "r1", HASH_C, None, T0 + 20)
    assert await history(store).kept_audio("nobody") == []
    assert await history(store).kept_audio("nul\x00") == []


@async_test
async def test_a_project_has_one_reference_track_at_a_time(store: Store, aio: Any) -> None:
    assert await history(store).reference(SONG) is None
    assert await history(store).set_reference(reference(SONG, HASH_A, "first.wav")) is None
    found = await history(store).reference(unicodedata.normalize("NFD", SONG))
    assert found == reference(SONG, HASH_A, "first.wav")
    assert found is not None and found.measurements["octave_bands"][0]["db"] == -8.0
    replaced = await history(store).set_reference(reference(SONG, HASH_B, "second.wav"))
    assert replaced == reference(SONG, HASH_A, "first.wav")
    await history(store).set_reference(reference("Another", HASH_A))
    assert [(r.project, r.name) for r in await history(store).references()] == [
        ("Another", "ref.wav"), (SONG, "second.wav")]
    assert await history(store).remove_reference(SONG) == reference(SONG, HASH_B, "second.wav")
    assert await history(store).remove_reference(SONG) is None
    assert await history(store).reference(SONG) is None
    assert await history(store).remove_reference("nul\x00") is None


def test_the_archive_survives_a_restart(make_store: Callable[[], Store], aio: Any) -> None:
    store = make_store()
    aio(history(store).keep_audio(kept("r1", SONG, HASH_A, T0)))
    aio(history(store).set_reference(reference(SONG, HASH_B)))
    aio(store.close())
    again = make_store()
    assert [k.sha256 for k in aio(history(again).kept_audio(SONG))] == [HASH_A]
    assert aio(history(again).reference(SONG)) == reference(SONG, HASH_B)
