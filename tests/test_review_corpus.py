"""The review's corpus: for every file, the stage the review judges it at (given on
the event, or worked out from the file), its verdict and its first note, with the
reason. The same table is in the manual (agentbox/docs/review.md, "The corpus"):
a test keeps the two equal.

The files are made here (tests/support/corpus.py): healthy mixes at several
loudnesses and crest factors, mixes with one defect each, and masters for every
delivery target, right, too loud and too quiet. Each is reviewed by the real agent,
its analysis in a real analysis process.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentbox.engine.agents import AgentContext
from agentbox.events import parse_event
from agentbox.review.agent import mix_review
from agentbox.review.analysis import Analysis
from agentbox.review.model import MixReview
from agentbox.review.profiles import (
    AS_IS,
    CLUB_CURVE,
    DELIVER,
    DOWN_ONLY,
    PROFILES,
    SPEECH_CURVE,
    TARGETS,
    UP_TO_PEAK,
)
from tests.conftest import ROOT, encode, make_event
from tests.support.corpus import RATE, Song, limited, mp3, song_audio, write

ANALYSIS = Analysis()  # one analysis process for the corpus, as a server has


@pytest.fixture(scope="module", autouse=True)
def analysis_processes() -> Iterator[None]:
    yield
    ANALYSIS.shutdown()


# -- the songs ------------------------------------------------------------------------------------

QUIET = Song(lufs=-23.0, transients_db=10.0, sections_db=10.0)  # a quiet, dynamic mix
BASE = Song(lufs=-20.0)  # a healthy mix, peaks about 3.5 dB under full scale
DENSE = Song(lufs=-16.5, transients_db=2.0, sections_db=2.0)  # dense, still unlimited
MASTER = Song(lufs=-14.0, sections_db=3.0, seed=2)  # what the masters are made from
SPEECH = Song(curve=SPEECH_CURVE, lufs=-14.0, sections_db=3.0, seed=3)
CLUB = Song(curve=CLUB_CURVE, lufs=-10.0, sections_db=2.0, seed=4)

Make = Callable[[Path], Path]


def mix(song: Song, subtype: str = "PCM_24") -> Make:
    return lambda path: write(path, song_audio(song), subtype)


def changed(song: Song, change: Callable[[np.ndarray], np.ndarray],
            subtype: str = "PCM_24") -> Make:
    return lambda path: write(path, change(song_audio(song).copy()), subtype)


def clipped(audio: np.ndarray) -> np.ndarray:
    """A second pushed 9 dB, into full scale: the render clips there."""
    loud = slice(int(5.0 * RATE), int(6.0 * RATE))
    audio[loud] = np.clip(audio[loud] * 2.8, -1.0, 1.0)
    return audio


def phase_flipped(audio: np.ndarray) -> np.ndarray:
    audio[:, 1] *= -1
    return audio


def summed(audio: np.ndarray) -> np.ndarray:
    both = audio.mean(axis=1)
    return np.stack([both, both], axis=1)


def cut(audio: np.ndarray) -> np.ndarray:
    """The render stops at 8 s, in the middle of a section."""
    return audio[:int(8.0 * RATE)]


def master(song: Song, lufs: float, ceiling: float) -> Make:
    return lambda path: write(path, limited(song_audio(song), lufs, ceiling))


# -- the table -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    file: str
    make: Make
    given: str  # the event's stage, "" for none (auto)
    profile: str  # the event's profile, "" for the default (streaming)
    stage: str  # the stage judged
    verdict: str
    first: str  # the first note's code
    why: str


# Why a loud master is, or is not, to be fixed: a platform that turns it down plays it
# as loud as the rest (the loudness only cost it punch); a specification refuses it.
LOUD_WHY = {UP_TO_PEAK: ": turned down, it only costs punch",
            DOWN_ONLY: ": turned down, it only costs punch",
            AS_IS: ": louder than club masters, not wrong",
            DELIVER: ": out of the specification"}


def targets_rows() -> list[Row]:
    """A master for every delivery target: right, too loud, too quiet (by more than
    three tolerances: a note to fix, except loud where the platform turns it down)."""
    rows = []
    song_of = {"podcast": SPEECH, "club": CLUB}
    for t in TARGETS:
        profile = next(p for p in PROFILES.values() if p.target == t.name and p.name != "streaming")
        song = song_of.get(t.name, MASTER)
        over = 3 * t.tolerance_lu + 1.5
        loud = t.integrated_lufs + (over if t.name != "club" else 3.0)
        rows += [
            Row(f"{t.name}-master.wav", master(song, t.integrated_lufs, t.true_peak_max_dbtp),
                "master", profile.name, "master", "pass", "on_target",
                f"{t.integrated_lufs:g} LUFS under {t.true_peak_max_dbtp:g} dBTP: on target"),
            Row(f"{t.name}-master-loud.wav", master(song, loud, t.true_peak_max_dbtp),
                "master", profile.name, "master", "fail" if t.normalisation == DELIVER else
                "warn", "too_loud", f"{loud - t.integrated_lufs:.1f} LU over the target"
                + LOUD_WHY[t.normalisation]),
            Row(f"{t.name}-master-quiet.wav",
                master(song, t.integrated_lufs - over, t.true_peak_max_dbtp),
                "master", profile.name, "master", QUIET_VERDICT.get(t.name, "fail"),
                "too_quiet", f"{over:.1f} LU under the target" + QUIET_WHY.get(t.name, "")),
        ]
    return rows


# A quiet master with 1 dB or more of peak room where a platform plays it is a warning:
# at -20.4 LUFS this song's limiter never reaches Apple Music's ceiling.
QUIET_VERDICT = {"apple_music": "warn"}
QUIET_WHY = {"apple_music": ", with 2.6 dB of peak room: the platforms only play it "
             "quieter, a warning"}

CORPUS = [
    Row("quiet-mix.wav", mix(QUIET), "", "", "mix", "pass", "mix_loudness",
        "-23 LUFS, peaks -2.8 dBTP, PLR 20 dB: a healthy mix on its way to mastering"),
    Row("mix.wav", mix(BASE), "", "", "mix", "pass", "mix_loudness",
        "-20 LUFS, PLR 16 dB, peaks 3.5 dB under full scale"),
    Row("dense-mix.wav", mix(DENSE), "", "", "mix", "pass", "mix_loudness",
        "-16.5 LUFS, PLR 12 dB: dense but not limited"),
    Row("clipped-mix.wav", changed(BASE, clipped, "FLOAT"), "", "", "mix", "fail", "clipping",
        "a second pushed 9 dB into full scale: clipping in the render"),
    Row("limited-mix.wav", lambda path: write(path, limited(song_audio(BASE), -11.0, -4.0)),
        "", "", "mix", "fail", "squashed",
        "a limiter holding -4 dBTP at -11 LUFS: PLR 7 dB, squashed"),
    Row("limited-loud-mix.wav",
        lambda path: write(path, limited(song_audio(BASE), -9.0, -0.5)), "mix", "", "mix",
        "fail", "squashed", "limited like a master, but sent as a mix: squashed"),
    Row("limited-loud.wav", lambda path: write(path, limited(song_audio(BASE), -9.0, -0.5)),
        "", "", "master", "warn", "too_loud",
        "limited close to -1 dBTP at -9 LUFS: looks mastered, 5 LU over streaming's -14 "
        "(turned down, it only costs punch)"),
    Row("dc-mix.wav", changed(BASE, lambda a: a + 0.01), "", "", "mix", "warn", "dc_offset",
        "a DC offset of 1 % (offsets are noted from 0.5 %)"),
    Row("phase-mix.wav", changed(BASE, phase_flipped), "", "", "mix", "fail", "out_of_phase",
        "one channel's polarity inverted"),
    Row("dual-mono-mix.wav", changed(BASE, summed), "", "", "mix", "warn", "dual_mono",
        "both channels the same: summed to mono"),
    Row("mono-mix.wav", lambda path: write(path, song_audio(BASE).mean(axis=1)), "", "",
        "mix", "pass", "mix_loudness", "a one-channel file: fine"),
    Row("mix.mp3", lambda path: mp3(path, song_audio(BASE)), "", "", "mix", "warn", "lossy",
        "a lossy file named a mix, with a mix's headroom: split evidence, judged a mix under "
        "both readings; export the mix again, lossless, at the session's resolution"),
    Row("16-bit-mix.wav", mix(BASE, "PCM_16"), "", "", "mix", "warn", "mix_bit_depth",
        "16-bit: under the session's resolution"),
    Row("cut-mix.wav", changed(BASE, cut), "", "", "mix", "fail", "cut_tail",
        "the render stops in the middle of a section"),
    Row("harsh-mix.wav", mix(Song(lufs=-20.0, boost=((2000.0, 12.0), (4000.0, 12.0)))), "", "",
        "mix", "warn", "harsh",
        "12 dB too much at 2-4 kHz (no genre given: only an extreme excess is noted)"),
    Row("boomy-mix.wav", mix(Song(lufs=-20.0, boost=((63.0, 12.0), (125.0, 12.0)))), "", "",
        "mix", "warn", "low_end_buildup",
        "12 dB too much at 63-125 Hz (no genre given: only an extreme excess is noted)"),
    Row("streaming-master.wav", master(MASTER, -14.0, -0.5), "", "", "master", "pass",
        "on_target", "-14 LUFS limited under -1 dBTP: looks mastered, on target"),
    Row("over-master.wav", master(MASTER, -14.0, 0.9), "master", "", "master", "fail",
        "true_peak_over", "limited to -0.1 dBFS without true-peak mode: over the ceiling"),
    *targets_rows(),
]


def review(row: Row, folder: Path) -> MixReview:
    path = row.make(folder / row.file)
    payload: dict[str, Any] = {"project_id": row.file, "mix_url": str(path)}
    if row.given:
        payload["stage"] = row.given
    if row.profile:
        payload["profile"] = row.profile
    event = parse_event(encode(make_event(payload=payload)))
    ctx = AgentContext(run_id="run_corpus", attempt=1, agent="agentbox.review.agent:mix_review",
                       log=logging.LoggerAdapter(logging.getLogger("test"), {}),
                       services={Analysis: ANALYSIS})
    return asyncio.run(mix_review(event, ctx))


@pytest.mark.parametrize("row", CORPUS, ids=[row.file for row in CORPUS])
def test_the_corpus(row: Row, tmp_path: Path) -> None:
    result = review(row, tmp_path)
    notes = [f"{n.severity} {n.code}: {n.text}" for n in result.notes]
    assert (result.stage, result.verdict, result.notes[0].code) == (
        row.stage, row.verdict, row.first), "\n".join([result.stage_reason, *notes])
    assert result.stage_reason.startswith("Judged as a mix" if row.stage == "mix"
                                          else "Judged as a master")
    assert result.stage_source == ("event" if row.given else "auto")


def test_a_lossy_mix_is_told_how_to_export_and_still_measured(tmp_path: Path) -> None:
    """The MP3 of a healthy mix, named a mix: lossy as a release is, named and peaking as
    a mix is, so the evidence is split and the verdict holds under both readings (a
    warning, not a fail); its first note says what to export; the rest of the review
    is the mix's own, as for the WAV."""
    wav, mp3 = (review(next(row for row in CORPUS if row.file == name), tmp_path)
                for name in ("mix.wav", "mix.mp3"))
    first = mp3.notes[0]
    assert (mp3.verdict, first.severity, first.code) == ("warn", "consider", "lossy")
    assert "the evidence is split" in mp3.stage_reason, mp3.stage_reason
    assert first.text.startswith("Export the mix again as WAV, AIFF or FLAC, at the "
                                 "session's sample rate and 24-bit or 32-bit float"), first.text
    assert [n.code for n in mp3.notes[1:]] == [n.code for n in wav.notes]
    assert mp3.metrics.integrated_lufs == pytest.approx(wav.metrics.integrated_lufs, abs=0.5)
    assert mp3.metrics.true_peak_dbtp == pytest.approx(wav.metrics.true_peak_dbtp, abs=1.0)
    assert [t.note.split(":")[0] for t in mp3.targets] == [
        t.note.split(":")[0] for t in wav.targets]  # what mastering for each would take


# -- the table in the manual ----------------------------------------------------------------------


def manual_rows() -> list[list[str]]:
    text = (ROOT / "agentbox" / "docs" / "review.md").read_text(encoding="utf-8")
    table = text[text.index("| file | stage given |"):].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.splitlines()[2:]]


def table_row(row: Row) -> list[str]:
    return [f"`{row.file}`", row.given or "—", row.profile or "—", row.stage, row.verdict,
            f"`{row.first}`", row.why]


def test_the_manual_shows_the_corpus_as_the_tests_have_it() -> None:
    assert manual_rows() == [table_row(row) for row in CORPUS]


def markdown_table() -> str:
    """The table for the manual (print it with: python -c 'from
    tests.test_review_corpus import markdown_table; print(markdown_table())')."""
    head = ("| file | stage given | profile | stage judged | verdict | first note | why |\n"
            "|---|---|---|---|---|---|---|\n")
    return head + "\n".join("| " + " | ".join(table_row(row)) + " |" for row in CORPUS)


def test_the_table_cells_hold_no_pipe() -> None:
    assert not any(re.search(r"\|", cell) for row in CORPUS for cell in table_row(row))
