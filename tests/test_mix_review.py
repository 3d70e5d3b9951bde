"""The mix-review agent: measurements against known answers, the EBU reference
cases, the notes, the agent's errors, and the optional LLM notes.

Every signal is generated here (numpy) and written as a real file (soundfile):
EBU Tech 3341 (loudness) and Tech 3342 (loudness range) cases from their
definitions, sines, noise, clipped and DC-offset material, silence, mono, 5.1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pyloudnorm
import pytest
import soundfile

from agentbox.config import Settings
from agentbox.engine.agents import AgentContext, PermanentAgentError, RetryableAgentError
from agentbox.events import InvalidEvent, parse_event
from agentbox.review import llm as llm_module
from agentbox.review.agent import choose_profile, mix_review
from agentbox.review.analysis import Analysis
from agentbox.review.judge import rule_notes, summarise
from agentbox.review.meter import READ_SECONDS, measure
from agentbox.review.model import MixMetrics
from agentbox.review.profiles import PROFILES
from agentbox.review.settings import ReviewSettings
from tests.conftest import Server, encode, make_event

RATE = 48_000
OLD = time.time() - 3600  # files are "settled": last written an hour ago


def sine(dbfs: float, seconds: float, channels: int = 2, rate: int = RATE,
         freq: float = 1000.0) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    wave = 10 ** (dbfs / 20) * np.sin(2 * np.pi * freq * t)
    return np.repeat(wave[:, None], channels, axis=1)


ANALYSIS = Analysis()  # the analysis processes the in-process reviews share, as a server's


@pytest.fixture(scope="module", autouse=True)
def analysis_processes() -> Iterator[None]:
    yield
    ANALYSIS.shutdown()


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., Path]:
    def make(audio: np.ndarray, name: str = "mix.wav", rate: int = RATE,
             subtype: str = "FLOAT") -> Path:
        path = tmp_path / name
        soundfile.write(path, audio, rate, subtype=subtype)
        os.utime(path, (OLD, OLD))
        return path
    return make


# -- EBU reference cases ------------------------------------------------------------------------

TECH_3341 = {  # case: (segments of (dBFS, seconds), expected integrated LUFS); ±0.1 LU
    1: ([(-23, 20)], -23.0),
    2: ([(-33, 20)], -33.0),
    3: ([(-36, 10), (-23, 60), (-36, 10)], -23.0),
    4: ([(-72, 10), (-36, 10), (-23, 20), (-36, 10), (-72, 10)], -23.0),
    5: ([(-26, 20), (-20, 20.1), (-26, 20)], -23.0),
}
TECH_3342 = {  # case: (segments, expected loudness range LU); ±1 LU
    1: ([(-20, 20), (-30, 20)], 10.0),
    2: ([(-20, 20), (-15, 20)], 5.0),
    3: ([(-40, 20), (-20, 20)], 20.0),
    4: ([(-50, 20), (-35, 20), (-20, 20), (-35, 20), (-50, 20)], 15.0),
}


@pytest.mark.slow  # 20 to 80 s of generated audio each
@pytest.mark.parametrize("case", sorted(TECH_3341))
def test_ebu_tech_3341_integrated_loudness(write: Callable[..., Path], case: int) -> None:
    segments, expected = TECH_3341[case]
    path = write(np.vstack([sine(db, s) for db, s in segments]))
    assert measure(str(path)).integrated_lufs == pytest.approx(expected, abs=0.1)


@pytest.mark.slow  # 20 s of five channels
def test_ebu_tech_3341_case_6_five_channels(write: Callable[..., Path]) -> None:
    levels = [-28.0, -28.0, -24.0, -30.0, -30.0]  # L R C Ls Rs
    audio = np.hstack([sine(db, 20, channels=1) for db in levels])
    assert measure(str(write(audio))).integrated_lufs == pytest.approx(-23.0, abs=0.1)


@pytest.mark.slow  # 40 to 100 s of generated audio each
@pytest.mark.parametrize("case", sorted(TECH_3342))
def test_ebu_tech_3342_loudness_range(write: Callable[..., Path], case: int) -> None:
    segments, expected = TECH_3342[case]
    path = write(np.vstack([sine(db, s) for db, s in segments]))
    assert measure(str(path)).loudness_range_lu == pytest.approx(expected, abs=1.0)


def test_true_peak_finds_the_peak_between_samples(write: Callable[..., Path]) -> None:
    # A sine at a quarter of the sample rate, 45° off: every sample lands at 0.707 of
    # the wave's peak, so the sample peak reads 3 dB under the true peak.
    n = np.arange(RATE * 2)
    wave = 0.5 * np.sin(2 * np.pi * n / 4 + np.pi / 4)
    m = measure(str(write(np.stack([wave, wave], axis=1))))
    assert m.sample_peak_dbfs == pytest.approx(-9.03, abs=0.01)
    assert -6.02 - 0.4 <= m.true_peak_dbtp <= -6.02 + 0.2  # Tech 3341's true-peak tolerance


def pink_noise(seconds: float, channels: int = 2, seed: int = 7) -> np.ndarray:
    """1/f noise: white noise shaped in the frequency domain."""
    rng = np.random.default_rng(seed)
    n = round(seconds * RATE)
    spectrum = np.fft.rfft(rng.normal(size=(n, channels)), axis=0)
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    spectrum[1:] /= np.sqrt(freqs[1:, None])
    spectrum[0] = 0
    noise = np.fft.irfft(spectrum, n, axis=0)
    return np.asarray(0.2 * noise / np.max(np.abs(noise)))


def test_agrees_with_pyloudnorm_on_pink_noise(write: Callable[..., Path]) -> None:
    noise = pink_noise(15)
    ours = measure(str(write(noise))).integrated_lufs
    reference = pyloudnorm.Meter(RATE).integrated_loudness(noise)
    # the same filter, but BS.1770's high-pass numerator: 0.04 dB apart
    assert ours == pytest.approx(reference + 0.04, abs=0.02)


# -- the other measurements ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "subtype", "rate", "bits"), [
    ("a.wav", "PCM_16", 44_100, 16), ("b.wav", "PCM_24", 48_000, 24),
    ("c.wav", "PCM_32", 96_000, 32), ("d.wav", "FLOAT", 48_000, 32),
    ("e.flac", "PCM_16", 44_100, 16), ("f.flac", "PCM_24", 96_000, 24),
    ("g.aiff", "PCM_16", 48_000, 16), ("h.aiff", "PCM_24", 44_100, 24),
])
def test_formats_depths_and_rates(write: Callable[..., Path], name: str, subtype: str,
                                  rate: int, bits: int) -> None:
    m = measure(str(write(sine(-20, 5, rate=rate), name, rate, subtype)))
    assert (m.sample_rate, m.bit_depth, m.channels) == (rate, bits, 2)
    assert m.duration_seconds == pytest.approx(5.0, abs=0.001)
    assert m.integrated_lufs == pytest.approx(-20.0, abs=0.1)
    assert m.sample_peak_dbfs == pytest.approx(-20.0, abs=0.05)
    assert m.file_format == name.rsplit(".", 1)[1].upper().replace("AIFF", "AIFF")


def test_mono(write: Callable[..., Path]) -> None:
    m = measure(str(write(sine(-20, 5, channels=1))))
    assert m.channels == 1 and m.stereo_correlation is None
    assert m.mono_loudness_drop_lu is None
    assert m.integrated_lufs == pytest.approx(-23.0, abs=0.1)  # one channel: 3 dB less


def test_seven_one_ignores_the_lfe(write: Callable[..., Path]) -> None:
    quiet = sine(-28, 5, channels=1)
    loud_lfe = sine(-6, 5, channels=1, freq=60)
    channels = [quiet, quiet, quiet, loud_lfe, quiet, quiet, quiet, quiet]
    silent_lfe = [quiet, quiet, quiet, np.zeros_like(quiet), quiet, quiet, quiet, quiet]
    a = measure(str(write(np.hstack(channels), "a.wav"))).integrated_lufs
    b = measure(str(write(np.hstack(silent_lfe), "b.wav"))).integrated_lufs
    assert a == b


def test_eight_bit_full_scale_counts_as_clipping(write: Callable[..., Path]) -> None:
    square = np.sign(np.sin(2 * np.pi * 50 * np.arange(RATE) / RATE))
    audio = np.stack([square, square], axis=1)
    u8 = measure(str(write(audio, "u8.wav", subtype="PCM_U8")))
    s16 = measure(str(write(audio, "s16.wav", subtype="PCM_16")))
    assert u8.clipped_samples == s16.clipped_samples > 0


def test_a_file_too_short_to_measure_is_not_called_silent(write: Callable[..., Path]) -> None:
    m = measure(str(write(sine(-5, 0.3))))
    assert m.integrated_lufs is None and m.sample_peak_dbfs == pytest.approx(-5, abs=0.05)
    notes = rule_notes(MixMetrics(**m.as_dict()), PROFILES["streaming"])
    assert "too short" in notes[0] and "silent" not in summarise(
        MixMetrics(**m.as_dict()), PROFILES["streaming"])


def test_five_one_ignores_the_lfe(write: Callable[..., Path]) -> None:
    quiet = sine(-28, 10, channels=1)
    loud_lfe = sine(-6, 10, channels=1, freq=60)
    base = [quiet, quiet, quiet, np.zeros_like(quiet), quiet, quiet]
    with_lfe = [quiet, quiet, quiet, loud_lfe, quiet, quiet]
    a = measure(str(write(np.hstack(base), "a.wav"))).integrated_lufs
    b = measure(str(write(np.hstack(with_lfe), "b.wav"))).integrated_lufs
    assert a == b and measure(str(write(np.hstack(with_lfe), "c.wav"))).channels == 6


def test_clipped_runs_are_counted_across_read_blocks(write: Callable[..., Path]) -> None:
    rate = 8000
    audio = np.zeros((int(rate * (READ_SECONDS + 2)), 2))
    audio[100:105, 0] = 1.0  # a run of 5
    audio[200:202, 0] = -1.0  # 2 in a row: a hot peak, not clipping
    boundary = int(rate * READ_SECONDS)
    audio[boundary - 2:boundary + 2, 1] = -1.0  # a run of 4 across the read boundary
    audio[-3:, 0] = 1.0  # a run of 3 at the very end
    m = measure(str(write(audio, rate=rate)))
    assert (m.clipped_samples, m.clipped_runs) == (12, 3)


def test_dc_offset_correlation_and_mono_fold(write: Callable[..., Path]) -> None:
    same = measure(str(write(sine(-20, 5) + 0.05, "dc.wav")))
    assert same.dc_offset == pytest.approx(0.05, abs=1e-4)
    assert same.stereo_correlation == pytest.approx(1.0, abs=0.01)
    assert same.mono_loudness_drop_lu == pytest.approx(0.0, abs=0.05)
    inverted = sine(-20, 5)
    inverted[:, 1] *= -1
    opposed = measure(str(write(inverted, "phase.wav")))
    assert opposed.stereo_correlation == pytest.approx(-1.0, abs=0.01)
    assert opposed.mono_loudness_drop_lu is None  # cancels completely
    rng = np.random.default_rng(3)
    wide = measure(str(write(rng.normal(0, 0.1, size=(RATE * 10, 2)), "wide.wav")))
    assert abs(wide.stereo_correlation) < 0.05
    assert wide.mono_loudness_drop_lu == pytest.approx(3.0, abs=0.2)


def test_silence(write: Callable[..., Path]) -> None:
    m = measure(str(write(np.zeros((RATE * 3, 2)))))
    assert m.integrated_lufs is None and m.true_peak_dbtp is None
    assert m.short_term_lufs == [None, None, None]
    assert m.stereo_correlation is None  # undefined, not 0 ("uncorrelated")
    one_sided = np.zeros((RATE * 3, 2))
    one_sided[:, 0] = sine(-20, 3)[:, 0]
    assert measure(str(write(one_sided))).stereo_correlation is None


def test_short_term_loudness_once_a_second(write: Callable[..., Path]) -> None:
    m = measure(str(write(np.vstack([sine(-30, 5), sine(-20, 5)]))))
    assert len(m.short_term_lufs) == 10
    assert m.short_term_lufs[3] == pytest.approx(-30, abs=0.1)  # 1-4 s
    assert m.short_term_lufs[9] == pytest.approx(-20, abs=0.1)  # 7-10 s


@pytest.mark.slow  # eleven minutes of audio, measured twice
def test_a_long_file_is_streamed_not_loaded(write: Callable[..., Path]) -> None:
    """Memory does not grow with the file: ten minutes peak like one minute."""
    rate = 8000

    def peak_bytes(minutes: int) -> int:
        audio = sine(-20, 60 * minutes, rate=rate, freq=440).astype(np.float32)
        path = write(audio, f"{minutes}.wav", rate=rate)
        del audio
        tracemalloc.start()
        try:
            m = measure(str(path))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert m.duration_seconds == 60 * minutes and len(m.short_term_lufs) == 60 * minutes
        return peak

    one, ten = peak_bytes(1), peak_bytes(10)
    decoded = rate * 600 * 2 * 8  # ten minutes as float64 stereo
    assert ten < one * 1.5 and ten < decoded / 5, (one, ten, decoded)


# -- notes --------------------------------------------------------------------------------------


def metrics(**changes: Any) -> MixMetrics:
    values: dict[str, Any] = dict(
        integrated_lufs=-14.2, loudness_range_lu=6.0, true_peak_dbtp=-1.5,
        sample_peak_dbfs=-1.8, clipped_samples=0, clipped_runs=0, dc_offset=0.0,
        stereo_correlation=0.6, mono_loudness_drop_lu=1.0, duration_seconds=215.0,
        sample_rate=48_000, channels=2, bit_depth=24, sample_format="PCM_24",
        file_format="WAV", short_term_lufs=[])
    values.update(changes)
    return MixMetrics(**values)


def test_a_loud_mix_gets_specific_notes() -> None:
    notes = rule_notes(metrics(integrated_lufs=-9.8, true_peak_dbtp=0.4), PROFILES["streaming"])
    # the peak over the ceiling is the fix; the loudness, turned down, only costs punch
    assert "True peak +0.4 dBTP exceeds the -1 dBTP ceiling and will clip after lossy " \
           "encoding" in notes[0]
    assert notes[1].startswith("Integrated -9.8 LUFS is 4.2 LU above the streaming")
    assert "Spotify turns it down 4.2 dB" in notes[1]
    summary = summarise(metrics(integrated_lufs=-9.8, true_peak_dbtp=0.4), PROFILES["streaming"])
    assert "4.2 LU above" in summary and "+0.4 dBTP" in summary and "3:35" in summary


def test_the_profile_changes_the_verdict() -> None:
    m = metrics(integrated_lufs=-22.6, true_peak_dbtp=-3.0)
    assert "within ±0.5 LU of the EBU R 128" in rule_notes(m, PROFILES["ebu_r128"])[0]
    assert "8.6 LU below the streaming" in rule_notes(m, PROFILES["streaming"])[0]


def test_problems_each_get_a_note() -> None:
    notes = " ".join(rule_notes(metrics(clipped_samples=40, clipped_runs=4, dc_offset=0.012,
                                        stereo_correlation=-0.4, mono_loudness_drop_lu=5.5,
                                        loudness_range_lu=1.2), PROFILES["streaming"]))
    for expected in ("40 samples sit at full scale in 4 flat runs", "DC offset of +1.20 %",
                     "stereo correlation -0.40", "loses 5.5 LU", "Loudness range 1.2 LU"):
        assert expected in notes


@pytest.mark.parametrize(("stage", "where"), [("mix", "on the mix bus"),
                                              ("master", "on the master")])
def test_a_dc_offset_is_removed_where_the_file_is_made(stage: str, where: str) -> None:
    dc = [n for n in rule_notes(metrics(dc_offset=0.012), PROFILES["streaming"], stage)
          if "DC offset" in n]
    assert dc == ["DC offset of +1.20 % of full scale: a high-pass filter (or a DC-removal "
                  f"plug-in) {where} would reclaim headroom."]


@pytest.mark.parametrize("correlation", [-0.19, -0.003, 0.0, 0.3])
def test_a_wide_mix_is_not_called_out_of_phase(correlation: float) -> None:
    notes = rule_notes(metrics(stereo_correlation=correlation), PROFILES["streaming"])
    assert not any("Stereo correlation" in note for note in notes), notes


# -- the agent ----------------------------------------------------------------------------------


def context(run_id: str = "run_test", settings: Settings | None = None) -> AgentContext:
    return AgentContext(run_id=run_id, attempt=1, agent="agentbox.review.agent:mix_review",
                        log=logging.LoggerAdapter(logging.getLogger("test"), {}),
                        settings=settings, services={Analysis: ANALYSIS})


def review(mix_url: str, profile: str | None = None, settings: Settings | None = None,
           stage: str | None = None) -> Any:
    payload: dict[str, Any] = {"project_id": "night-drive", "mix_url": mix_url}
    if profile:
        payload["profile"] = profile
    if stage:
        payload["stage"] = stage
    event = parse_event(encode(make_event(payload=payload)))
    return asyncio.run(mix_review(event, context(settings=settings)))


@pytest.mark.slow  # three analysis processes
def test_the_agent_reviews_a_file_by_path_or_file_url(write: Callable[..., Path]) -> None:
    path = write(sine(-10, 8))
    result = review(str(path), stage="master")
    assert result.metrics.integrated_lufs == pytest.approx(-10.0, abs=0.1)
    assert result.profile.name == "streaming" and result.notes_source == "rules"
    assert "4.0 LU above" in result.review_notes[0]
    by_url = review(path.as_uri(), profile="ebu_r128", stage="master")
    assert by_url.profile.target_lufs == -23 and by_url.metrics == result.metrics
    configured = review(str(path), settings=Settings().with_app(ReviewSettings(mix_profile="club")))
    assert configured.profile.name == "club"


@pytest.mark.parametrize(("mix_url", "code"), [
    ("https://example.com/mix.wav", "unsupported_mix_url"),
    ("s3://bucket/mix.wav", "unsupported_mix_url"),
    ("file://otherhost/mix.wav", "unsupported_mix_url"),
    ("/nonexistent/agentbox/mix.wav", "mix_not_found"),
])
def test_bad_mix_urls_fail_permanently(mix_url: str, code: str) -> None:
    with pytest.raises(PermanentAgentError) as failed:
        review(mix_url)
    assert failed.value.code == code


@pytest.mark.slow  # an analysis process
def test_an_unreadable_file_fails_permanently(tmp_path: Path) -> None:
    path = tmp_path / "mix.wav"
    path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really audio" * 10)
    os.utime(path, (OLD, OLD))
    with pytest.raises(PermanentAgentError) as failed:
        review(str(path))
    assert failed.value.code == "mix_unreadable"


def test_an_unknown_profile_is_refused_and_fails_permanently() -> None:
    with pytest.raises(InvalidEvent) as refused:  # the receiver's 422
        parse_event(encode(make_event(payload={"project_id": "p", "mix_url": "/m.wav",
                                               "profile": "vinyl"})))
    assert refused.value.errors[0]["loc"] == ["payload", "profile"]
    assert refused.value.errors[0]["type"] == "unknown_profile"
    with pytest.raises(PermanentAgentError) as failed:  # an event stored before it was
        choose_profile("vinyl")
    assert failed.value.code == "unknown_profile"


def test_a_file_still_being_written_is_retried(write: Callable[..., Path]) -> None:
    path = write(sine(-20, 1))
    os.utime(path)  # written just now, and again while the review waits for it to settle
    touch = threading.Timer(1.0, os.utime, (path,))
    touch.start()
    try:
        with pytest.raises(RetryableAgentError) as retried:
            review(str(path))
    finally:
        touch.cancel()
    assert retried.value.code == "mix_incomplete"


@pytest.mark.slow  # an analysis process
def test_a_file_sent_the_moment_it_was_written_is_reviewed_in_that_attempt(
        write: Callable[..., Path]) -> None:
    path = write(sine(-20, 1))
    os.utime(path)  # an export script sends as soon as the render ends
    started = time.monotonic()
    reviewed = review(str(path))  # no retry: the attempt waits out the settle time
    assert reviewed.metrics.duration_seconds == pytest.approx(1.0, abs=0.01)
    assert time.monotonic() - started >= 1.5


@pytest.mark.slow  # an analysis process, killed
def test_a_cancelled_analysis_stops_its_process(write: Callable[..., Path]) -> None:
    path = write(sine(-20, 600, rate=48_000).astype(np.float32), "long.wav")

    async def cancel_it() -> None:
        task = asyncio.create_task(ANALYSIS.run(str(path)))
        await asyncio.sleep(1.0)  # the analysis process is working
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert not [p for p in multiprocessing.active_children() if p.name == "agentbox-analysis"]


def test_a_slow_llm_falls_back_to_the_rules(monkeypatch: pytest.MonkeyPatch,
                                            llm: StandInLlm) -> None:
    monkeypatch.setattr(llm_module, "LLM_TIMEOUT_SECONDS", 0.5)
    llm.delay = 3.0
    started = time.monotonic()
    notes = asyncio.run(llm_module.llm_notes(
        llm_module.LlmSettings(llm.url, "stand-in", None), metrics(),
        PROFILES["streaming"], "p", context()))
    assert notes is None and time.monotonic() - started < 2.5


# -- end to end, with the optional LLM (a local stand-in: no real model runs here) ----------------


class StandInLlm:
    """A local stand-in for an OpenAI-compatible endpoint (the real one is a cloud
    service that cannot run here). It records requests; `fail` makes it answer 500."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.fail = False
        self.delay = 0.0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                time.sleep(stand_in.delay)
                if stand_in.fail or self.path != "/v1/chat/completions":
                    self.send_response(500)
                    self.end_headers()
                    return
                notes = ["The low end is tidy.", "Leave a little more headroom."]
                answer = json.dumps({"choices": [{"message": {
                    "role": "assistant", "content": json.dumps(notes)}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def llm() -> Iterator[StandInLlm]:
    stand_in = StandInLlm()
    yield stand_in
    stand_in.close()


def test_the_default_agent_reviews_a_mix_end_to_end(
        server_factory: Callable[..., Server], write: Callable[..., Path],
        llm: StandInLlm) -> None:
    path = write(np.clip(sine(-3, 6) * 1.6, -1, 1))  # loud and clipped
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_LLM_BASE_URL": llm.url,
                             "AGENTBOX_LLM_MODEL": "stand-in", "AGENTBOX_LLM_API_KEY": "k-123"
                             }).start()
    response = server.post(make_event(payload={"project_id": "night-drive",
                                               "mix_url": str(path)}))
    assert response.status_code == 202, response.text
    run = server.wait_terminal(response.json()["run_id"], timeout=60)
    assert run["status"] == "succeeded", run
    result = run["result"]
    assert result["notes_source"] == "llm"
    assert result["review_notes"] == ["The low end is tidy.", "Leave a little more headroom."]
    assert result["metrics"]["clipped_runs"] > 0 and result["metrics"]["channels"] == 2
    assert set(result["metrics"]) >= {
        "integrated_lufs", "loudness_range_lu", "true_peak_dbtp", "sample_peak_dbfs",
        "clipped_samples", "dc_offset", "stereo_correlation", "mono_loudness_drop_lu",
        "duration_seconds", "sample_rate", "channels", "short_term_lufs"}
    (headers, body), = llm.requests
    assert headers["idempotency-key"] == run["run_id"]
    assert headers["authorization"] == "Bearer k-123"
    assert body["model"] == "stand-in" and "integrated_lufs" in body["messages"][1]["content"]
    assert "k-123" not in server.log_path.read_text()
    page = server.client.get(f"/ui/runs/{run['run_id']}")
    assert page.status_code == 200 and 'id="loudness-plot"' in page.text
    assert "The low end is tidy." in page.text
    # the LLM failing never fails the run: the rule-based notes stand in
    llm.fail = True
    again = server.post(make_event(event_type="mix.review_requested", payload={
        "project_id": "night-drive", "mix_url": str(path), "profile": "club",
        "requested_by": "ana"}))
    run = server.wait_terminal(again.json()["run_id"], timeout=60)
    assert run["status"] == "succeeded"
    assert run["result"]["notes_source"] == "rules" and run["result"]["profile"]["name"] == "club"
    assert any("clipping" in note for note in run["result"]["review_notes"])


def test_a_model_slower_than_the_run_may_take_never_times_the_run_out(
        server_factory: Callable[..., Server], write: Callable[..., Path],
        llm: StandInLlm) -> None:
    # Under the LLM's own 30 s, over the run's 15 s. The run's time leaves room for a
    # first analysis at low priority on a busy machine (the process starts, then loads
    # numpy), which left a 6 s run no time to ask the model at all.
    llm.delay = 25.0
    path = write(sine(-14, 2))
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_LLM_BASE_URL": llm.url,
                             "AGENTBOX_LLM_MODEL": "stand-in",
                             "AGENTBOX_RUN_TIMEOUT_SECONDS": "15"}).start()
    response = server.post(make_event(payload={"project_id": "p", "mix_url": str(path)}))
    run = server.wait_terminal(response.json()["run_id"], timeout=60)
    assert run["status"] == "succeeded" and run["attempt"] == 1, run  # was: timeout, retried
    assert run["result"]["notes_source"] == "rules"
    assert len(llm.requests) == 1  # it was asked, and given up on in time


def test_an_agent_knows_its_time_left_on_the_loop_and_in_its_threads() -> None:
    ctx = context()
    assert ctx.time_left() is None  # no limit known
    ctx.deadline = time.monotonic() + 10

    async def agent() -> tuple[float | None, float | None]:
        return ctx.time_left(), await asyncio.to_thread(ctx.time_left)

    on_loop, in_thread = asyncio.run(agent())
    assert on_loop is not None and in_thread is not None
    assert 9 < in_thread <= on_loop <= 10


def test_the_run_page_shows_another_agents_result_named_like_a_review(
        server: Server) -> None:
    run_id = server.post(make_event(project_id="review-lookalike")).json()["run_id"]
    assert server.wait_terminal(run_id)["status"] == "succeeded"
    page = server.client.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200, page.text  # was a 500: drawn as a mix review
    assert "bpm" in page.text and 'id="loudness-plot"' not in page.text
    shown = subprocess.run([sys.executable, "-m", "agentbox", "show", run_id, "--url",
                            server.url], env=server.env, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr  # was a TypeError: printed as a review
    assert '"bpm": 120' in shown.stdout


def test_a_missing_mix_is_refused_and_one_gone_later_fails_permanently(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_WORKER_CONCURRENCY": "1"}
                            ).start()
    refused = server.post(make_event(payload={"project_id": "p",
                                              "mix_url": str(tmp_path / "gone.wav")}))
    assert refused.status_code == 422, refused.text  # at once: nothing stored
    assert refused.json()["errors"][0]["loc"] == ["payload", "mix_url"]
    # There when sent, gone before its review: the run says so, for good. (Written a
    # moment ago, the review gives it two seconds to settle: it is gone by then.)
    mix = tmp_path / "soon-gone.wav"
    soundfile.write(mix, np.zeros((RATE, 2)), RATE)
    response = server.post(make_event(payload={"project_id": "p", "mix_url": str(mix)}))
    assert response.status_code == 202, response.text
    mix.unlink()
    run = server.wait_terminal(response.json()["run_id"], timeout=60)
    assert (run["status"], run["error_code"], run["retry_count"]) == (
        "failed_permanent", "mix_not_found", 0)


def test_the_momentary_curve_holds_each_seconds_loudest_window(
        write: Callable[..., Path]) -> None:
    """A beat every half second: one 400 ms window taken at each second's end would
    fall on the same place of the beat every time (a curve a steady 2 LU under the
    short-term one, under its own maximum); the curve holds each second's loudest."""
    rate = 48000
    t = np.arange(rate * 12) / rate
    beat = np.where((t % 0.5) < 0.2, 0.5, 0.005) * np.sin(2 * np.pi * 440 * t)
    found = measure(str(write(np.stack([beat, beat], 1), "beat.wav", rate)))
    curve = [v for v in found.momentary_lufs if v is not None]
    assert found.momentary_max_lufs is not None
    assert max(curve) == pytest.approx(found.momentary_max_lufs, abs=0.05)
    assert min(curve[1:]) > found.momentary_max_lufs - 0.5  # every second has its beats
