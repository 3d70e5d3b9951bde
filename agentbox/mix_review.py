"""The built-in `mix_review` agent: it listens to the rendered mix and says what
a mastering engineer would say about its level, peaks and mono compatibility.

The measuring (agentbox.loudness) runs in a process pool, so the event loop
and the receiver stay responsive while a long mix is analysed; the server
process itself never imports numpy or scipy. The notes are
rule-based and specific; when an OpenAI-compatible endpoint is configured
(AGENTBOX_LLM_BASE_URL, AGENTBOX_LLM_MODEL, AGENTBOX_LLM_API_KEY), the
metrics are also sent there for prose notes, and any failure falls back to
the rule-based ones: the LLM can never fail a run.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from agentbox import portable
from agentbox.agents import AgentContext, PermanentAgentError, RetryableAgentError
from agentbox.config import ConfigError, Settings
from agentbox.events import Event
from agentbox.profiles import DEFAULT_PROFILE, PROFILES, Profile

SETTLE_SECONDS = 2.0  # a file modified more recently may still be being written
LLM_TIMEOUT_SECONDS = 30.0  # the whole call, at most
# Left of the run's own time limit after the call, to finish the review: the call
# is cut shorter when the run has less, so a slow model never times the run out.
LLM_RESERVE_SECONDS = 1.0
# Stereo correlation near 0 is a wide or decorrelated mix (reverbs, doubled
# guitars, noise), not a fault; clearly below it, the sides cancel each other.
OUT_OF_PHASE_BELOW = -0.2
LLM_MAX_ANSWER_BYTES = 1 << 20


class ProfileView(BaseModel):
    name: str
    title: str
    target_lufs: float
    tolerance_lu: float
    max_true_peak_dbtp: float


class MixMetrics(BaseModel):
    integrated_lufs: float | None
    loudness_range_lu: float | None
    true_peak_dbtp: float | None
    sample_peak_dbfs: float | None
    clipped_samples: int
    clipped_runs: int
    dc_offset: float
    stereo_correlation: float | None
    mono_loudness_drop_lu: float | None
    duration_seconds: float
    sample_rate: int
    channels: int
    bit_depth: int | None
    sample_format: str
    file_format: str
    short_term_lufs: list[float | None]


class MixReview(BaseModel):
    project_id: str
    summary: str
    review_notes: list[str]
    profile: ProfileView
    metrics: MixMetrics
    notes_source: str  # "rules", or "llm" when the configured model wrote the notes
    mix_url: str


def as_review(result: Any) -> MixReview | None:
    """A stored result as a mix review, if it is one: another agent's result may use
    the same key names (and a review is drawn from its fields, so they must hold)."""
    if not (isinstance(result, dict) and "metrics" in result and "profile" in result):
        return None
    try:
        return MixReview.model_validate(result)
    except ValidationError:
        return None


# -- the agent ----------------------------------------------------------------------------


async def mix_review(event: Event, ctx: AgentContext) -> MixReview:
    """Measure the mix named by the event and review it against its profile."""
    payload = event.payload
    project_id = str(getattr(payload, "project_id", ""))
    mix_url = str(getattr(payload, "mix_url", ""))
    settings = ctx.settings
    profile = choose_profile(getattr(payload, "profile", None)
                             or (settings.mix_profile if settings else None))
    path = local_path(mix_url)
    _check_settled(path)
    before = _stat(path)
    outcome = await analyse_in_process(str(path))
    if outcome[0] == "error":
        _, code, message = outcome
        if code == "mix_unreadable" and _recently_changed(path):
            raise RetryableAgentError(f"{mix_url} is still being written", "mix_incomplete")
        raise PermanentAgentError(message, code)
    measured = MixMetrics(**outcome[1])
    if _stat(path) != before:  # rewritten while we listened
        raise RetryableAgentError(f"{mix_url} changed during the analysis", "mix_incomplete")
    notes, source = rule_notes(measured, profile), "rules"
    llm = LlmSettings.from_settings(settings)
    if llm is not None:
        prose = await llm_notes(llm, measured, profile, project_id, ctx)
        if prose:
            notes, source = prose, "llm"
    return MixReview(
        project_id=project_id,
        summary=summarise(measured, profile),
        review_notes=notes,
        profile=ProfileView(**profile.__dict__),
        metrics=measured,
        notes_source=source,
        mix_url=mix_url,
    )


def analyse(path: str) -> tuple[Any, ...]:
    """Runs in an analysis process: ("ok", metrics) or ("error", code, message)."""
    from agentbox.loudness import AudioError, measure

    try:
        return ("ok", measure(path).as_dict())
    except AudioError as exc:
        return ("error", exc.code, exc.message)


def choose_profile(name: str | None) -> Profile:
    """The event's profile, else AGENTBOX_MIX_PROFILE, else streaming."""
    chosen = name or DEFAULT_PROFILE
    profile = PROFILES.get(chosen)
    if profile is None:
        raise PermanentAgentError(f"unknown profile {chosen!r}; use one of "
                                  f"{', '.join(PROFILES)}", "unknown_profile")
    return profile


def local_path(mix_url: str) -> Path:
    """A local path or file:// URL as a path; anything else is refused."""
    parts = urlsplit(mix_url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise PermanentAgentError("file:// URLs must name a local file "
                                      "(file:///path)", "unsupported_mix_url")
        try:
            return Path(portable.path_from_url(parts.path))
        except OSError:  # Windows: a path no drive or share can name
            raise PermanentAgentError(f"{mix_url} names no local file",
                                      "unsupported_mix_url") from None
    if parts.scheme and len(parts.scheme) > 1:  # one letter is a Windows drive
        raise PermanentAgentError(f"mix_url must be a local path or file:// URL, not "
                                  f"{parts.scheme}:", "unsupported_mix_url")
    return Path(mix_url).expanduser()


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_size, found.st_mtime_ns


def _recently_changed(path: Path) -> bool:
    found = _stat(path)
    return found is not None and time.time() - found[1] / 1e9 < SETTLE_SECONDS


def _check_settled(path: Path) -> None:
    if not path.exists():
        raise PermanentAgentError(f"no file at {path}", "mix_not_found")
    if not path.is_file() or not os.access(path, os.R_OK):
        raise PermanentAgentError(f"{path} is not a readable file", "mix_unreadable")
    if _recently_changed(path):
        raise RetryableAgentError(f"{path} was modified less than {SETTLE_SECONDS:g} s ago; "
                                  "it may still be being written", "mix_incomplete")


# -- analysis processes ------------------------------------------------------------------------
# One process per analysis ("spawn": no copy of the event loop's threads), at most
# AGENTBOX_ANALYSIS_PROCESSES at once. A run that times out or is cancelled kills
# its process, so no orphaned analysis keeps a CPU busy or a slot taken.

_SLOTS: asyncio.Semaphore | None = None
_RUNNING: set[multiprocessing.process.BaseProcess] = set()


def analysis_processes() -> int:
    """AGENTBOX_ANALYSIS_PROCESSES, else CPUs - 1 (at least 1)."""
    raw = os.environ.get("AGENTBOX_ANALYSIS_PROCESSES", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError("AGENTBOX_ANALYSIS_PROCESSES must be a whole number, 1 or more")
        return int(raw)
    return max(1, (os.cpu_count() or 2) - 1)


def _child(path: str, conn: Any) -> None:
    try:
        conn.send(analyse(path))
    finally:
        conn.close()


async def analyse_in_process(path: str) -> tuple[Any, ...]:
    global _SLOTS
    if _SLOTS is None:
        _SLOTS = asyncio.Semaphore(analysis_processes())
    loop = asyncio.get_running_loop()
    context = multiprocessing.get_context("spawn")
    async with _SLOTS:
        receiving, sending = context.Pipe(duplex=False)
        process = context.Process(target=_child, args=(path, sending), daemon=True,
                                  name="agentbox-analysis")
        process.start()
        sending.close()
        _RUNNING.add(process)
        try:
            result: tuple[Any, ...] = await loop.run_in_executor(None, receiving.recv)
            return result
        except EOFError:  # the process died without an answer
            raise RetryableAgentError("the analysis process died",
                                      "analysis_crashed") from None
        finally:
            if process.is_alive():
                process.terminate()  # cancelled or timed out: stop listening
            await loop.run_in_executor(None, process.join, 10)
            _RUNNING.discard(process)
            receiving.close()


def shutdown_analysis() -> None:
    """Stop every running analysis (the server calls this when it stops)."""
    for process in list(_RUNNING):
        if process.is_alive():
            process.terminate()


# -- the notes --------------------------------------------------------------------------------


def summarise(m: MixMetrics, profile: Profile) -> str:
    if m.integrated_lufs is None and m.duration_seconds < 0.4:
        return f"Too short to measure: {m.duration_seconds:g} s (loudness needs 0.4 s)."
    if m.integrated_lufs is None:
        return f"The mix is silent ({m.duration_seconds:g} s of nothing above -70 LUFS)."
    delta = m.integrated_lufs - profile.target_lufs
    if abs(delta) <= profile.tolerance_lu:
        level = f"on target for {profile.title}"
    else:
        side = "above" if delta > 0 else "below"
        level = f"{abs(delta):.1f} LU {side} the {profile.title} target"
    peak = ("" if m.true_peak_dbtp is None or m.true_peak_dbtp <= profile.max_true_peak_dbtp
            else f", true peak {m.true_peak_dbtp:+.1f} dBTP over the {profile.max_true_peak_dbtp:g}"
                 " dBTP ceiling")
    return (f"Integrated {m.integrated_lufs:.1f} LUFS, {level}{peak}; "
            f"{_duration(m.duration_seconds)} at {m.sample_rate} Hz.")


def rule_notes(m: MixMetrics, p: Profile) -> list[str]:
    """Specific, numbered observations, most important first."""
    notes: list[str] = []
    if m.integrated_lufs is None and m.duration_seconds < 0.4:
        return [f"The file holds {m.duration_seconds:g} s of audio: too short for a loudness "
                "measurement (400 ms at least); check that the export rendered the whole "
                "song."]
    if m.integrated_lufs is None:
        return ["Nothing in the file rises above -70 LUFS: check that the export rendered "
                "the right tracks and was not muted."]
    delta = m.integrated_lufs - p.target_lufs
    if delta > p.tolerance_lu:
        notes.append(
            f"Integrated {m.integrated_lufs:.1f} LUFS is {delta:.1f} LU above the {p.title} "
            f"target of {p.target_lufs:g} LUFS: playback will turn it down by about "
            f"{delta:.1f} dB, so the extra loudness only costs dynamics.")
    elif delta < -p.tolerance_lu:
        notes.append(
            f"Integrated {m.integrated_lufs:.1f} LUFS is {-delta:.1f} LU below the {p.title} "
            f"target of {p.target_lufs:g} LUFS: it will play quieter than other material, or "
            f"be turned up into the limiter.")
    else:
        notes.append(f"Integrated {m.integrated_lufs:.1f} LUFS sits within "
                     f"±{p.tolerance_lu:g} LU of the {p.title} target ({p.target_lufs:g} LUFS).")
    if m.true_peak_dbtp is not None and m.true_peak_dbtp > p.max_true_peak_dbtp:
        after = " and will clip after lossy encoding" if m.true_peak_dbtp > -0.5 else ""
        notes.append(
            f"True peak {m.true_peak_dbtp:+.1f} dBTP exceeds the {p.max_true_peak_dbtp:g} dBTP "
            f"ceiling{after}: lower the limiter's output ceiling by "
            f"{m.true_peak_dbtp - p.max_true_peak_dbtp:.1f} dB or enable its true-peak mode.")
    if m.clipped_runs:
        notes.append(
            f"{m.clipped_samples} samples sit at full scale in {m.clipped_runs} runs of "
            f"{3}+ in a row: that is audible clipping in the render, not just a hot peak.")
    if m.loudness_range_lu is not None:
        if m.loudness_range_lu < 3 and m.duration_seconds >= 30:
            notes.append(f"Loudness range {m.loudness_range_lu:.1f} LU: very little movement "
                         "between sections; consider letting verses breathe.")
        elif m.loudness_range_lu > 15:
            notes.append(f"Loudness range {m.loudness_range_lu:.1f} LU: quiet passages may "
                         "get lost on phones and in cars.")
    if abs(m.dc_offset) >= 0.001:
        notes.append(f"DC offset of {m.dc_offset * 100:+.2f} % of full scale: a high-pass "
                     "filter (or a DC-removal plug-in) on the master would reclaim headroom.")
    if m.stereo_correlation is not None and m.stereo_correlation < OUT_OF_PHASE_BELOW:
        notes.append(f"Stereo correlation {m.stereo_correlation:+.2f}: left and right are "
                     "largely out of phase; check polarity on stereo sources.")
    if m.channels == 2:
        if m.mono_loudness_drop_lu is None:
            notes.append("Folded to mono the mix cancels out entirely: one side is "
                         "polarity-inverted.")
        elif m.mono_loudness_drop_lu > 3:
            notes.append(f"Folded to mono it loses {m.mono_loudness_drop_lu:.1f} LU: wide or "
                         "phasey elements will vanish on mono speakers.")
    return notes


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}" if minutes else f"{seconds:.1f} s"


# -- optional LLM notes -----------------------------------------------------------------------


@dataclass(frozen=True)
class LlmSettings:
    base_url: str
    model: str
    api_key: str | None

    @classmethod
    def from_settings(cls, settings: Settings | None) -> LlmSettings | None:
        """AGENTBOX_LLM_BASE_URL and _MODEL from the configuration; the key only ever
        from the environment (AGENTBOX_LLM_API_KEY)."""
        if settings is None or not settings.llm_base_url or not settings.llm_model:
            return None
        return cls(settings.llm_base_url.rstrip("/"), settings.llm_model,
                   os.environ.get("AGENTBOX_LLM_API_KEY"))


async def llm_notes(llm: LlmSettings, m: MixMetrics, profile: Profile, project_id: str,
                    ctx: AgentContext) -> list[str] | None:
    """Prose notes from an OpenAI-compatible chat endpoint, or None on any failure."""
    metrics = m.model_dump(exclude={"short_term_lufs"})
    request = {
        "model": llm.model,
        "messages": [
            {"role": "system", "content": (
                "You are a mastering engineer. Write 3 to 6 short, specific review notes "
                "about this mix from its measurements. Answer with a JSON array of strings.")},
            {"role": "user", "content": json.dumps(
                {"project_id": project_id, "profile": profile.__dict__, "metrics": metrics})},
        ],
    }
    headers = {"Idempotency-Key": ctx.run_id}  # a retried run asks the same question once
    if llm.api_key:
        headers["Authorization"] = f"Bearer {llm.api_key}"
    left = ctx.time_left()
    budget = LLM_TIMEOUT_SECONDS if left is None else min(LLM_TIMEOUT_SECONDS,
                                                          left - LLM_RESERVE_SECONDS)
    if budget <= 0:
        ctx.log.warning("no time left for LLM notes; using the rule-based notes")
        return None
    try:
        async with asyncio.timeout(budget), httpx.AsyncClient(
                timeout=budget, trust_env=False) as client, client.stream(
                "POST", f"{llm.base_url}/chat/completions", json=request,
                headers=headers) as response:
            response.raise_for_status()
            answer = bytearray()
            async for chunk in response.aiter_bytes():
                answer += chunk
                if len(answer) > LLM_MAX_ANSWER_BYTES:
                    raise ValueError("the answer is too large")
        content = json.loads(answer)["choices"][0]["message"]["content"]
        notes = json.loads(content)
        if not isinstance(notes, list) or not notes or not all(
                isinstance(n, str) and n.strip() for n in notes):
            raise ValueError("not a list of notes")
        return [n.strip()[:1000] for n in notes[:10]]
    except Exception as exc:  # the LLM is optional: never let it fail the run
        ctx.log.warning("LLM notes unavailable; using the rule-based notes",
                        extra={"error": type(exc).__name__})
        return None
