"""The built-in `mix_review` agent: it listens to the rendered mix and says what
a mastering engineer would say about its level, peaks and mono compatibility.

The measuring (agentbox.review.meter) runs in a process pool, so the event loop
and the receiver stay responsive while a long mix is analysed; the server
process itself never imports numpy or scipy. The notes are
rule-based and specific; when an OpenAI-compatible endpoint is configured
(AGENTBOX_LLM_BASE_URL, AGENTBOX_LLM_MODEL, AGENTBOX_LLM_API_KEY), the
metrics are also sent there for prose notes, and any failure falls back to
the rule-based ones: the LLM can never fail a run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
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
from agentbox.config import ConfigError, Settings
from agentbox.engine.agents import (
    AgentContext,
    AttemptGivenBack,
    PermanentAgentError,
    RetryableAgentError,
)
from agentbox.events import Event
from agentbox.review.digest import local_time
from agentbox.review.profiles import DEFAULT_PROFILE, PROFILES, TARGETS, Profile, Target

SETTLE_SECONDS = 2.0  # a file modified more recently may still be being written
# A file cut short and modified more recently than this may still be being written
# (a stalled renderer): the attempt waits for the rest, and measures it again when
# it comes; left unchanged this long, it is a broken render (failed for good).
TRUNCATED_RETRY_SECONDS = 60.0
TRUNCATED_POLL_SECONDS = 0.5  # how often a waiting attempt looks at the file
# Left of the run's own time limit when an attempt stops waiting for the rest of a
# cut-short render and hands it to a retry: enough to measure it once more.
TRUNCATED_RESERVE_SECONDS = 30.0
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


class ClippingRange(BaseModel):
    start: float  # seconds
    end: float
    kind: str = "clipping"  # "clipping": samples at full scale; "over": above 0 dBTP between


class OctaveBand(BaseModel):
    hz: float
    db: float  # the band's share of the mix's power
    reference_db: float | None = None  # the profile's reference curve


class LoudnessCurve(BaseModel):
    step_seconds: float
    momentary: list[float | None]
    short_term: list[float | None]


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
    momentary_max_lufs: float | None = None
    short_term_max_lufs: float | None = None
    plr_db: float | None = None
    mono: bool = False
    dual_mono: bool = False
    headroom_db: float | None = None  # the profile's ceiling minus the true peak
    low_end_correlation: float | None = None
    leading_silence_seconds: float = 0.0
    trailing_silence_seconds: float = 0.0
    clipping_ranges: list[ClippingRange] = []
    octave_bands: list[OctaveBand] = []
    loudness_curve: LoudnessCurve | None = None


class FileInfo(BaseModel):
    name: str
    format: str
    sample_rate: int
    bit_depth: int | None  # None for lossy formats
    channels: int
    duration_seconds: float
    frames_declared: int | None
    frames_read: int
    size_bytes: int | None = None  # the file's size as reviewed (None in older results)


class TargetView(BaseModel):
    name: str
    title: str
    integrated_target_lufs: float
    true_peak_max_dbtp: float
    gain_db: float | None  # what the platform's normalisation applies; None: silent
    result_true_peak_dbtp: float | None
    verdict: str
    note: str


class Comparison(BaseModel):
    previous_run_id: str | None  # None: the project's first export
    previous_accepted_at: str | None = None
    deltas: dict[str, float] = {}  # figure -> this export minus the previous one
    note: str = ""


class ReferenceView(BaseModel):
    file: str
    integrated_lufs: float | None = None
    true_peak_dbtp: float | None = None
    loudness_range_lu: float | None = None
    octave_bands: list[OctaveBand] = []
    deltas: dict[str, float] = {}  # figure -> the mix minus the reference
    note: str
    error: str | None = None


class Note(BaseModel):
    severity: str  # "fix", "consider" or "info"
    code: str
    text: str


class MixReview(BaseModel):
    project_id: str
    summary: str
    review_notes: list[str]
    profile: ProfileView
    metrics: MixMetrics
    notes_source: str  # "rules", or "llm" when the configured model wrote the notes
    mix_url: str
    verdict: str = "pass"  # "pass", "warn" or "fail" against the profile
    file: FileInfo | None = None
    targets: list[TargetView] = []
    comparison: Comparison = Comparison(previous_run_id=None)
    reference: ReferenceView | None = None
    notes: list[Note] = []  # the rule-based notes, in review_notes' order when "rules"


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
    measured, file = await measure_file(path, mix_url, ctx)
    metrics = with_profile(measured, profile)
    reference_url = getattr(payload, "reference_url", None)
    reference = None if not reference_url else await compare_with_reference(
        str(reference_url), metrics, profile, ctx)
    comparison = await compare_with_previous(ctx, project_id, metrics, profile)
    notes = notes_for(metrics, profile, comparison, reference)
    texts, source = [n.text for n in notes], "rules"
    llm = LlmSettings.from_settings(settings)
    if llm is not None:
        prose = await llm_notes(llm, metrics, profile, project_id, ctx)
        if prose:
            texts, source = prose, "llm"
    return MixReview(
        project_id=project_id,
        summary=summarise(metrics, profile),
        review_notes=texts,
        profile=ProfileView(**{k: v for k, v in profile.__dict__.items()
                               if k in ProfileView.model_fields}),
        metrics=metrics,
        notes_source=source,
        mix_url=mix_url,
        verdict=verdict_of(notes),
        file=file,
        targets=delivery_targets(metrics),
        comparison=comparison,
        reference=reference,
        notes=notes,
    )


async def measure_file(path: Path, url: str, ctx: AgentContext | None
                       ) -> tuple[dict[str, Any], FileInfo]:
    """The measurements of the file at `path`, or the agent error that says why not.

    A render cut short that was modified less than TRUNCATED_RETRY_SECONDS ago may
    be a renderer that stalled: the attempt waits for the rest and measures again,
    costing no retry, until the file has stayed as it is that long (failed for
    good). Waiting, it holds no analysis slot."""
    while True:
        await _settle(path)
        _check_settled(path)
        before = _stat(path)
        outcome = await analyse_in_process(str(path), None if ctx is None else ctx.cancelled)
        if outcome[0] != "error" or outcome[1] != "mix_truncated":
            break
        message = f"{url}: {outcome[2]}"
        if ctx is not None and _recently_changed(path, TRUNCATED_RETRY_SECONDS):
            ctx.log.info("the render was cut short; waiting for the rest of it")
        if not await _written_on(path, before, ctx, message):
            raise PermanentAgentError(message, "mix_truncated")
    if outcome[0] == "error":
        _, code, message = outcome
        if code == "mix_unreadable" and _recently_changed(path):
            raise RetryableAgentError(f"{url} is still being written", "mix_incomplete")
        raise PermanentAgentError(message, code)
    if _stat(path) != before:  # rewritten while we listened
        raise RetryableAgentError(f"{url} changed during the analysis", "mix_incomplete")
    raw: dict[str, Any] = outcome[1]
    file = FileInfo(name=path.name, format=raw["file_format"], sample_rate=raw["sample_rate"],
                    bit_depth=raw["bit_depth"], channels=raw["channels"],
                    duration_seconds=raw["duration_seconds"],
                    frames_declared=raw.get("frames_declared"),
                    frames_read=raw.get("frames_read", 0),
                    size_bytes=None if before is None else before[0])
    return raw, file


def with_profile(raw: dict[str, Any], profile: Profile) -> MixMetrics:
    """The measurements as the review's metrics: the reference curve beside each
    octave band, the unused headroom under the profile's ceiling, the curves."""
    metrics = MixMetrics(**raw)
    reference = reference_curve(profile, len(metrics.octave_bands))
    bands = [band.model_copy(update={"reference_db": ref})
             for band, ref in zip(metrics.octave_bands, reference, strict=False)]
    headroom = None if metrics.true_peak_dbtp is None else round(
        profile.max_true_peak_dbtp - metrics.true_peak_dbtp, 2)
    curve = LoudnessCurve(step_seconds=1.0, momentary=raw.get("momentary_lufs", []),
                          short_term=metrics.short_term_lufs)
    return metrics.model_copy(update={"octave_bands": bands, "headroom_db": headroom,
                                      "loudness_curve": curve})


def reference_curve(profile: Profile, bands: int) -> list[float]:
    """The profile's curve over the first `bands` octave bands, as shares of their
    total (as the mix's bands are)."""
    curve = profile.reference_curve[:bands]
    total = sum(10 ** (db / 10) for db in curve)
    return [round(db - 10 * math.log10(total), 1) for db in curve] if total else []


def analyse(path: str) -> tuple[Any, ...]:
    """Runs in an analysis process: ("ok", metrics) or ("error", code, message)."""
    from agentbox.review.meter import AudioError, measure

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


def _recently_changed(path: Path, seconds: float = SETTLE_SECONDS) -> bool:
    found = _stat(path)
    return found is not None and time.time() - found[1] / 1e9 < seconds


async def _written_on(path: Path, measured: tuple[int, int] | None,
                      ctx: AgentContext | None, message: str) -> bool:
    """Wait for a file measured cut short (as `measured`: size, mtime) to be written
    on: True once it was and has settled again (or is gone), False once it has been
    left as it is for TRUNCATED_RETRY_SECONDS. A server stopping gives the attempt
    back; a run whose time runs short hands the wait to its retry."""
    cancelled = None if ctx is None else ctx.cancelled
    while True:
        found = _stat(path)
        if found is None:
            return True  # measured again: it says the file is gone
        age = time.time() - found[1] / 1e9
        if found != measured and age >= SETTLE_SECONDS:
            return True
        if found == measured and age >= TRUNCATED_RETRY_SECONDS:
            return False
        left = None if ctx is None else ctx.time_left()
        if left is not None and left < TRUNCATED_RESERVE_SECONDS:
            raise RetryableAgentError(message, "mix_truncated")
        if cancelled is None:
            await asyncio.sleep(TRUNCATED_POLL_SECONDS)
            continue
        try:
            await asyncio.wait_for(cancelled.wait(), TRUNCATED_POLL_SECONDS)
        except TimeoutError:
            continue
        raise AttemptGivenBack("the server is stopping; the review waited for the rest "
                               "of a render cut short")


SETTLE_MARGIN_SECONDS = 0.05


async def _settle(path: Path) -> None:
    """A file written a moment ago (an export script sends as soon as the render ends)
    is given the rest of its settle time in this attempt, rather than costing one."""
    found = _stat(path)
    if found is not None:
        age = time.time() - found[1] / 1e9
        if 0 <= age < SETTLE_SECONDS:
            # A little past it: the loop's timer may fire a hair before the wall clock
            # reaches the settle time, and the check after this must find it passed.
            await asyncio.sleep(SETTLE_SECONDS - age + SETTLE_MARGIN_SECONDS)


def _check_settled(path: Path) -> None:
    if not path.exists():
        raise PermanentAgentError(f"no file at {path}", "mix_not_found")
    if not path.is_file() or not os.access(path, os.R_OK):
        raise PermanentAgentError(f"{path} is not a readable file", "mix_unreadable")
    if _recently_changed(path):
        raise RetryableAgentError(f"{path} was modified less than {SETTLE_SECONDS:g} s ago; "
                                  "it may still be being written", "mix_incomplete")


# -- analysis processes ------------------------------------------------------------------------
# At most AGENTBOX_ANALYSIS_PROCESSES analyses at once (default 1: beside a DAW, one
# core is the most a review should take), each in its own process ("spawn": no
# copy of the event loop's threads) at low priority, ignoring the terminal's
# Ctrl-C, with the numerical libraries single-threaded. A process stays warm
# between reviews (numpy and scipy loaded: importing them costs more than
# measuring a song) and exits by itself after WARM_SECONDS idle; waiting, it is
# blocked on its pipe and costs nothing. A run that times out or is cancelled
# kills its process, so no orphaned analysis keeps a CPU busy or a slot taken;
# one that dies is replaced at the next review.

WARM_SECONDS = 600.0  # an idle analysis process exits after this
REUSE_MARGIN_SECONDS = 30.0  # one about to exit is not handed a review
DEFAULT_ANALYSIS_PROCESSES = 1
SINGLE_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                           "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
BUSY_NAME, IDLE_NAME = "agentbox-analysis", "agentbox-analysis-idle"

_SLOTS: asyncio.Semaphore | None = None
_IDLE: list[_Worker] = []
_BUSY: set[_Worker] = set()


class _Worker:
    """One analysis process and the parent's end of its pipe. `ready` resolves when
    its imports are done (a thread waits for it, so that a run cancelled meanwhile
    leaves a process that is only starting to the next run)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe(duplex=True)
        self.process = context.Process(target=serve_analyses, args=(child_end,),
                                       daemon=True, name=IDLE_NAME)
        self.process.start()
        child_end.close()
        self.idle_since = time.monotonic()
        self.ready: concurrent.futures.Future[Any] = _waiters().submit(self.conn.recv)

    def fresh(self) -> bool:
        return self.process.is_alive() and (
            time.monotonic() - self.idle_since < WARM_SECONDS - REUSE_MARGIN_SECONDS)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(10)
        self.conn.close()


_WAITERS: concurrent.futures.ThreadPoolExecutor | None = None


def _waiters() -> concurrent.futures.ThreadPoolExecutor:
    global _WAITERS
    if _WAITERS is None:
        _WAITERS = concurrent.futures.ThreadPoolExecutor(
            thread_name_prefix="agentbox-analysis-start")
    return _WAITERS


def start_analysis_process() -> None:
    """Start an analysis process now, so that the first review finds it warm (the
    server calls this at start when the mix review is configured)."""
    if not _IDLE and not _BUSY:
        _IDLE.append(_Worker())


def analysis_processes() -> int:
    """AGENTBOX_ANALYSIS_PROCESSES, else DEFAULT_ANALYSIS_PROCESSES (1)."""
    raw = os.environ.get("AGENTBOX_ANALYSIS_PROCESSES", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError("AGENTBOX_ANALYSIS_PROCESSES must be a whole number, 1 or more")
        return int(raw)
    return DEFAULT_ANALYSIS_PROCESSES


def serve_analyses(conn: Any) -> None:
    """The analysis process: low priority, deaf to Ctrl-C and single-threaded
    before numpy loads; then one review per path sent, until the parent goes
    away or nothing comes for WARM_SECONDS."""
    from agentbox.portable import ignore_interrupts, lower_priority

    ignore_interrupts()
    lower_priority()
    for name in SINGLE_THREAD_VARIABLES:
        os.environ[name] = "1"
    import agentbox.review.meter  # noqa: F401 - loaded now, while no review waits
    try:
        conn.send(("ready",))
        while conn.poll(WARM_SECONDS):
            conn.send(analyse(conn.recv()))
    except (EOFError, OSError):
        pass  # the server went away
    finally:
        conn.close()


async def _take_slot(slots: asyncio.Semaphore, cancelled: asyncio.Event | None) -> None:
    """A slot, or AttemptGivenBack when the server stops first: a run that only
    waited has not started, and costs no retry."""
    if cancelled is None:
        await slots.acquire()
        return
    acquire = asyncio.ensure_future(slots.acquire())
    stopping = asyncio.ensure_future(cancelled.wait())
    try:
        await asyncio.wait({acquire, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not acquire.done():
            acquire.cancel()
    if acquire.cancelled() or not acquire.done():
        raise AttemptGivenBack("the server is stopping; the review had not started")
    if cancelled.is_set():
        slots.release()
        raise AttemptGivenBack("the server is stopping; the review had not started")


async def analyse_in_process(path: str, cancelled: asyncio.Event | None = None
                             ) -> tuple[Any, ...]:
    global _SLOTS
    if _SLOTS is None:
        _SLOTS = asyncio.Semaphore(analysis_processes())
    slots = _SLOTS
    loop = asyncio.get_running_loop()
    await _take_slot(slots, cancelled)
    try:
        worker = await _warm_worker(loop)
        worker.process.name = BUSY_NAME
        _BUSY.add(worker)
        answered = False
        try:
            worker.conn.send(path)
            result: tuple[Any, ...] = await loop.run_in_executor(None, worker.conn.recv)
            answered = True
            return result
        except (EOFError, OSError):  # the process died without an answer
            raise RetryableAgentError("the analysis process died",
                                      "analysis_crashed") from None
        finally:
            _BUSY.discard(worker)
            if answered and worker.process.is_alive():
                _idle(worker)
            else:  # cancelled or timed out (stop listening), or dead
                await loop.run_in_executor(None, worker.stop)
    finally:
        slots.release()


async def _warm_worker(loop: asyncio.AbstractEventLoop) -> _Worker:
    """An idle process that has loaded its libraries, started if there is none. A
    run cancelled while it starts leaves it starting, for the next run."""
    worker = None
    while _IDLE and worker is None:
        candidate = _IDLE.pop()
        if candidate.fresh():
            worker = candidate
        else:
            await loop.run_in_executor(None, candidate.stop)
    worker = worker or _Worker()
    try:
        await asyncio.shield(asyncio.wrap_future(worker.ready, loop=loop))
    except asyncio.CancelledError:
        _idle(worker)
        raise
    except (EOFError, OSError):
        await loop.run_in_executor(None, worker.stop)
        raise RetryableAgentError("the analysis process died while starting",
                                  "analysis_crashed") from None
    return worker


def _idle(worker: _Worker) -> None:
    worker.process.name = IDLE_NAME
    worker.idle_since = time.monotonic()
    _IDLE.append(worker)


def shutdown_analysis() -> None:
    """Stop every analysis process, busy or idle (the server calls this when it
    stops)."""
    workers = [*_BUSY, *_IDLE]
    _IDLE.clear()
    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()
    for worker in workers:
        worker.process.join(5)


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


SEVERITIES = ("fix", "consider", "info")  # what to fix first, first
LEADING_SILENCE_SECONDS = 1.0  # more than this before the music starts is worth trimming
TRAILING_SILENCE_SECONDS = 4.0
LOW_END_HZ = 120.0  # as agentbox.review.meter measures it (not imported here: it loads numpy)
LOW_END_CORRELATION_BELOW = 0.3  # bass this decorrelated thins out or vanishes in mono
TONAL_EXCESS_DB = 4.0  # an octave this far over the reference curve is a problem
TONAL_MIN_SECONDS = 10.0  # shorter files say little about tonal balance
LOW_OCTAVES_HZ = (63.0, 125.0)
HARSH_OCTAVES_HZ = (2000.0, 4000.0)


def rule_notes(m: MixMetrics, p: Profile) -> list[str]:
    """Specific observations, what to fix first first, each saying what to change."""
    return [note.text for note in notes_for(m, p)]


def notes_for(m: MixMetrics, p: Profile, comparison: Comparison | None = None,
              reference: ReferenceView | None = None) -> list[Note]:
    """The review's notes, ordered by severity (fix, consider, info) and, within
    one, by what to change first (loudness moves everything after it)."""
    if m.integrated_lufs is None and m.duration_seconds < 0.4:
        return [Note(severity="fix", code="too_short", text=(
            f"The file holds {m.duration_seconds:g} s of audio: too short for a loudness "
            "measurement (400 ms at least); check that the export rendered the whole "
            "song."))]
    if m.integrated_lufs is None:
        return [Note(severity="fix", code="silent", text=(
            "Nothing in the file rises above -70 LUFS: check that the export rendered "
            "the right tracks and was not muted."))]
    notes = [*_level_notes(m, p), *_fault_notes(m), *_stereo_notes(m), *_tonal_notes(m),
             *_edge_notes(m), *_format_notes(m)]
    if reference is not None:
        notes.append(Note(severity="info", code="reference", text=reference.note))
    if comparison is not None and comparison.previous_run_id is not None:
        notes.append(Note(severity="info", code="previous_export", text=comparison.note))
    return sorted(notes, key=lambda note: SEVERITIES.index(note.severity))


def verdict_of(notes: list[Note]) -> str:
    """fail: something to fix before release; warn: something to consider; pass."""
    severities = {note.severity for note in notes}
    return "fail" if "fix" in severities else "warn" if "consider" in severities else "pass"


def _level_notes(m: MixMetrics, p: Profile) -> list[Note]:
    assert m.integrated_lufs is not None
    notes = []
    delta = m.integrated_lufs - p.target_lufs
    off = "fix" if abs(delta) > 3 * p.tolerance_lu else "consider"
    if delta > p.tolerance_lu:
        notes.append(Note(severity=off, code="too_loud", text=(
            f"Integrated {m.integrated_lufs:.1f} LUFS is {delta:.1f} LU above the {p.title} "
            f"target of {p.target_lufs:g} LUFS: playback will turn it down by about "
            f"{delta:.1f} dB, so the extra loudness only costs dynamics; ease the limiter "
            f"by about {delta:.1f} dB.")))
    elif delta < -p.tolerance_lu:
        notes.append(Note(severity=off, code="too_quiet", text=(
            f"Integrated {m.integrated_lufs:.1f} LUFS is {-delta:.1f} LU below the {p.title} "
            f"target of {p.target_lufs:g} LUFS: it will play quieter than other material, or "
            f"be turned up into the limiter; raise the master by about {-delta:.1f} dB.")))
    else:
        notes.append(Note(severity="info", code="on_target", text=(
            f"Integrated {m.integrated_lufs:.1f} LUFS sits within ±{p.tolerance_lu:g} LU of "
            f"the {p.title} target ({p.target_lufs:g} LUFS).")))
    if m.true_peak_dbtp is not None and m.true_peak_dbtp > p.max_true_peak_dbtp:
        after = " and will clip after lossy encoding" if m.true_peak_dbtp > -0.5 else ""
        overs = [r for r in m.clipping_ranges if r.kind == "over"]
        where = f" (over 0 dBTP at {_ranges(overs)})" if overs else ""
        notes.append(Note(severity="fix", code="true_peak_over", text=(
            f"True peak {m.true_peak_dbtp:+.1f} dBTP exceeds the {p.max_true_peak_dbtp:g} dBTP "
            f"ceiling{after}{where}: lower the limiter's output ceiling by "
            f"{m.true_peak_dbtp - p.max_true_peak_dbtp:.1f} dB or enable its true-peak "
            "mode.")))
    elif delta < -p.tolerance_lu and m.headroom_db is not None and m.headroom_db >= 1.0:
        notes.append(Note(severity="consider", code="unused_headroom", text=(
            f"The mix peaks at {m.true_peak_dbtp:+.1f} dBTP: {m.headroom_db:.1f} dB of "
            f"headroom under the {p.max_true_peak_dbtp:g} dBTP ceiling is unused; raise the "
            f"master by up to {m.headroom_db:.1f} dB before any limiting.")))
    if m.loudness_range_lu is not None:
        if m.loudness_range_lu < 3 and m.duration_seconds >= 30:
            notes.append(Note(severity="consider", code="narrow_range", text=(
                f"Loudness range {m.loudness_range_lu:.1f} LU: very little movement "
                "between sections; consider letting verses breathe.")))
        elif m.loudness_range_lu > 15:
            notes.append(Note(severity="consider", code="wide_range", text=(
                f"Loudness range {m.loudness_range_lu:.1f} LU: quiet passages may get lost "
                "on phones and in cars; ride the quiet sections up or compress gently.")))
    if m.plr_db is not None and m.plr_db < 8 and m.duration_seconds >= 30:
        notes.append(Note(severity="consider", code="low_plr", text=(
            f"Peak-to-loudness ratio {m.plr_db:.1f} dB: the transients are squashed; "
            "less limiting would keep the punch.")))
    return notes


def _fault_notes(m: MixMetrics) -> list[Note]:
    notes = []
    if m.clipped_runs:
        clipped = [r for r in m.clipping_ranges if r.kind == "clipping"]
        where = f" at {_ranges(clipped)}" if clipped else ""
        notes.append(Note(severity="fix", code="clipping", text=(
            f"{m.clipped_samples} samples sit at full scale in {m.clipped_runs} runs of "
            f"{3}+ in a row{where}: that is audible clipping in the render, not just a hot "
            "peak; lower the master fader or the limiter's input there.")))
    if abs(m.dc_offset) >= 0.001:
        notes.append(Note(severity="consider", code="dc_offset", text=(
            f"DC offset of {m.dc_offset * 100:+.2f} % of full scale: a high-pass filter "
            "(or a DC-removal plug-in) on the master would reclaim headroom.")))
    return notes


def _stereo_notes(m: MixMetrics) -> list[Note]:
    notes = []
    if m.stereo_correlation is not None and m.stereo_correlation < OUT_OF_PHASE_BELOW:
        notes.append(Note(severity="fix", code="out_of_phase", text=(
            f"Stereo correlation {m.stereo_correlation:+.2f}: left and right are largely "
            "out of phase; check polarity on stereo sources.")))
    if m.channels == 2 and not m.dual_mono:
        if m.mono_loudness_drop_lu is None:
            notes.append(Note(severity="fix", code="mono_cancels", text=(
                "Folded to mono the mix cancels out entirely: one side is "
                "polarity-inverted; flip the polarity of one channel.")))
        elif m.mono_loudness_drop_lu > 3:
            notes.append(Note(severity="consider", code="mono_drop", text=(
                f"Folded to mono it loses {m.mono_loudness_drop_lu:.1f} LU: wide or phasey "
                "elements will vanish on mono speakers; narrow the widest ones.")))
    if m.low_end_correlation is not None and m.low_end_correlation < LOW_END_CORRELATION_BELOW:
        notes.append(Note(
            severity="fix" if m.low_end_correlation < 0 else "consider", code="low_end_wide",
            text=(f"Below {LOW_END_HZ:g} Hz left and right correlate at "
                  f"{m.low_end_correlation:+.2f}: the bass is wide or out of phase and thins "
                  "out in mono and on club systems; make the low end mono (a mid/side EQ or "
                  "a mono-maker below 120 Hz).")))
    if m.mono:
        notes.append(Note(severity="info", code="mono", text=(
            "The file is mono (one channel): fine for a mono master; if you meant a stereo "
            "mix, check the export's channel setting.")))
    elif m.dual_mono:
        notes.append(Note(severity="consider", code="dual_mono", text=(
            "Left and right are identical (dual mono): the mix has no stereo image; check "
            "that the export was not summed to mono, or deliver it as a mono file.")))
    return notes


def _tonal_notes(m: MixMetrics) -> list[Note]:
    if m.duration_seconds < TONAL_MIN_SECONDS:
        return []
    excess = {b.hz: b.db - b.reference_db for b in m.octave_bands if b.reference_db is not None}
    notes = []
    low = _worst(excess, LOW_OCTAVES_HZ)
    if low is not None and low[0] > TONAL_EXCESS_DB:
        notes.append(Note(severity="consider", code="low_end_buildup", text=(
            f"Low-end build-up: the {low[1]:g} Hz octave sits {low[0]:.1f} dB above the "
            "reference curve; cut 2-3 dB there (bass, kick) or high-pass the tracks that "
            "do not need it.")))
    harsh = _worst(excess, HARSH_OCTAVES_HZ)
    if harsh is not None and harsh[0] > TONAL_EXCESS_DB:
        notes.append(Note(severity="consider", code="harsh", text=(
            f"Harshness: the {harsh[1] / 1000:g} kHz octave sits {harsh[0]:.1f} dB above the "
            "reference curve; a gentle dip there (or de-essing vocals and cymbals) will "
            "tame it.")))
    return notes


def _worst(excess: dict[float, float], octaves: tuple[float, ...]
           ) -> tuple[float, float] | None:
    """The largest (excess over the reference, octave) among `octaves`."""
    found = [(excess[hz], hz) for hz in octaves if hz in excess]
    return max(found) if found else None


def _edge_notes(m: MixMetrics) -> list[Note]:
    notes = []
    if m.leading_silence_seconds > LEADING_SILENCE_SECONDS:
        notes.append(Note(severity="consider", code="leading_silence", text=(
            f"{m.leading_silence_seconds:.1f} s of silence before the music starts: trim the "
            "start of the export (players play it as a gap).")))
    if m.trailing_silence_seconds > TRAILING_SILENCE_SECONDS:
        notes.append(Note(severity="consider", code="trailing_silence", text=(
            f"{m.trailing_silence_seconds:.1f} s of silence at the end: shorten the render "
            "to the end of the reverb tail.")))
    return notes


def _format_notes(m: MixMetrics) -> list[Note]:
    notes = []
    if m.bit_depth is None:
        notes.append(Note(severity="consider", code="lossy", text=(
            f"A lossy {m.file_format} file: deliver a WAV, AIFF or FLAC master; the "
            "platforms encode it again, and peaks of a lossy file are not the master's.")))
    elif m.bit_depth < 16:
        notes.append(Note(severity="fix", code="low_bit_depth", text=(
            f"{m.bit_depth}-bit audio: export at 24-bit (or at least 16-bit, dithered).")))
    if m.sample_rate < 44_100:
        notes.append(Note(severity="fix", code="low_sample_rate", text=(
            f"{m.sample_rate} Hz sample rate: export at 44.1 kHz or 48 kHz; delivery "
            "platforms expect at least 44.1 kHz.")))
    return notes


def _ranges(ranges: list[ClippingRange], shown: int = 4) -> str:
    spans = [_clock(r.start) if r.end - r.start < 1 else f"{_clock(r.start)}-{_clock(r.end)}"
             for r in ranges[:shown]]
    more = f" and {len(ranges) - shown} more" if len(ranges) > shown else ""
    return ", ".join(spans) + more


def _clock(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}:{rest:02d}"


# -- every delivery target ----------------------------------------------------------------------


def delivery_targets(m: MixMetrics) -> list[TargetView]:
    """What each platform's loudness normalisation would do to this mix."""
    return [_target(m, target) for target in TARGETS]


def _target(m: MixMetrics, t: Target) -> TargetView:
    def view(gain: float | None, peak: float | None, verdict: str, note: str) -> TargetView:
        return TargetView(name=t.name, title=t.title, integrated_target_lufs=t.integrated_lufs,
                          true_peak_max_dbtp=t.true_peak_max_dbtp, gain_db=gain,
                          result_true_peak_dbtp=peak, verdict=verdict, note=note)

    if m.integrated_lufs is None or m.true_peak_dbtp is None:
        return view(None, None, "fail", "nothing to normalise: the file is silent or too short")
    wanted = t.integrated_lufs - m.integrated_lufs
    gain = {"none": 0.0, "both": wanted}.get(
        t.normalisation, min(wanted, max(0.0, t.true_peak_max_dbtp - m.true_peak_dbtp)))
    peak = m.true_peak_dbtp + gain
    short = wanted - gain  # what normalisation leaves between the mix and the target
    if t.normalisation == "none":
        side = "above" if wanted < 0 else "below"
        note = (f"no normalisation: plays as it is, {abs(wanted):.1f} LU {side} the "
                f"{t.integrated_lufs:g} LUFS typical of the format")
    elif gain < 0:
        note = f"turned down {-gain:.1f} dB"
    elif short > 0.05:
        note = (f"turned up only {gain:.1f} dB (to the {t.true_peak_max_dbtp:g} dBTP "
                f"true-peak limit): plays {short:.1f} dB quieter than the target")
    else:
        note = f"turned up {gain:.1f} dB"
    if peak > t.true_peak_max_dbtp + 0.05:
        verdict = "fail"
        note += (f"; true peak {peak:+.1f} dBTP after, over the {t.true_peak_max_dbtp:g} dBTP "
                 "ceiling: lower the limiter's ceiling")
    elif abs(short) > t.tolerance_lu or gain < -3 * t.tolerance_lu:
        verdict = "warn"
        if gain < -3 * t.tolerance_lu:
            note += ": the extra loudness only costs dynamics"
    else:
        verdict = "pass"
    return view(round(gain, 1), round(peak, 1), verdict, note)


# -- the previous export and the reference track ------------------------------------------------

HEADLINE = ("integrated_lufs", "true_peak_dbtp", "loudness_range_lu", "sample_peak_dbfs",
            "plr_db", "momentary_max_lufs", "short_term_max_lufs", "stereo_correlation",
            "low_end_correlation", "mono_loudness_drop_lu", "clipped_samples",
            "duration_seconds")


def deltas(new: MixMetrics, old: MixMetrics) -> dict[str, float]:
    """figure -> new minus old, for the headline figures both have."""
    found = {}
    for name in HEADLINE:
        a, b = getattr(new, name), getattr(old, name)
        if a is not None and b is not None:
            found[name] = round(float(a) - float(b), 2)
    return found


async def compare_with_previous(ctx: AgentContext, project: str, m: MixMetrics,
                                p: Profile) -> Comparison:
    first = Comparison(previous_run_id=None, note=(
        "The first export of this project: later exports will be compared with it."))
    if ctx.previous_export is None or not project:
        return first
    try:
        previous = await ctx.previous_export(project)
    except Exception:  # the comparison is a bonus: never fail the review for it
        ctx.log.warning("the previous export could not be read", exc_info=True)
        return first.model_copy(update={"note": "The previous export could not be read."})
    old = None if previous is None else as_review(previous.result)
    if previous is None or old is None:
        return first
    changes = deltas(m, old.metrics)
    return Comparison(previous_run_id=previous.run_id,
                      previous_accepted_at=previous.accepted_at, deltas=changes,
                      note=_comparison_note(changes, m, old.metrics, p, previous.accepted_at))


def _comparison_note(changes: dict[str, float], new: MixMetrics, old: MixMetrics,
                     p: Profile, accepted_at: str) -> str:
    when = f"the {local_time(accepted_at)} export"
    loudness = changes.get("integrated_lufs")
    if loudness is None:
        parts = [f"Compared with {when}"]
    elif abs(loudness) < 0.1:
        parts = [f"As loud as {when}"]
    else:
        parts = [f"{abs(loudness):.1f} LU {'louder' if loudness > 0 else 'quieter'} than {when}"]
    ceiling = p.max_true_peak_dbtp
    over_now = new.true_peak_dbtp is not None and new.true_peak_dbtp > ceiling
    over_then = old.true_peak_dbtp is not None and old.true_peak_dbtp > ceiling
    if over_now and not over_then:
        parts.append("true peak now over the ceiling")
    elif over_then and not over_now:
        parts.append("true peak now under the ceiling")
    elif abs(changes.get("true_peak_dbtp", 0.0)) >= 0.5:
        parts.append(f"true peak {changes['true_peak_dbtp']:+.1f} dB")
    if abs(changes.get("loudness_range_lu", 0.0)) >= 1.0:
        parts.append(f"loudness range {changes['loudness_range_lu']:+.1f} LU")
    if new.clipped_runs and not old.clipped_runs:
        parts.append("clipping is new")
    elif old.clipped_runs and not new.clipped_runs:
        parts.append("the clipping is gone")
    if abs(changes.get("duration_seconds", 0.0)) >= 1.0:
        longer = changes["duration_seconds"]
        parts.append(f"{abs(longer):.1f} s {'longer' if longer > 0 else 'shorter'}")
    return "; ".join(parts) + "."


async def compare_with_reference(url: str, m: MixMetrics, p: Profile,
                                 ctx: AgentContext) -> ReferenceView:
    """The reference track's loudness and tonal balance beside the mix's. A reference
    that cannot be read is said so in the review; it never fails the review."""
    try:
        path = local_path(url)
        raw, file = await measure_file(path, url, ctx)
    except (PermanentAgentError, RetryableAgentError) as exc:
        return ReferenceView(file=Path(urlsplit(url).path).name or url, error=str(exc),
                             note=f"The reference track could not be measured: {exc}")
    ref = with_profile(raw, p)
    changes = {name: round(float(a) - float(b), 2) for name in
               ("integrated_lufs", "true_peak_dbtp", "loudness_range_lu")
               if (a := getattr(m, name)) is not None and (b := getattr(ref, name)) is not None}
    theirs = {band.hz: band.db for band in ref.octave_bands}
    for band in m.octave_bands:
        if band.hz in theirs:
            changes[f"band_{band.hz:g}_hz_db"] = round(band.db - theirs[band.hz], 1)
    return ReferenceView(file=file.name, integrated_lufs=ref.integrated_lufs,
                         true_peak_dbtp=ref.true_peak_dbtp,
                         loudness_range_lu=ref.loudness_range_lu,
                         octave_bands=ref.octave_bands, deltas=changes,
                         note=_reference_note(changes, file.name))


def _reference_note(changes: dict[str, float], name: str) -> str:
    loudness = changes.get("integrated_lufs")
    parts = [f"Against the reference {name}:" if loudness is None else
             f"{abs(loudness):.1f} LU {'louder' if loudness > 0 else 'quieter'} than the "
             f"reference {name}" if abs(loudness) >= 0.1 else f"As loud as the reference {name}"]
    bands = [(value, key) for key, value in changes.items() if key.startswith("band_")]
    if bands:
        value, key = max(bands, key=lambda item: abs(item[0]))
        hz = float(key.split("_")[1])
        where = f"{hz / 1000:g} kHz" if hz >= 1000 else f"{hz:g} Hz"
        if abs(value) >= 3:
            parts.append(f"{abs(value):.1f} dB {'more' if value > 0 else 'less'} around {where} "
                         "than the reference (share of the whole mix)")
        else:
            parts.append("tonal balance within 3 dB of it in every octave")
    return "; ".join(parts) + "."


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
