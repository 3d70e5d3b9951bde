"""The one judge of a mix review: its summary, its notes (what to fix first,
first), its verdict, and what each delivery target would do to it.

The verdict is decided here and stored with the result; every reader (the page,
the CLI, the MCP server, desktop notifications) reads it through
agentbox.review.present and never works it out again. The rules are specific
and each note says what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agentbox.review.figures import length, places
from agentbox.review.model import (
    SEVERITIES,
    ClippingRange,
    Comparison,
    LoudnessCurve,
    MixMetrics,
    Note,
    ProfileView,
    ReferenceView,
    TargetView,
)
from agentbox.review.profiles import PROFILES, TARGETS, Profile, Target

# Stereo correlation near 0 is a wide or decorrelated mix (reverbs, doubled
# guitars, noise), not a fault; clearly below it, the sides cancel each other.
OUT_OF_PHASE_BELOW = -0.2


@dataclass(frozen=True)
class Judgement:
    summary: str
    notes: list[Note]  # what to fix first, first
    verdict: str  # pass, warn or fail
    targets: list[TargetView]  # what each delivery target would do to the mix


def judge(m: MixMetrics, p: Profile, comparison: Comparison | None = None,
          reference: ReferenceView | None = None) -> Judgement:
    """The review of measurements `m` against profile `p`: everything the verdict
    rests on, decided here once."""
    notes = notes_for(m, p, comparison, reference)
    return Judgement(summarise(m, p), notes, verdict_of(notes), delivery_targets(m))


# -- the measurements against the profile ------------------------------------------------------


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


def profile_of(view: ProfileView) -> Profile:
    """The profile a stored review was judged against: the one of its name, else
    one with its stored figures (a profile since renamed or removed)."""
    known = PROFILES.get(view.name)
    return known or Profile(view.name, view.title, view.target_lufs, view.tolerance_lu,
                            view.max_true_peak_dbtp)


def reference_curve(profile: Profile, bands: int) -> list[float]:
    """The profile's curve over the first `bands` octave bands, as shares of their
    total (as the mix's bands are)."""
    curve = profile.reference_curve[:bands]
    total = sum(10 ** (db / 10) for db in curve)
    return [round(db - 10 * math.log10(total), 1) for db in curve] if total else []


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
            f"{length(m.duration_seconds)} at {m.sample_rate} Hz.")


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
        where = f" (over 0 dBTP at {spans(overs)})" if overs else ""
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
        where = f" at {spans(clipped)}" if clipped else ""
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


def spans(ranges: list[ClippingRange]) -> str:
    """Where these ranges are, as the page's chart caption says it."""
    return places((r.start, r.end) for r in ranges)


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
