"""The stage of the work: where it comes from (the event, the project, the watch
folder, the configuration, the file), the sentence that says so, and a request
refused at once when its profile, stage or file cannot be; then the delivery
targets' advice, right for every target, quiet and loud files alike."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox.archive.records import ProjectExport
from agentbox.config import Settings
from agentbox.engine.agents import AgentContext
from agentbox.events import InvalidEvent, parse_event
from agentbox.review import present, stage
from agentbox.review.agent import mix_review
from agentbox.review.analysis import Analysis
from agentbox.review.delivery import as_played, shared_note, target_verdict
from agentbox.review.judge import judge, notes_for, verdict_for, with_profile
from agentbox.review.model import MixMetrics, MixReview, Note
from agentbox.review.profiles import (
    DELIVER,
    DOWN_ONLY,
    PROFILES,
    TARGETS,
    UP_TO_PEAK,
    Target,
)
from agentbox.review.settings import ReviewSettings
from tests.conftest import encode, in_process, make_event
from tests.support.corpus import RATE, Song, limited, song_audio, write
from tests.support.history import services_with

ANALYSIS = Analysis()


@pytest.fixture(scope="module", autouse=True)
def analysis_processes() -> Iterator[None]:
    yield
    ANALYSIS.shutdown()


# -- where the stage comes from --------------------------------------------------------------------

def heard(peak: float | None, loudness: float | None, plr: float | None,
          **more: Any) -> dict[str, Any]:
    """What the meter says of a 24-bit WAV at 48 kHz with no tags (`more` to change it)."""
    return {"true_peak_dbtp": peak, "integrated_lufs": loudness, "plr_db": plr,
            "bit_depth": 24, "sample_format": "PCM_24", "file_format": "WAV",
            "sample_rate": 48_000, "duration_seconds": 180.0, **more}


MASTERED = (heard(-1.2, -9.5, 8.3),)  # a limited master
UNMASTERED = (heard(-2.8, -23.0, 20.2),)  # the healthy mix a user found failed


def test_the_file_s_own_stage_wins_over_the_project_s_remembered_one() -> None:
    everything = stage.Given(event="mix", project="master", project_name="night drive",
                             watch="master", config="master")
    assert stage.choose(everything, *MASTERED).source == "event"
    assert stage.choose(stage.Given(rejudge="mix", rejudged="the 14:02 export", event="master",
                                    watch="master"), *MASTERED).source == "rejudge"
    remembered = stage.Given(project="mix", project_name="p", watch="master", config="master")
    assert (stage.choose(remembered, *MASTERED).source,
            stage.choose(remembered, *MASTERED).stage) == ("watch", "master")
    told_now = stage.Given(project="mix", project_name="p", project_now=True, watch="master")
    assert stage.choose(told_now, *MASTERED).source == "project"
    assert stage.choose(stage.Given(project="mix", project_name="p", config="master"),
                        *MASTERED).source == "project"
    assert stage.choose(stage.Given(watch="mix", config="master"), *MASTERED).source == "watch"
    assert stage.choose(stage.Given(config="master"), *UNMASTERED).stage == "master"
    chosen = stage.choose(stage.Given(config="auto"), *UNMASTERED)
    assert (chosen.stage, chosen.source) == ("mix", "auto")


def test_auto_calls_limited_loud_files_masters_and_the_rest_mixes() -> None:
    assert stage.inferred(*MASTERED).stage == "master"
    assert stage.inferred(*UNMASTERED).stage == "mix"
    assert stage.inferred(heard(-1.0, -14.0, 13.0)).stage == "master"  # Spotify's advice
    assert stage.inferred(heard(-4.0, -10.0, 6.0)).stage == "mix"  # limited well under 0 dB
    assert stage.inferred(heard(-1.0, -18.0, 17.0)).stage == "mix"  # near 0 dB, not loud
    assert stage.inferred(heard(None, None, None)).stage == "mix"  # silence


def test_the_file_s_evidence_is_weighed_and_named() -> None:
    """A release's marks (a lossy codec, tags, 16-bit with dither, a name that says
    final) make a master; a session's (24-bit, no tags, headroom, a name that says mix)
    a mix; the sentence names what it weighed."""
    ogg = heard(-3.9, -19.0, 15.1, bit_depth=None, sample_format="VORBIS",
                file_format="OGG", tags=["title", "artist", "album"])
    judged = stage.inferred(ogg, "battle.ogg")
    assert (judged.stage, judged.source, judged.split) == ("master", "auto", False)
    assert "a lossy OGG file" in judged.reason and "title, artist and album" in judged.reason
    dithered = stage.inferred(heard(-3.9, -19.0, 15.1, bit_depth=16, sample_format="PCM_16",
                                    dithered=True), "battle.wav")
    assert dithered.stage == "master" and "with dither" in dithered.reason, dithered.reason
    mix = stage.inferred(heard(-4.0, -20.0, 16.0), "song mix v3.wav")
    assert mix.stage == "mix" and "its name says 'mix'" in mix.reason, mix.reason
    final = stage.inferred(heard(-0.5, -17.0, 16.5), "song_final.wav")
    assert final.split and "the evidence is split" in final.reason, final.reason


def test_a_project_does_not_flip_without_evidence() -> None:
    """Weak evidence keeps the stage the project's last export was judged at, and says
    so; strong evidence turns it, and says that too."""
    before = stage.Before("mix", "the 14:02:37 export")
    weak = stage.inferred(heard(-1.0, -14.0, 13.0), "take 2.wav", before)  # loud, limited
    assert weak.stage == "mix" and "the 14:02:37 export of the project" in weak.reason
    ogg = heard(-1.0, -14.0, 13.0, bit_depth=None, file_format="OGG", tags=["title"])
    strong = stage.inferred(ogg, "take 2.ogg", before)
    assert strong.stage == "master" and "unlike the 14:02:37 export" in strong.reason


def test_one_inverted_channel_is_one_note() -> None:
    m = MixMetrics(**{**figures(-16.0, -1.5).model_dump(), "stereo_correlation": -0.95,
                      "mono_loudness_drop_lu": None, "low_end_correlation": -0.98})
    for at in ("mix", "master"):
        notes = notes_for(m, PROFILES["streaming"], stage=at)
        fixes = [n for n in notes if n.code in ("out_of_phase", "mono_cancels", "low_end_wide",
                                                "mono_drop")]
        assert [n.code for n in fixes] == ["out_of_phase"], [n.text for n in notes]
        assert "cancels out entirely" in fixes[0].text and "-0.98" in fixes[0].text


@pytest.mark.parametrize("given, judged", [
    (stage.Given(event="master"), "master"), (stage.Given(project="mix", project_name="p"),
                                              "mix"),
    (stage.Given(watch="mix"), "mix"), (stage.Given(config="master"), "master"),
    (stage.Given(rejudge="mix", rejudged="the 14:02 export"), "mix"),
    (stage.Given(), "master")])
def test_the_reason_says_which_stage_why_and_how_to_change_it(given: stage.Given,
                                                               judged: str) -> None:
    reason = stage.choose(given, *MASTERED).reason
    other = "mix" if judged == "mix" else "master"
    assert reason.startswith(f"Judged as a {other}")
    change = "master" if judged == "mix" else "mix"
    assert f"--stage {change}" in reason and reason.count(". ") <= 2  # a sentence, two at most


# -- the stage in a review ----------------------------------------------------------------------


def context(previous: MixReview | None = None, config: str = "auto") -> AgentContext:
    async def previous_export(project: str) -> ProjectExport | None:
        if previous is None:
            return None
        return ProjectExport(run_id="run_before", project=project,
                             agent="agentbox.review.agent:mix_review", status="succeeded",
                             accepted_at="2026-07-27T14:02:00Z", finished_at=None,
                             result=previous.model_dump(mode="json"))
    return AgentContext(run_id="run_stage", attempt=1, agent="agentbox.review.agent:mix_review",
                        log=logging.LoggerAdapter(logging.getLogger("test"), {}),
                        settings=Settings().with_app(ReviewSettings(mix_stage=config)),
                        services={**services_with(previous_export), Analysis: ANALYSIS})


def review(path: Path, ctx: AgentContext, **payload: Any) -> MixReview:
    event = parse_event(encode(make_event(payload={"project_id": "night drive",
                                                   "mix_url": str(path), **payload})))
    return asyncio.run(mix_review(event, ctx))


@pytest.fixture(scope="module")
def master_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stage")
    return write(folder / "loud.wav", limited(song_audio(Song(lufs=-14.0)), -9.5, -0.5))


def test_a_stage_given_for_one_file_does_not_stick_and_one_for_the_project_does(
        master_file: Path) -> None:
    given = review(master_file, context(), stage="mix")
    assert (given.stage, given.stage_source, given.project_stage) == ("mix", "event", None)
    assert given.verdict == "fail" and given.notes[0].code == "squashed"
    assert "for this file only" in given.stage_reason
    assert review(master_file, context(previous=given)).stage_source == "auto"
    told = review(master_file, context(), project_stage="mix")
    assert (told.stage, told.stage_source, told.project_stage) == ("mix", "project", "mix")
    later = review(master_file, context(previous=told))
    assert (later.stage, later.stage_source, later.project_stage) == ("mix", "project", "mix")
    assert "the stage remembered for the project 'night drive'" in later.stage_reason
    still = review(master_file, context(previous=later))  # inherited: it still sticks
    assert (still.stage, still.stage_source) == ("mix", "project")
    one_file = review(master_file, context(previous=still), stage="master")
    assert (one_file.stage, one_file.project_stage) == ("master", "mix")  # memory kept
    watched = review(master_file, context(previous=still), default_stage="master")
    assert (watched.stage, watched.stage_source) == ("master", "watch")
    forgot = review(master_file, context(previous=still), project_stage="auto")
    assert (forgot.stage_source, forgot.project_stage) == ("auto", None)
    guessed = review(master_file, context())
    assert (guessed.stage, guessed.stage_source) == ("master", "auto")
    assert review(master_file, context(previous=guessed)).stage_source == "auto"


def test_a_watch_folders_stage_and_the_configurations(master_file: Path) -> None:
    watched = review(master_file, context(), default_stage="mix")
    assert (watched.stage, watched.stage_source) == ("mix", "watch")
    assert "agentbox watch --stage mix" in watched.stage_reason
    configured = review(master_file, context(config="mix"))
    assert (configured.stage, configured.stage_source) == ("mix", "config")
    assert "mix_stage" in configured.stage_reason


# -- refused at once ----------------------------------------------------------------------------


@pytest.mark.parametrize("payload, field, kind", [
    ({"profile": "vinyl"}, "profile", "unknown_profile"),
    ({"stage": "final"}, "stage", "literal_error"),
    ({"default_stage": "premaster"}, "default_stage", "literal_error"),
])
def test_an_unknown_profile_or_stage_is_refused(payload: dict[str, Any], field: str,
                                                kind: str) -> None:
    for event_type, extra in (("session.exported", {}),
                              ("mix.review_requested", {"requested_by": "me"})):
        with pytest.raises(InvalidEvent) as refused:
            parse_event(encode(make_event(event_type=event_type, payload={
                "project_id": "p", "mix_url": "/m.wav", **extra, **payload})))
        assert [(e["loc"], e["type"]) for e in refused.value.errors] == [
            (["payload", field], kind)]


@pytest.mark.anyio
async def test_the_receiver_refuses_a_mix_that_is_not_there(tmp_path: Path) -> None:
    there = tmp_path / "there.wav"
    soundfile.write(there, np.zeros((RATE, 2)), RATE)
    old = time.time() - 60
    os.utime(there, (old, old))
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as app:  # the built-in review
        for event_type, extra in (("session.exported", {}),
                                  ("mix.review_requested", {"requested_by": "me"})):
            for url, kind in ((str(tmp_path / "gone.wav"), "mix_not_found"),
                              ((tmp_path / "gone.wav").as_uri(), "mix_not_found"),
                              ("https://example.invalid/mix.wav", "unsupported_mix_url")):
                answer = await app.post(make_event(event_type=event_type, payload={
                    "project_id": "p", "mix_url": url, **extra}))
                assert answer.status_code == 422, answer.text
                body = answer.json()
                assert body["error_code"] == "invalid_event"
                assert [(e["loc"], e["type"]) for e in body["errors"]] == [
                    (["payload", "mix_url"], kind)]
            accepted = await app.post(make_event(event_type=event_type, payload={
                "project_id": "p", "mix_url": str(there), **extra}))
            assert accepted.status_code == 202, accepted.text


# -- the delivery targets' advice ----------------------------------------------------------------


def figures(loudness: float, peak: float) -> MixMetrics:
    return MixMetrics(
        integrated_lufs=loudness, loudness_range_lu=6.0, true_peak_dbtp=peak,
        sample_peak_dbfs=peak - 0.3, clipped_samples=0, clipped_runs=0, dc_offset=0.0,
        stereo_correlation=0.6, mono_loudness_drop_lu=1.0, duration_seconds=200.0,
        sample_rate=48_000, channels=2, bit_depth=24, sample_format="PCM_24",
        file_format="WAV", short_term_lufs=[])


loudnesses = st.floats(-45.0, -4.0, allow_nan=False)
crests = st.floats(3.0, 25.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(loudness=loudnesses, crest=crests)
def test_every_targets_advice_fits_quiet_and_loud_files(loudness: float, crest: float) -> None:
    peak = min(loudness + crest, 3.0)
    m = figures(loudness, peak)
    shared = shared_note(m)  # what every row would say, said once beside them
    assert ("Set the limiter's ceiling" in shared) == any(
        peak > t.true_peak_max_dbtp + 0.05 for t in TARGETS), shared
    for t in TARGETS:
        view = as_played(m, t)
        note, gain = view.note, view.gain_db
        assert gain is not None
        assert not re.search(r"turned (up|down)( only)? 0\.0 dB", note), note
        if t.normalisation == DOWN_ONLY:
            assert gain <= 0
        if t.normalisation == UP_TO_PEAK and gain > 0:  # never up past the ceiling
            assert peak + gain <= t.true_peak_max_dbtp + 0.05
        if t.normalisation == DELIVER:
            assert gain == 0
        over = peak > t.true_peak_max_dbtp + 0.05
        assert view.verdict == the_rule(t, loudness, peak), (t.name, note)
        assert (f"over its {t.true_peak_max_dbtp:g} dBTP ceiling" in note) == over, note
        assert "limiter's ceiling" not in note and "only costs" not in note, note  # shared
        if view.verdict != "pass" and not over:  # off the target: the row says what to do
            assert re.search(r"raise it|lower it|turned down|at the cost of punch",
                             note), (t.name, note)
        if view.verdict != "pass" and not over and note.startswith("turned down"):
            assert "only costs dynamics" in shared, shared
        if "with a limiter" in note:
            assert "limiter in true-peak mode" in shared, shared
        wanted = t.integrated_lufs - loudness
        if "raise it" in note:  # a file too quiet: gain, or a limiter when gain overshoots
            assert wanted > t.tolerance_lu
            assert ("with a limiter" in note) == (peak + wanted > t.true_peak_max_dbtp), note
        if "lower it" in note or "turned down" in note:
            assert wanted < 0


@settings(max_examples=200, deadline=None)
@given(loudness=loudnesses, crest=crests, profile=st.sampled_from(sorted(PROFILES)))
def test_a_masters_level_note_fits_its_target(loudness: float, crest: float,
                                              profile: str) -> None:
    p = PROFILES[profile]
    peak = min(loudness + crest, 3.0)
    notes = {n.code: n for n in notes_for(with_profile(figures(loudness, peak).model_dump(), p),
                                          p)}
    shortfall = p.target_lufs - loudness
    if "too_quiet" in notes:
        text = notes["too_quiet"].text
        assert "lower the limiter" not in text and "ceiling by" not in text, text
        assert ("with a limiter" in text) == (peak + shortfall > p.max_true_peak_dbtp), text
        assert f"raise it {shortfall:.1f} dB" in text
    if "too_loud" in notes:
        assert shortfall < -p.tolerance_lu
        assert "raise" not in notes["too_loud"].text
    assert ("true_peak_over" in notes) == (peak > p.max_true_peak_dbtp + 0.05)


def the_rule(t: Target, loudness: float, peak: float) -> str:
    """The manual's rule for a master on a target, said again here: over the ceiling
    fails; within the tolerance passes; louder than a platform that turns it down
    (or a club's convention) warns; quieter than a platform that turns it up all
    the way within its ceiling warns; quieter with 1 dB of peak room or more where a
    platform plays it (not a specification it must meet) warns: the platforms only
    play it quieter; otherwise more than three tolerances off fails."""
    if peak > t.true_peak_max_dbtp + 0.05:
        return "fail"
    off = round(loudness - t.integrated_lufs, 1)
    if abs(off) <= t.tolerance_lu:
        return "pass"
    if off > 0 and t.normalisation != DELIVER:
        return "warn"
    if off < 0 and t.normalisation == UP_TO_PEAK and t.true_peak_max_dbtp - peak >= -off - 0.05:
        return "warn"
    if off < 0 and t.normalisation != DELIVER and t.true_peak_max_dbtp - peak >= 1.0:
        return "warn"
    return "fail" if abs(off) > 3 * t.tolerance_lu else "warn"


@settings(max_examples=300, deadline=None)
@given(loudness=loudnesses, crest=crests, profile=st.sampled_from(sorted(PROFILES)))
def test_a_masters_verdict_is_the_row_of_its_target(loudness: float, crest: float,
                                                    profile: str) -> None:
    """The review's verdict on a master's loudness and peak and the platform row of
    the target it was judged against are one verdict, decided in one place."""
    p = PROFILES[profile]
    peak = min(loudness + crest, 3.0)
    judged = judge(with_profile(figures(loudness, peak).model_dump(), p), p)
    rows = {row.name: row for row in judged.targets}
    # Its loudness and peak alone: a low peak-to-loudness ratio is a note of its own.
    on_level = verdict_for([n for n in judged.notes if n.code != "low_plr"])
    assert on_level == rows[p.target].verdict == target_verdict(p.delivery, loudness, peak), (
        [n.text for n in judged.notes], rows[p.target].note)
    # The same distance from the same target, the same verdict, unless the platform
    # costs it nothing: Spotify turns a quiet master all the way up when its peaks
    # allow (a warning: YouTube does not), and both fail one it cannot raise.
    if rows["spotify"].verdict != rows["youtube"].verdict:
        assert (rows["spotify"].verdict, rows["youtube"].verdict) == ("warn", "fail")
        assert "to the target" in rows["spotify"].note, rows["spotify"].note


@pytest.mark.parametrize(("profile", "verdict", "rows"), [
    ("streaming", "warn", {"spotify": "warn", "youtube": "warn", "apple_music": "warn",
                           "amazon_music": "fail", "broadcast": "pass"}),
    ("ebu_r128", "pass", {"broadcast": "pass", "spotify": "warn"}),
])
def test_a_quiet_master_with_peak_room_is_a_warning_where_its_row_is(
        profile: str, verdict: str, rows: dict[str, str]) -> None:
    """-23 LUFS, -2.9 dBTP: 9 LU under streaming's -14 with 1.9 dB of peak room and
    nothing clipped: the platforms only play it quieter (a warning, saying what each
    does; Amazon Music's -2 dBTP ceiling leaves it 0.9 dB, too little); a broadcast
    master on target."""
    p = PROFILES[profile]
    judged = judge(with_profile(figures(-23.0, -2.9).model_dump(), p), p)
    by_name = {row.name: row for row in judged.targets}
    assert judged.verdict == verdict
    assert {name: by_name[name].verdict for name in rows} == rows
    if profile == "streaming":
        level = next(n for n in judged.notes if n.code == "too_quiet")
        assert level.severity == "consider", level
        assert "Spotify turns it up 1.9 dB (as far as its peaks allow)" in level.text, level
        assert "YouTube, Tidal play it as it is" in level.text, level


def test_a_quiet_master_without_peak_room_still_fails() -> None:
    """-23 LUFS at -1.5 dBTP: 0.5 dB under the ceiling, too little room to call quiet
    a choice: gain alone cannot bring it up."""
    p = PROFILES["streaming"]
    judged = judge(with_profile(figures(-23.0, -1.5).model_dump(), p), p)
    assert judged.verdict == "fail", [n.text for n in judged.notes]


def test_a_quiet_masters_platform_rows() -> None:
    p = PROFILES["streaming"]
    judged = judge(with_profile(figures(-23.0, -2.9).model_dump(), p), p)
    by_name = {row.name: row for row in judged.targets}
    spotify = by_name["spotify"].note
    assert spotify.startswith("turned up only 1.9 dB") and "raise it 9.0 dB with a limiter" \
        in spotify, spotify
    # what every row would repeat is said once, beside them
    assert "true-peak mode" not in spotify and len(spotify) < 110, spotify
    assert "limiter in true-peak mode" in shared_note(figures(-23.0, -2.9))


# -- a mix's headroom ----------------------------------------------------------------------------


def mix_notes(peak: float, bit_depth: int = 24) -> dict[str, Note]:
    m = figures(-20.0, peak).model_copy(update={"bit_depth": bit_depth})
    return {n.code: n for n in notes_for(m, PROFILES["streaming"], stage="mix")}


@pytest.mark.parametrize(("peak", "code", "severity", "says"), [
    (-0.4, "no_headroom", "consider", "-0.4 dBTP: no headroom"),
    (-2.0, "headroom", "info", "2.0 dB of headroom, a little under the 3-6 dB"),
    (-3.0, "headroom", "info", "3.0 dB of headroom, as mastering engineers ask (3-6 dB"),
    (-4.5, "headroom", "info", "4.5 dB of headroom, as mastering engineers ask (3-6 dB"),
    (-6.0, "headroom", "info", "6.0 dB of headroom, as mastering engineers ask (3-6 dB"),
    (-7.2, "headroom", "info", "7.2 dB of headroom, more than the 3-6 dB mastering "
     "engineers ask for: fine, they have room to spare; nothing to change"),
    (-24.0, "headroom", "info", "24.0 dB of headroom, more than the 3-6 dB"),
])
def test_a_mixs_headroom_note_says_its_band(peak: float, code: str, severity: str,
                                            says: str) -> None:
    notes = mix_notes(peak)
    assert (notes[code].severity, code) == (severity, code)
    assert says in notes[code].text, notes[code].text


def test_a_quiet_16_bit_mix_is_told_it_loses_resolution_not_that_it_has_room() -> None:
    notes = mix_notes(-24.0, bit_depth=16)
    assert "headroom" not in notes and notes["low_level"].severity == "consider"


@settings(max_examples=200, deadline=None)
@given(peak=st.floats(-40.0, -1.0, allow_nan=False))
def test_a_mixs_headroom_never_contradicts_its_range(peak: float) -> None:
    text = mix_notes(peak)["headroom"].text
    shown = float(re.search(r"([0-9.]+) dB of headroom", text)[1])  # type: ignore[index]
    if "as mastering engineers ask" in text:
        assert 3.0 <= shown <= 6.0, text
    elif "more than the" in text:
        assert shown > 6.0, text
    else:
        assert "a little under" in text and shown < 3.0, text


# -- from the command line ----------------------------------------------------------------------


@pytest.mark.slow  # a server and its analysis process, and the CLI in processes of its own
def test_send_and_watch_give_the_stage(server_factory: Any, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    folder = tmp_path / "exports"
    folder.mkdir()
    loud = write(folder / "loud.wav", limited(song_audio(Song(lufs=-14.0)), -9.5, -0.5))

    def agentbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                              env=server.env, capture_output=True, text=True, timeout=180,
                              cwd=tmp_path)

    sent = agentbox("send", "--type", "session.exported", "--project", "as a mix", "--mix",
                    str(loud), "--stage", "mix", "--wait", "--json")
    assert sent.returncode == 0, sent.stderr
    run = json.loads(sent.stdout.split("\n", 1)[1])  # the answer, then the run
    assert (run["result"]["stage"], run["result"]["stage_source"]) == ("mix", "event")
    told = agentbox("show", run["run_id"])
    assert "Judged as a mix going to mastering: the export says so" in told.stdout
    missing = agentbox("send", "--type", "session.exported", "--project", "x", "--mix",
                       str(tmp_path / "not-rendered.wav"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr  # never sent
    watched = agentbox("watch", str(folder), "--stage", "mix", "--existing", "--once")
    assert watched.returncode == 0, watched.stderr
    runs = server.client.get("/runs", params={"limit": 10}).json()["runs"]
    by_watch = [r for r in runs if r["run_id"] != run["run_id"]]
    assert by_watch, runs
    result = server.wait_terminal(by_watch[0]["run_id"], timeout=120)["result"]
    assert (result["stage"], result["stage_source"]) == ("mix", "watch")


def test_the_stage_is_one_enum_that_the_contract_and_the_options_say_alike() -> None:
    from typing import get_args

    from agentbox.review.contract import StageField
    from agentbox.review.stage import STAGES, StageName

    assert get_args(StageField) == STAGES == tuple(StageName) == ("mix", "master")
    assert judge.__defaults__ is not None and StageName.MASTER in judge.__defaults__


def test_a_plr_that_rounds_to_nothing_reads_0_0_not_minus() -> None:
    """A mix whose true peak sits a hair under its loudness (a held tone): "PLR 0.0 dB"
    in the summary and the note, never "-0.0"."""
    from agentbox.review.judge import summarise

    p = PROFILES["streaming"]
    held = figures(-10.0, -10.04).model_copy(update={"plr_db": -0.04})
    said = [summarise(held, p, "mix"),
            *(n.text for n in notes_for(held, p, stage="mix"))]
    assert any("PLR 0.0 dB" in s or "ratio 0.0 dB" in s for s in said), said
    assert not any("-0.0" in s for s in said), said


def test_the_meter_hears_dither_tags_and_a_pinned_ceiling(tmp_path: Path) -> None:
    """What the stage weighs, measured: dither (a few steps of noise where a 16-bit
    file is quiet, not digital silence), a release's tags, peaks held at one ceiling."""
    from agentbox.review.meter import measure
    rng = np.random.default_rng(3)
    tone = 0.5 * np.sin(2 * np.pi * 220 * np.arange(RATE * 4) / RATE)
    silent = np.concatenate([tone, np.zeros(RATE * 2)])
    noisy = np.concatenate([tone, rng.integers(-2, 3, RATE * 2) / 32768])
    for name, audio, dithered in (("plain.wav", silent, False), ("dithered.wav", noisy, True)):
        path = tmp_path / name
        with soundfile.SoundFile(path, "w", RATE, 1, "PCM_16") as out:
            out.title, out.artist, out.album = "Night Drive", "The Band", "Roads"
            out.write(audio)
        m = measure(str(path))
        assert m.dithered is dithered and m.tags == ["title", "artist", "album"], name
        assert m.peaks_pinned is not None and m.peaks_pinned > 0.9  # a steady tone
    loose = tmp_path / "loose.wav"
    soundfile.write(loose, np.concatenate([tone * 0.1, tone[:RATE // 10]]), RATE,
                    subtype="PCM_24")
    m = measure(str(loose))
    assert m.dithered is None and m.tags == [] and m.peaks_pinned is not None
    assert m.peaks_pinned < 0.1  # one loud moment above the rest: no ceiling held


def test_a_review_asks_only_when_its_inferred_stage_was_split() -> None:
    """The page's question (present's `asks`) comes from an inferred stage with split
    evidence and both first fixes; a given stage, clear evidence or a review stored
    before the question do not ask; the stage sentence then names the evidence once."""
    fixes = {"mix": "export the mix again as WAV", "master": "nothing to fix"}
    reason = stage.both_readings("Judged as a mix, but the evidence is split: x.",
                                 fixes["mix"], fixes["master"])
    doc = {"stage": "mix", "stage_source": "auto", "stage_split": True,
           "stage_readings": fixes, "stage_reason": reason}
    asking = present.Review(doc, {}, None, ())
    assert asking.asks == fixes
    assert asking.stage_evidence == "Judged as a mix, but the evidence is split: x."
    for changed in ({"stage_source": "event"}, {"stage_split": False},
                    {"stage_readings": None}, {"stage_readings": {"mix": "", "master": "x"}}):
        quiet = present.Review({**doc, **changed}, {}, None, ())
        assert quiet.asks is None, changed
        assert quiet.stage_evidence == reason
