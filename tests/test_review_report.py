"""The review's report on real renders: cut-short files (mix_truncated), mono and
dual mono, unused headroom, every delivery target, where the clipping is, the low
end, tonal balance, silence at the edges, the verdict and the order of the
notes, the comparison with the project's previous export and with a reference
track.

Every signal is generated here (numpy) and written as a real file (soundfile).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from agentbox.archive.records import ProjectExport
from agentbox.engine.agents import (
    AgentContext,
    AttemptGivenBack,
    PermanentAgentError,
    RetryableAgentError,
)
from agentbox.events import parse_event
from agentbox.review.agent import mix_review
from agentbox.review.analysis import TRUNCATED_RESERVE_SECONDS, TRUNCATED_RETRY_SECONDS, Analysis
from agentbox.review.delivery import delivery_targets
from agentbox.review.judge import notes_for, verdict_for, with_profile
from agentbox.review.meter import AudioError, measure
from agentbox.review.model import MixMetrics
from agentbox.review.profiles import PROFILES
from agentbox.review.view import Review
from tests.conftest import Server, encode, make_event, wait_until_async
from tests.support.history import services_with

RATE = 48_000
OLD = time.time() - 3600  # files are "settled": last written an hour ago


ANALYSIS = Analysis()  # the analysis processes the in-process reviews share, as a server's


@pytest.fixture(scope="module", autouse=True)
def analysis_processes() -> Iterator[None]:
    yield
    ANALYSIS.shutdown()


def sine(dbfs: float, seconds: float, channels: int = 2, rate: int = RATE,
         freq: float = 1000.0) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    wave = 10 ** (dbfs / 20) * np.sin(2 * np.pi * freq * t)
    return np.repeat(wave[:, None], channels, axis=1)


def noise(seconds: float, level: float = 0.1, rate: int = RATE, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, level, size=(round(seconds * rate), 2))


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., Path]:
    def make(audio: np.ndarray, name: str = "mix.wav", rate: int = RATE,
             subtype: str = "PCM_24", mtime: float = OLD) -> Path:
        path = tmp_path / name
        soundfile.write(path, audio, rate, subtype=subtype)
        os.utime(path, (mtime, mtime))
        return path
    return make


def cut(path: Path, keep_seconds: float, rate: int, frame_bytes: int,
        mtime: float = OLD) -> Path:
    """The file as a renderer that stopped writing leaves it: the header as written
    for the whole song, the data cut off."""
    data = path.read_bytes()
    trailing = soundfile.info(str(path)).frames * frame_bytes
    header = len(data) - trailing
    path.write_bytes(data[:header + round(keep_seconds * rate) * frame_bytes])
    os.utime(path, (mtime, mtime))
    return path


def context(previous: Callable[[str], Any] | None = None) -> AgentContext:
    return AgentContext(run_id="run_test", attempt=1, agent="agentbox.review.agent:mix_review",
                        log=logging.LoggerAdapter(logging.getLogger("test"), {}),
                        services={**services_with(previous), Analysis: ANALYSIS})


def review(mix_url: str, ctx: AgentContext | None = None, **payload: Any) -> Any:
    event = parse_event(encode(make_event(payload={
        "project_id": "night-drive", "mix_url": mix_url, **payload})))
    return asyncio.run(mix_review(event, ctx or context()))


# -- the filter, loaded without scipy.signal ------------------------------------------------------


def test_the_k_weighting_filter_is_pyloudnorms_with_bs1770s_high_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pyloudnorm
    from scipy import signal

    from agentbox.review import meter

    for rate in (8000, 44_100, 48_000, 96_000):
        stages = pyloudnorm.Meter(rate)._filters
        shelf, high_pass = stages["high_shelf"], stages["high_pass"]
        expected = np.array([[*shelf.b, *shelf.a], [*(high_pass.b / high_pass.b[0]),
                                                     *high_pass.a]])
        assert np.allclose(meter.k_weighting(rate), expected, rtol=1e-12, atol=0)
    # the compiled filter loaded on its own, and the public fallback, filter alike
    x = np.random.default_rng(1).normal(size=(2, 5000))
    sos = meter.k_weighting(48_000)
    reference, _ = signal.sosfilt(sos, x, axis=-1, zi=np.zeros((2, 2, 2)))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    for run in (meter._sosfilt, meter._load_sosfilt()):  # the second: fallback
        state = np.zeros((2, 2, 2))
        head, tail = np.ascontiguousarray(x[:, :2500]), np.ascontiguousarray(x[:, 2500:])
        run(sos, head, state)
        run(sos, tail, state)  # state carried between blocks
        assert np.allclose(np.hstack([head, tail]), reference, atol=1e-12)


def test_the_spectra_loaded_without_scipy_fft_are_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbox.review import meter

    frames = np.random.default_rng(2).normal(size=(4, 2, 8192)).astype(np.float32)
    reference = np.fft.rfft(frames.astype(np.float64), axis=-1)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    for run in (meter._rfft, meter._load_rfft()):  # the second: numpy's, the fallback
        spectra = run(frames)
        assert spectra.shape == reference.shape
        assert np.allclose(spectra, reference, rtol=0, atol=1e-3)  # float32's rounding


# -- cut-short and corrupt renders --------------------------------------------------------------


@pytest.mark.parametrize(("name", "subtype"), [("cut.wav", "PCM_16"), ("cut.aiff", "PCM_16")])
def test_a_render_cut_short_is_mix_truncated(write: Callable[..., Path], name: str,
                                             subtype: str) -> None:
    rate = 8000
    path = cut(write(sine(-20, 180, channels=1, rate=rate), name, rate, subtype), 17.2,
               rate, 2)
    with pytest.raises(AudioError) as failed:
        measure(str(path))
    assert failed.value.code == "mix_truncated"
    assert "the header promises 3:00.0, the file holds 0:17.2" in failed.value.message
    with pytest.raises(PermanentAgentError) as permanent:  # written an hour ago: broken
        review(str(path))
    assert permanent.value.code == "mix_truncated" and "0:17.2" in str(permanent.value)


def stalled(write: Callable[..., Path], seconds_ago: float) -> tuple[Path, bytes]:
    """A 20-second render whose writer stalled `seconds_ago`, 5 seconds in (settled
    for the first look, not for long), and the bytes of the whole render."""
    rate = 8000
    path = write(sine(-20, 20, channels=1, rate=rate), rate=rate, subtype="PCM_16")
    whole = path.read_bytes()
    return cut(path, 5.0, rate, 2, mtime=time.time() - seconds_ago), whole


async def until_waiting(caplog: pytest.LogCaptureFixture) -> None:
    await wait_until_async(lambda: "waiting for the rest" in caplog.text, 60,
                           "the attempt to begin waiting for the rest")


def test_a_stalled_render_finished_later_is_measured_whole_in_the_same_attempt(
        write: Callable[..., Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test")
    path, whole = stalled(write, seconds_ago=10)

    async def finish_while_it_waits() -> Any:
        measuring = asyncio.ensure_future(ANALYSIS.measure(path, str(path), context()))
        await until_waiting(caplog)
        path.write_bytes(whole)  # the renderer goes on and finishes
        return await asyncio.wait_for(measuring, 60)

    _, file = asyncio.run(finish_while_it_waits())
    assert file.frames_read == file.frames_declared == 20 * 8000


def test_a_stalled_render_left_as_it_is_fails_for_good_without_spending_a_retry(
        write: Callable[..., Path]) -> None:
    path, _ = stalled(write, seconds_ago=TRUNCATED_RETRY_SECONDS - 3)
    started = time.monotonic()
    with pytest.raises(PermanentAgentError) as failed:  # not a RetryableAgentError first
        asyncio.run(ANALYSIS.measure(path, str(path), context()))
    assert failed.value.code == "mix_truncated" and "0:05.0" in str(failed.value)
    assert time.monotonic() - started >= 2.5  # it waited out the window's rest


def test_a_server_stopping_gives_back_an_attempt_waiting_for_the_rest(
        write: Callable[..., Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test")
    path, _ = stalled(write, seconds_ago=10)
    ctx = context()

    async def stop_while_it_waits() -> None:
        measuring = asyncio.ensure_future(ANALYSIS.measure(path, str(path), ctx))
        await until_waiting(caplog)
        ctx.cancelled.set()
        await asyncio.wait_for(measuring, 5)

    with pytest.raises(AttemptGivenBack):  # costs no retry
        asyncio.run(stop_while_it_waits())


def test_a_run_short_of_time_hands_the_wait_to_its_retry(write: Callable[..., Path]) -> None:
    path, _ = stalled(write, seconds_ago=10)
    ctx = context()
    ctx.deadline = time.monotonic() + TRUNCATED_RESERVE_SECONDS - 5
    with pytest.raises(RetryableAgentError) as retried:
        asyncio.run(ANALYSIS.measure(path, str(path), ctx))
    assert retried.value.code == "mix_truncated"


def test_a_flac_whose_stream_stops_early_is_mix_truncated(write: Callable[..., Path]) -> None:
    path = write(noise(30, rate=8000), "cut.flac", 8000, "PCM_16")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3])
    os.utime(path, (OLD, OLD))
    with pytest.raises(AudioError) as failed:
        measure(str(path))
    assert failed.value.code == "mix_truncated"
    assert "the header promises 0:30.0" in failed.value.message


def test_an_empty_render_is_said_to_be_empty(tmp_path: Path) -> None:
    path = tmp_path / "failed render.wav"
    path.write_bytes(b"")
    os.utime(path, (OLD, OLD))
    with pytest.raises(AudioError) as failed:
        measure(str(path))
    assert failed.value.code == "mix_unreadable"
    assert "the file is empty (0 bytes)" in failed.value.message
    with pytest.raises(PermanentAgentError) as permanent:
        review(str(path))
    assert "empty (0 bytes)" in str(permanent.value)


def test_a_whole_file_is_not_called_truncated(write: Callable[..., Path]) -> None:
    m = measure(str(write(sine(-20, 3), subtype="PCM_16")))
    assert m.frames_declared == m.frames_read == 3 * RATE


def test_an_impossible_reading_is_not_reported_as_loudness(write: Callable[..., Path]) -> None:
    # Data read as floats that are not audio: far past what any signal within full
    # scale can read (a square wave, boosted by the K-weighting's shelf).
    garbage = noise(2) * 100
    with pytest.raises(AudioError) as failed:
        measure(str(write(garbage, "garbage.wav", subtype="FLOAT")))
    assert failed.value.code == "mix_truncated" and "louder than any audio" in \
        failed.value.message


@pytest.mark.skipif("MP3" not in soundfile.available_formats(),
                    reason="this libsndfile cannot write MP3")
def test_an_mp3_is_measured_and_called_lossy(write: Callable[..., Path]) -> None:
    path = write(sine(-14, 10), "mix.mp3", subtype="MPEG_LAYER_III")
    m = measure(str(path))
    assert m.integrated_lufs == pytest.approx(-14, abs=0.3) and m.bit_depth is None
    result = review(str(path))
    assert result.file.bit_depth is None
    assert any(n.code == "lossy" for n in result.notes)


# -- what a musician needs to hear --------------------------------------------------------------


def test_mono_dual_mono_and_headroom(write: Callable[..., Path]) -> None:
    mono = review(str(write(sine(-30, 5, channels=1), "mono.wav")))
    assert mono.metrics.mono and not mono.metrics.dual_mono
    assert any(n.code == "mono" for n in mono.notes)
    dual = review(str(write(sine(-30, 5), "dual.wav")))
    assert dual.metrics.dual_mono and not dual.metrics.mono
    assert any("dual mono" in text for text in dual.review_notes)
    # A mix: -30 dBFS peaks, 30 dB under full scale, all of it mastering's
    assert dual.stage == "mix" and dual.metrics.headroom_db == pytest.approx(30.0, abs=0.1)
    # A master: 29 dB under the -1 dBTP ceiling; quiet by less than that, so gain alone
    # raises it to the target (the note says so; no separate note of unused headroom)
    master = review(str(write(sine(-30, 5), "dual-master.wav")), stage="master")
    assert master.metrics.headroom_db == pytest.approx(29.0, abs=0.1)
    quiet = next(n for n in master.notes if n.code == "too_quiet")
    assert "gain alone does it" in quiet.text
    assert not any(n.code == "unused_headroom" for n in master.notes)
    # A blip at -3 dBTP in a quiet master: 2 dB of the way up is free, the rest takes a
    # limiter
    blip = review(str(write(np.vstack([sine(-3, 0.1), sine(-20, 8)]), "blip.wav")),
                  stage="master")
    free = next(n for n in blip.notes if n.code == "unused_headroom")
    assert "the first 2.0 dB of raising it need no limiting" in free.text
    assert "with a limiter holding the true peak at -1 dBTP" in next(
        n for n in blip.notes if n.code == "too_quiet").text
    wide = review(str(write(noise(5), "wide.wav")))
    assert not wide.metrics.dual_mono and not wide.metrics.mono


def test_every_delivery_target_side_by_side(write: Callable[..., Path]) -> None:
    loud = review(str(write(sine(-10, 8), "loud.wav")), stage="master")  # -10 LUFS, -10 dBTP
    targets = {t.name: t for t in loud.targets}
    assert list(targets) == ["spotify", "apple_music", "youtube", "amazon_music", "podcast",
                             "broadcast", "broadcast_us", "club"]
    assert targets["spotify"].gain_db == pytest.approx(-4.0, abs=0.1)
    assert targets["apple_music"].gain_db == pytest.approx(-6.0, abs=0.1)
    assert targets["youtube"].gain_db == pytest.approx(-4.0, abs=0.1)
    assert targets["spotify"].note.startswith("turned down 4.0 dB")
    # delivered to a specification: nobody turns it; the note says what to do
    assert targets["broadcast"].gain_db == 0.0
    assert targets["broadcast"].note == ("plays as it is, 13.0 LU louder than -23 LUFS: "
                                         "lower it that much")
    assert targets["club"].gain_db == 0.0 and "plays as it is" in targets["club"].note
    # what the rows share is said once, beside them: turned down, it only costs dynamics;
    # lowering a delivered master takes gain alone
    assert "only costs dynamics" in loud.targets_note and "gain alone" in loud.targets_note
    assert not any("only costs" in t.note or "gain only" in t.note for t in loud.targets)
    # A quiet mix peaking at -3 dBTP: Spotify turns it up only to the -1 dBTP limit;
    # YouTube not at all.
    quiet = MixMetrics(**measure(str(write(np.vstack([sine(-3, 0.1), sine(-20, 20)]),
                                           "quiet.wav"))).as_dict())
    spotify, youtube = delivery_targets(quiet)[0], delivery_targets(quiet)[2]
    assert quiet.integrated_lufs is not None and quiet.true_peak_dbtp is not None
    limit = round(-1 - quiet.true_peak_dbtp, 1)
    assert -14 - quiet.integrated_lufs > limit + 0.5  # it would need more than that
    assert spotify.gain_db == pytest.approx(limit, abs=0.05)
    assert spotify.note.startswith(f"turned up only {limit:.1f} dB, as far as its peaks "
                                   "allow")
    assert spotify.result_true_peak_dbtp == pytest.approx(-1.0, abs=0.05)
    assert youtube.gain_db == 0.0 and youtube.note.startswith("not turned up")
    # more than three tolerances under the target, but with 2 dB of peak room: the
    # platforms only play it quieter, a warning wherever it plays
    assert -14 - quiet.integrated_lufs > 3
    assert spotify.verdict == youtube.verdict == "warn"
    assert "raise it" in spotify.note and "raise it" in youtube.note
    # a mix: what mastering would take for each target, and no verdicts
    mix = review(str(write(sine(-10, 8), "loud-mix.wav")))
    assert mix.stage == "mix"
    assert all(t.verdict is None and t.gain_db is None for t in mix.targets)
    assert mix.targets[0].note.startswith("-14 LUFS under -1 dBTP: 4.0 dB quieter than this mix")
    assert mix.targets_note.startswith("This mix's PLR (true peak minus loudness) is 0.0 dB")


def test_momentary_short_term_maxima_and_plr(write: Callable[..., Path]) -> None:
    m = measure(str(write(np.vstack([sine(-30, 10), sine(-12, 1), sine(-30, 10)]))))
    assert m.momentary_max_lufs == pytest.approx(-12.0, abs=0.1)
    # the 3 s window holding the loud second: 1 s at -12 and 2 s at -30
    expected = -0.691 + 10 * np.log10((10 ** ((-12 + 0.691) / 10) + 2 * 10 ** (
        (-30 + 0.691) / 10)) / 3)
    assert m.short_term_max_lufs == pytest.approx(expected, abs=0.1)
    assert m.plr_db == pytest.approx(m.true_peak_dbtp - m.integrated_lufs, abs=0.02)
    assert len(m.momentary_lufs) == len(m.short_term_lufs) == 21


def test_clipping_and_overs_are_located(write: Callable[..., Path]) -> None:
    rate = 8000
    audio = sine(-20, 70, rate=rate, freq=200)
    loud = slice(62 * rate, 64 * rate)
    audio[loud] = np.clip(audio[loud] * 30, -1, 1)  # hard clipping from 1:02 to 1:04
    result = review(str(write(audio, rate=rate, subtype="FLOAT")))
    ranges = [r for r in result.metrics.clipping_ranges if r.kind == "clipping"]
    assert len(ranges) == 1
    assert ranges[0].start == pytest.approx(62, abs=0.05)
    assert ranges[0].end == pytest.approx(64, abs=0.05)
    clipping = next(n for n in result.notes if n.code == "clipping")
    assert "at 1:02\N{EN DASH}1:04" in clipping.text and clipping.severity == "fix"
    assert result.verdict == "fail"
    # reported once: the page's caption under the chart names the places the note does
    page = Review.of(result.model_dump(mode="json"))
    assert page is not None and page.clipping_text == "1:02\N{EN DASH}1:04"
    # a sine at fs/4 45 degrees off, sample peak -0.5 dBFS: over 0 dBTP between samples
    n = np.arange(RATE * 10)
    wave = 10 ** (-2.5 / 20) / np.sqrt(0.5) * np.sin(2 * np.pi * n / 4 + np.pi / 4)
    wave = np.where(n >= 5 * RATE, wave, wave * 0.1)  # +0.5 dBTP from 0:05 on
    over = measure(str(write(np.stack([wave, wave], axis=1), "over.wav", subtype="FLOAT")))
    overs = [r for r in over.clipping_ranges if r["kind"] == "over"]
    assert over.true_peak_dbtp is not None and over.true_peak_dbtp > 0
    assert overs and overs[0]["start"] == pytest.approx(5.0, abs=0.05)


def test_wide_bass_is_called_out(write: Callable[..., Path]) -> None:
    bass = sine(-12, 20, freq=50)
    bass[:, 1] *= -1  # the bass out of phase between the sides
    mix = bass + noise(20, 0.02)
    result = review(str(write(mix, "wide-bass.wav")))
    assert result.metrics.low_end_correlation is not None
    assert result.metrics.low_end_correlation < -0.9
    # the whole mix is the bass, so its sides are out of phase: one cause, one note
    # that gives the low end's correlation as its evidence
    note = next(n for n in result.notes if n.code == "out_of_phase")
    assert note.severity == "fix" and "below 120 Hz -1.00" in note.text, note.text
    assert not {"low_end_wide", "mono_cancels", "mono_drop"} & {n.code for n in result.notes}
    tidy = review(str(write(sine(-12, 20, freq=50) + noise(20, 0.02), "tidy.wav")))
    assert tidy.metrics.low_end_correlation is not None
    assert tidy.metrics.low_end_correlation > 0.9


def test_tonal_balance_against_the_profile_curve(write: Callable[..., Path]) -> None:
    boomy = sine(-8, 20, freq=70) + noise(20, 0.01)
    result = review(str(write(boomy, "boomy.wav")))
    bands = {b.hz: b for b in result.metrics.octave_bands}
    assert set(bands) >= {31.5, 63.0, 125.0, 1000.0, 16000.0}
    assert all(b.reference_db is not None for b in bands.values())
    assert bands[63.0].db > bands[1000.0].db + 20
    assert any(n.code == "low_end_buildup" for n in result.notes)
    harsh = sine(-8, 20, freq=3000) + noise(20, 0.01)
    assert any(n.code == "harsh" for n in review(str(write(harsh, "harsh.wav"))).notes)


def test_silence_at_the_edges(write: Callable[..., Path]) -> None:
    audio = np.vstack([np.zeros((3 * RATE, 2)), noise(10), np.zeros((6 * RATE, 2))])
    result = review(str(write(audio)), stage="master")  # a mix's are trimmed in mastering
    assert result.metrics.leading_silence_seconds == pytest.approx(3.0, abs=0.01)
    assert result.metrics.trailing_silence_seconds == pytest.approx(6.0, abs=0.01)
    codes = [n.code for n in result.notes]
    assert "leading_silence" in codes and "trailing_silence" in codes


def test_delivery_format(write: Callable[..., Path]) -> None:
    result = review(str(write(noise(5, rate=22_050), rate=22_050, subtype="PCM_16")))
    assert (result.file.sample_rate, result.file.bit_depth, result.file.format) == (
        22_050, 16, "WAV")
    assert result.file.frames_declared == result.file.frames_read == 5 * 22_050
    assert any(n.code == "low_sample_rate" for n in result.notes)


def test_notes_are_ordered_by_what_to_fix_first() -> None:
    base = MixMetrics(
        integrated_lufs=-15.5, loudness_range_lu=6.0, true_peak_dbtp=0.3,
        sample_peak_dbfs=-0.1, clipped_samples=30, clipped_runs=2, dc_offset=0.006,
        stereo_correlation=0.6, mono_loudness_drop_lu=1.0, duration_seconds=215.0,
        sample_rate=48_000, channels=2, bit_depth=24, sample_format="PCM_24",
        file_format="WAV", short_term_lufs=[], leading_silence_seconds=2.5)
    notes = notes_for(with_profile(base.model_dump(), PROFILES["streaming"]),
                      PROFILES["streaming"])
    severities = [n.severity for n in notes]
    assert severities == sorted(severities, key=("fix", "consider", "info").index)
    # clipping in the render first: nothing after it can undo it
    assert [n.code for n in notes][:2] == ["clipping", "true_peak_over"]
    assert {"too_quiet", "dc_offset", "leading_silence"} <= {n.code for n in notes}
    assert verdict_for(notes) == "fail"
    on_target = notes_for(with_profile(base.model_copy(update={
        "integrated_lufs": -14.0, "true_peak_dbtp": -1.5, "clipped_runs": 0,
        "clipped_samples": 0, "dc_offset": 0.0, "leading_silence_seconds": 0.0,
    }).model_dump(), PROFILES["streaming"]), PROFILES["streaming"])
    assert verdict_for(on_target) == "pass", on_target


# -- the previous export and a reference track --------------------------------------------------


def test_the_first_export_of_a_project_has_nothing_to_compare(
        write: Callable[..., Path]) -> None:
    result = review(str(write(sine(-14, 5))))
    assert result.comparison.previous_run_id is None and result.comparison.deltas == {}


def test_an_export_is_compared_with_the_previous_one(write: Callable[..., Path]) -> None:
    before = review(str(write(sine(-14, 5), "v1.wav")), stage="master").model_dump(
        mode="json")
    asked: list[str] = []

    async def previous(project: str) -> ProjectExport:
        asked.append(project)
        return ProjectExport(run_id="run_v1", project=project,
                             agent="agentbox.review.agent:mix_review", status="succeeded",
                             accepted_at="2026-07-27T14:02:00+00:00",
                             finished_at="2026-07-27T14:02:05+00:00", result=before)

    louder = np.clip(sine(-12.8, 5) * 1.0, -1, 1)
    louder[RATE, :] = 0.99  # a peak over the -1 dBTP ceiling
    result = review(str(write(louder, "v2.wav")), context(previous), stage="master")
    assert asked == ["night-drive"]
    comparison = result.comparison
    assert comparison.previous_run_id == "run_v1"
    assert comparison.deltas["integrated_lufs"] == pytest.approx(1.2, abs=0.05)
    assert comparison.note.startswith("1.2 LU louder than the ")
    assert "true peak now over the ceiling" in comparison.note
    assert comparison.note in result.review_notes


def test_a_reference_track_is_compared(write: Callable[..., Path]) -> None:
    reference = write(sine(-9, 20, freq=60) + noise(20, 0.05), "reference.wav")
    result = review(str(write(noise(20, 0.05), "mix.wav")), reference_url=reference.as_uri())
    ref = result.reference
    assert ref is not None and ref.file == "reference.wav" and ref.error is None
    assert ref.integrated_lufs is not None and result.metrics.integrated_lufs is not None
    assert ref.deltas["integrated_lufs"] == pytest.approx(
        result.metrics.integrated_lufs - ref.integrated_lufs, abs=0.02)
    assert ref.deltas["band_63_hz_db"] < -10  # the reference has far more bass
    assert ref.source == "event"  # the event's own, not a project's
    assert "quieter than the reference track reference.wav" in ref.note
    assert "less low end at 60-125 Hz than the reference track" in ref.note
    missing = review(str(write(noise(5), "m2.wav")), reference_url="/nonexistent/ref.wav")
    assert missing.reference is not None and missing.reference.error is not None
    assert "could not be measured" in missing.reference.note  # the review itself stands


def test_the_server_compares_exports_of_one_project(server_factory: Callable[..., Server],
                                                    write: Callable[..., Path]) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    first = server.post(make_event(payload={"project_id": "Night Drive",
                                            "mix_url": str(write(sine(-14, 4), "a.wav"))}))
    run1 = server.wait_terminal(first.json()["run_id"], timeout=90)
    assert run1["status"] == "succeeded", run1
    assert run1["result"]["comparison"]["previous_run_id"] is None
    other = server.post(make_event(payload={"project_id": "Other Song",
                                            "mix_url": str(write(sine(-20, 4), "b.wav"))}))
    assert server.wait_terminal(other.json()["run_id"], timeout=90)["status"] == "succeeded"
    second = server.post(make_event(payload={"project_id": "Night Drive",
                                             "mix_url": str(write(sine(-12, 4), "c.wav"))}))
    run2 = server.wait_terminal(second.json()["run_id"], timeout=90)
    comparison = run2["result"]["comparison"]
    assert comparison["previous_run_id"] == run1["run_id"]
    assert comparison["deltas"]["integrated_lufs"] == pytest.approx(2.0, abs=0.05)
    assert "2.0 LU louder than the" in comparison["note"]
    assert {t["name"] for t in run2["result"]["targets"]} == {
        "spotify", "apple_music", "youtube", "amazon_music", "podcast", "broadcast",
        "broadcast_us", "club"}
    assert run2["result"]["verdict"] in ("pass", "warn", "fail")
