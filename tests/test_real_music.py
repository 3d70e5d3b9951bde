"""The review on real music: recordings nobody on the project made (released game
and free-culture soundtracks, General MIDI renders of real MIDI files), and
derivatives of them with one known defect each (tests/support/real_music.py).

Every row's expectation was written from independent measurement (ffmpeg's
ebur128 for loudness and true peak; numpy for the onset, the flat runs, the DC,
the low end's correlation), never from what the review said. The same table is
in the manual (agentbox/docs/review.md, "The real-music corpus"): a test keeps
the two equal. And no advice note may fire on more than a third of the untouched
tracks: a note that fires on most real music is miscalibrated, however right it
is on a test signal.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentbox.engine.agents import AgentContext
from agentbox.events import parse_event
from agentbox.review.agent import mix_review
from agentbox.review.analysis import Analysis
from agentbox.review.model import MixReview
from tests.conftest import ROOT, encode, make_event
from tests.support import real_music as rm

pytestmark = pytest.mark.slow

ANALYSIS = Analysis()
# The notes that advise a change (not the figures said for information, nor the
# format and level notes, which follow from the file's stage and format).
ADVICE = ("cut_start", "cut_tail", "muddy", "hollow", "dull", "dull_presence", "harsh",
          "bright", "honky", "scooped", "sub_rumble", "low_end_buildup", "thin_low_end",
          "low_end_wide", "clipping", "dc_offset", "no_headroom", "mono_drop")
MOST_TRACKS_A_NOTE_FITS = 1 / 3


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """The corpus, decoded and rendered once (or skipped, or failed under
    AGENTBOX_TEST_REQUIRE_MUSIC=1, when a package is missing)."""
    rm.need_corpus()
    yield rm.cache_folder()
    ANALYSIS.shutdown()


Make = Callable[[Path], Path]


def untouched(name: str) -> Make:
    return lambda folder: rm.source(name, folder)


def changed(name: str, of: str, change: rm.Change, subtype: str = "PCM_24") -> Make:
    return lambda folder: rm.derived(name, of, change, folder, subtype)


@dataclass(frozen=True)
class Row:
    file: str
    make: Make
    package: str
    stage: str  # the stage judged
    verdicts: tuple[str, ...]  # the acceptable verdicts
    first: str  # the first note's code
    never: tuple[str, ...]  # notes that must not appear
    why: str
    given: str = ""  # the event's stage ("" for none)
    genre: str = ""  # the event's genre ("" for none)

    @property
    def licence(self) -> str:
        return rm.LICENCES[self.package]


FB, SING, MSX = "frozen-bubble-data", "singularity-music", "openttd-openmsx"
TONAL = ("muddy", "dull", "dull_presence", "harsh", "sub_rumble", "low_end_buildup",
         "thin_low_end", "honky", "scooped", "bright", "hollow")
CUTS = ("cut_start", "cut_tail")
AMBIGUOUS = ("peaks near full scale, yet more open than a limited master (PLR over 14): a "
             "hot mix or a dynamic master; decoded to 24-bit with no tags, what a session "
             "exports: a mix")

CORPUS = [
    # -- released music, untouched ---------------------------------------------------------------
    Row("fb-intro.wav", untouched("fb-intro.wav"), FB, "mix", ("warn",), "no_headroom",
        (*CUTS, "clipping", "dc_offset"),
        "-15.2 LUFS, -0.1 dBTP, PLR 15: " + AMBIGUOUS + "; starts on an attack (first ms "
        "32 dB under the next 100 ms)"),
    Row("fb-main-1p.wav", untouched("fb-main-1p.wav"), FB, "mix", ("warn",), "no_headroom",
        (*CUTS, *TONAL, "clipping", "dc_offset"),
        "-15.8 LUFS, -0.4 dBTP, PLR 15: " + AMBIGUOUS),
    Row("fb-main-2p.wav", untouched("fb-main-2p.wav"), FB, "mix", ("warn",), "no_headroom",
        (*CUTS, "clipping", "dc_offset"),
        "-16.8 LUFS, -0.6 dBTP, PLR 16: " + AMBIGUOUS + "; its mean swings both ways (no "
        "held DC)"),
    Row("sing-chimes.wav", untouched("sing-chimes.wav"), SING, "mix", ("warn",), "dc_offset",
        (*CUTS, "clipping", "no_headroom"),
        "a DC offset held through it (right channel, about 2-6 % in every 2 s); a dark "
        "piece: extreme departures from the average curve"),
    Row("sing-march.wav", untouched("sing-march.wav"), SING, "mix", ("warn",), "dull",
        (*CUTS, "clipping", "low_end_wide", "no_headroom"),
        "a dark piece (16 kHz empty, 4 kHz 26 dB under the average curve); its DC offset, "
        "under 0.5 %, is not noted; -18.5 LUFS, -4.5 dBTP: a mix with headroom"),
    Row("sing-apex.wav", untouched("sing-apex.wav"), SING, "mix", ("warn",), "no_headroom",
        (*CUTS, *TONAL, "clipping"),
        "-17.4 LUFS, -0.8 dBTP, PLR 16.6: " + AMBIGUOUS + "; a DC offset of 4-10 %"),
    Row("sing-awakening.wav", untouched("sing-awakening.wav"), SING, "mix", ("warn",),
        "dc_offset", (*CUTS, "clipping", "low_end_wide"),
        "a DC offset held through it (left channel, 2-6 %); starts on an attack (first ms "
        "40 dB under)"),
    Row("sing-coherence.wav", untouched("sing-coherence.wav"), SING, "mix", ("warn",),
        "dc_offset", (*CUTS, *TONAL, "clipping", "no_headroom"),
        "a DC offset held through it (both channels, 1-4 %); within 5 dB of the average "
        "curve in every octave"),
    Row("sing-through-space.wav", untouched("sing-through-space.wav"), SING, "mix",
        ("pass",), "mix_loudness", (*CUTS, *TONAL, "clipping", "dc_offset", "no_headroom"),
        "-17.3 LUFS, -1.6 dBTP: a healthy mix; within 6 dB of the average curve"),
    Row("sing-nebula.wav", untouched("sing-nebula.wav"), SING, "mix", ("pass",),
        "mix_loudness", (*CUTS, *TONAL, "clipping", "dc_offset", "no_headroom"),
        "-19.5 LUFS, -1.3 dBTP, PLR 18: a healthy mix; within 5 dB of the average curve"),
    # -- General MIDI renders, untouched ----------------------------------------------------------
    Row("5432gone-redfarn.wav", untouched("5432gone-redfarn.wav"), MSX, "mix", ("warn",),
        "muddy", (*CUTS, "dc_offset", "low_end_wide"),
        "-24.4 LUFS, -11.5 dBTP; 500 Hz 11.7 dB over the average curve; starts on its first "
        "note (first ms silent)"),
    Row("coconut-run2.wav", untouched("coconut-run2.wav"), MSX, "mix", ("pass",),
        "mix_loudness", (*CUTS, *TONAL, "dc_offset", "low_end_wide"),
        "-32.6 LUFS, -16.2 dBTP (24-bit: quiet is fine for a mix); starts on its first note"),
    Row("train-filled-with-cash.wav", untouched("train-filled-with-cash.wav"), MSX, "mix",
        ("warn",), "thin_low_end", (*CUTS, "dc_offset", "low_end_wide"),
        "63-125 Hz 18 dB under the average curve: no bass part"),
    Row("ultimate-run.wav", untouched("ultimate-run.wav"), MSX, "mix", ("pass",),
        "mix_loudness", (*CUTS, "dc_offset", "low_end_wide"),
        "-26.5 LUFS, -11.4 dBTP; starts on its first note, its release tail rendered"),
    Row("chuggachugga.wav", untouched("chuggachugga.wav"), MSX, "mix", ("pass",),
        "mix_loudness", (*CUTS, *TONAL, "dc_offset", "low_end_wide"),
        "-23.1 LUFS, -6.4 dBTP; within 3 dB of the average curve; its mean swings both ways"),
    Row("ttsong-iii-imuh3.wav", untouched("ttsong-iii-imuh3.wav"), MSX, "mix", ("pass",),
        "mix_loudness", (*CUTS, *TONAL, "dc_offset", "low_end_wide"),
        "-20.3 LUFS, -5.2 dBTP; within 3.5 dB of the average curve"),
    Row("city-blues-redfarn.wav", untouched("city-blues-redfarn.wav"), MSX, "mix", ("pass",),
        "mix_loudness", (*CUTS, "dc_offset", "low_end_wide"),
        "-25.1 LUFS, -5.6 dBTP, PLR 19.5: an open render"),
    # -- a genre given ------------------------------------------------------------------------
    Row("sing-chimes.wav", untouched("sing-chimes.wav"), SING, "mix", ("warn",), "dc_offset",
        ("low_end_wide", *CUTS), "told orchestral: its wide low end (correlation +0.13 under "
        "120 Hz) is a hall's, not a fault", genre="orchestral"),
    # -- derivatives with a known defect ------------------------------------------------------
    Row("fb-main-1p-clipped.wav", changed("fb-main-1p-clipped.wav", "fb-main-1p.wav",
                                          rm.clipped_by(9.0)), FB, "master", ("fail",),
        "clipping", (), "pushed 9 dB into full scale: 8171 flat runs, up to 210 samples; "
        "-7.2 LUFS, PLR 7.7: it looks limited, a master"),
    Row("fb-intro-from-mp3.wav",
        lambda folder: rm.decoded_from_mp3("fb-intro-from-mp3.wav", "fb-intro.wav", folder,
                                           1.0),
        FB, "master", ("fail",), "true_peak_over", (*CUTS, "clipping"),
        "raised 1 dB, through MP3, back to 16-bit: a release's copy, a master; its few short "
        "flat runs are a lossy decode's overs, the ceiling's evidence, not audible clipping"),
    Row("city-blues-cut.wav", changed("city-blues-cut.wav", "city-blues-redfarn.wav",
                                      rm.cut_mid_phrase(20.0, 50.0)), MSX, "mix", ("fail",),
        "cut_tail", (), "only 20-50 s of the render: it begins and stops mid-phrase"),
    Row("sing-nebula-cut.wav", changed("sing-nebula-cut.wav", "sing-nebula.wav",
                                       rm.cut_mid_phrase(20.0, 50.0)), SING, "mix", ("fail",),
        "cut_tail", (), "only 20-50 s of the track: it begins and stops mid-phrase"),
    Row("chuggachugga-phase.wav", changed("chuggachugga-phase.wav", "chuggachugga.wav",
                                          rm.polarity_flipped), MSX, "mix", ("fail",),
        "out_of_phase", (), "the right channel's polarity flipped"),
    Row("ttsong-16-bit.wav", changed("ttsong-16-bit.wav", "ttsong-iii-imuh3.wav",
                                     rm.unchanged, "PCM_16"), MSX, "master", ("warn",),
        "too_quiet", (*CUTS, *TONAL, "mix_bit_depth"),
        "the render as 16-bit, with dither in its quiet stretches: a release's format, a "
        "master; 6.3 LU quiet with 4.2 dB of peak room: a warning"),
    Row("fb-main-2p.mp3", lambda folder: rm.as_mp3("fb-main-2p.mp3", "fb-main-2p.wav", folder),
        FB, "master", ("fail",), "true_peak_over", (*CUTS,),
        "a 192 kbit/s MP3 of the track: a release's format, a master; its true peak over "
        "-1 dBTP"),
    Row("5432gone-master.wav", changed("5432gone-master.wav", "5432gone-redfarn.wav",
                                       rm.gained(6.4)), MSX, "master", ("warn",), "too_quiet",
        ("true_peak_over",), "sent as a master: 4.0 LU under streaming's -14 with 4.1 dB of "
        "peak room: Spotify raises it all the way, a warning (YouTube does not)",
        given="master"),
]


def review(row: Row, folder: Path) -> MixReview:
    path = row.make(folder)
    payload: dict[str, Any] = {"project_id": f"{row.file}:{row.genre}", "mix_url": str(path)}
    if row.given:
        payload["stage"] = row.given
    if row.genre:
        payload["genre"] = row.genre
    event = parse_event(encode(make_event(payload=payload)))
    ctx = AgentContext(run_id="run_real_music", attempt=1,
                       agent="agentbox.review.agent:mix_review",
                       log=logging.LoggerAdapter(logging.getLogger("test"), {}),
                       services={Analysis: ANALYSIS})
    return asyncio.run(mix_review(event, ctx))


def row_id(row: Row) -> str:
    return f"{row.file}+{row.genre}" if row.genre else row.file


@pytest.mark.parametrize("row", CORPUS, ids=[row_id(row) for row in CORPUS])
def test_the_real_music_corpus(row: Row, folder: Path) -> None:
    result = review(row, folder)
    codes = [n.code for n in result.notes]
    said = "\n".join([result.stage_reason, *(f"{n.severity} {n.code}: {n.text}"
                                             for n in result.notes)])
    assert (result.stage, codes[0]) == (row.stage, row.first), said
    assert result.verdict in row.verdicts, said
    assert not set(codes) & set(row.never), said


def test_no_advice_note_fires_on_most_real_tracks(folder: Path) -> None:
    """Over the untouched tracks, no advice note on more than a third of them."""
    tracks = [row for row in CORPUS if row.make.__qualname__.startswith("untouched")
              and not row.genre]
    fired = Counter(code for row in tracks
                    for code in {n.code for n in review(row, folder).notes} & set(ADVICE))
    assert len(tracks) == len(rm.SOURCES)
    too_often = {code: n for code, n in fired.items() if n > MOST_TRACKS_A_NOTE_FITS * len(tracks)}
    assert not too_often, (too_often, len(tracks))


def test_split_evidence_is_said_with_both_first_fixes(folder: Path) -> None:
    """A 24-bit file with no tags whose name says it is final: as much for a master as
    for a mix. Judged at the side it leans to, with a verdict that holds under both
    readings, the first fix under each, and the one click that settles it."""
    final = Row("fb-intro-final.wav", changed("fb-intro-final.wav", "fb-intro.wav",
                                              rm.unchanged), FB, "mix", ("warn",),
                "no_headroom", (), "")
    result = review(final, folder)
    reason = result.stage_reason
    assert reason.startswith("Judged as a mix, but the evidence is split: for a master, its "
                             "name says 'final'; for a mix, 24-bit"), reason
    assert "The first fix as a mix: " in reason and "; as a master: " in reason, reason
    assert "Judge it as a master or as a mix with one click" in reason, reason
    assert result.stage_source == "auto" and result.verdict != "fail", result.verdict
    # What the page asks with: the same first fixes, kept apart from the sentence.
    readings = result.stage_readings
    assert result.stage_split and readings is not None, result
    assert f"The first fix as a mix: {readings.mix}; as a master: {readings.master}." in reason


def test_clipping_is_named_by_its_evidence(folder: Path) -> None:
    """Flat runs a lossy decode leaves are named so, as the ceiling's evidence (its
    note first, no clipping note); a render pushed into full scale is audible
    clipping, its first fix."""
    decoded = review(CORPUS[-7], folder).notes
    pushed = review(CORPUS[-8], folder).notes[0]
    # the decode's runs are the ceiling's evidence: one note, true_peak_over first
    assert decoded[0].code == "true_peak_over" and "lossy file's overs" in decoded[0].text, \
        decoded[0]
    assert "clipping" not in {n.code for n in decoded}, decoded
    assert pushed.severity == "fix" and "audible clipping" in pushed.text, pushed
    assert "the longest" in pushed.text, pushed


def test_a_start_is_cut_only_when_it_sounds_from_the_first_sample(folder: Path) -> None:
    """A track cut at 20 s sounds from its first sample (its first millisecond as loud
    as the next 100 ms): cut. Renders that start on their first note rise from
    silence: not cut (their rows say cut_start must not appear)."""
    cut = review(next(r for r in CORPUS if r.file == "sing-nebula-cut.wav"), folder)
    assert "cut_start" in [n.code for n in cut.notes], [n.code for n in cut.notes]
    assert cut.metrics.start_onset_db is not None and cut.metrics.start_onset_db > -10


def test_the_genre_names_what_the_track_has(folder: Path) -> None:
    told = review(next(r for r in CORPUS if r.genre == "orchestral"), folder)
    words = " ".join(n.text for n in told.notes)
    assert "guitars" not in words, words
    assert told.metrics.tonal_reference == "the reference curve for orchestral music"


@pytest.mark.parametrize("row", [row for row in CORPUS if row.file.endswith(".wav")
                                 and row.make.__qualname__.startswith("untouched")
                                 and not row.genre][::4], ids=row_id)
def test_the_readings_agree_with_ffmpeg(row: Row, folder: Path) -> None:
    """The yardstick: libebur128's algorithm in ffmpeg, on the same file."""
    result = review(row, folder)
    ffmpeg = rm.ffmpeg_reading(row.make(folder))
    m = result.metrics
    assert m.integrated_lufs == pytest.approx(ffmpeg.integrated_lufs, abs=0.1)
    assert m.true_peak_dbtp == pytest.approx(ffmpeg.true_peak_dbtp, abs=0.1)
    assert m.loudness_range_lu == pytest.approx(ffmpeg.loudness_range_lu, abs=0.2)


def test_a_missing_package_skips_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rm.PACKAGES, "no-such-soundtrack", Path("/nonexistent/track.ogg"))
    monkeypatch.delenv(rm.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-soundtrack"):
        rm.need_corpus()
    monkeypatch.setenv(rm.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no-such-soundtrack"):
        rm.need_corpus()


# -- the table in the manual ----------------------------------------------------------------------


def manual_rows() -> list[list[str]]:
    text = (ROOT / "agentbox" / "docs" / "review.md").read_text(encoding="utf-8")
    table = text[text.index("| file | source package |"):].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.splitlines()[2:]]


def table_row(row: Row) -> list[str]:
    said = ", ".join(x for x in (f"stage {row.given}" if row.given else "",
                                 f"genre {row.genre}" if row.genre else "") if x)
    return [f"`{row.file}`", f"{row.package} ({row.licence})", said or "—", row.stage,
            " or ".join(row.verdicts), f"`{row.first}`", row.why]


def test_the_manual_shows_the_real_corpus_as_the_tests_have_it() -> None:
    assert manual_rows() == [table_row(row) for row in CORPUS]
    assert not any("|" in cell for row in CORPUS for cell in table_row(row))


def markdown_table() -> str:
    """The table for the manual (print it with: python -c 'from
    tests.test_real_music import markdown_table; print(markdown_table())')."""
    head = ("| file | source package | said | stage judged | verdict | first note | why |\n"
            "|---|---|---|---|---|---|---|\n")
    return head + "\n".join("| " + " | ".join(table_row(row)) + " |" for row in CORPUS)
