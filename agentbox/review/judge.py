"""The one judge of a mix review: its summary, its notes (what to fix first,
first), its verdict, and what each delivery target would do with the file.

The verdict is decided here and stored with the result; every reader (the page,
the CLI, the MCP server, desktop notifications) reads it through
agentbox.review.present and never works it out again. Each note says what to
change.

A file is judged for its stage (agentbox.review.stage). A mix, on its way to
mastering, is judged on what a mastering engineer asks for: headroom, no
clipping, no limiter squashing it, no DC, mono compatibility and a mono low end,
a lossless file at the session's resolution, nothing cut off at either end; its
loudness is information, and the delivery targets say what mastering would have
to do, not a verdict. A master is judged against its profile's delivery target,
and every delivery target says what its platform does with the file
(agentbox.review.delivery, which also holds the one rule for a target's verdict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentbox.review import tonal
from agentbox.review.delivery import (
    SEVERITY_OF,
    delivery_targets,
    loudness_verdict,
    over_ceiling,
    quiet_by_choice,
    raise_it,
)
from agentbox.review.figures import fixed, length, places, rounded, tenths
from agentbox.review.genres import Genre
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
from agentbox.review.profiles import (
    CURVE_NAMES,
    DELIVER,
    DOWN_ONLY,
    PROFILES,
    TARGETS_BY_NAME,
    UP_TO_PEAK,
    Profile,
    Target,
)
from agentbox.review.stage import StageName
from agentbox.review.tonal import TonalReference

# Stereo correlation near 0 is a wide or decorrelated mix (reverbs, doubled
# guitars, noise), not a fault; clearly below it, the sides cancel each other.
OUT_OF_PHASE_BELOW = -0.2
LEADING_SILENCE_SECONDS = 1.0  # more than this before a master starts is worth trimming
TRAILING_SILENCE_SECONDS = 4.0
LOW_END_HZ = 120.0  # as agentbox.review.meter measures it (not imported here: it loads numpy)
LOW_END_CORRELATION_BELOW = 0.3  # bass this decorrelated thins out or vanishes in mono
# An edge (the first or last 100 ms) within this of the song's loudness is music
# still playing: the render starts or stops in the middle of it.
CUT_EDGE_LU = 15.0
# A start is cut only when the sound is there from the first sample: its first
# millisecond within this of the first 100 ms. A render that starts on its first
# note rises from silence (an attack), 20 dB and more under it in that millisecond.
CUT_ONSET_DB = 10.0
# Clipping a listener hears: flat tops longer than a lossy file's overs leave when
# decoded to fixed point (3-5 samples), or many of them. A few short ones are the
# limiter's ceiling set too high, not a clipped render.
AUDIBLE_RUN_SAMPLES = 6
AUDIBLE_RUNS = 20
# Flat runs under a true peak this far over full scale were cut from a signal driven
# past it (a render's float peak), not left by a lossy decode's small overs.
DRIVEN_PAST_DBTP = 1.5
DC_OFFSET_NOTED = 0.005  # an offset held through the file, 0.5 % of full scale (-46 dBFS)
# What mastering engineers ask of a mix's peaks: 3-6 dB under full scale, room for
# their EQ and compression before their own limiter.
MIX_HEADROOM_DB = (3.0, 6.0)
MIX_NO_HEADROOM_DBTP = -1.0  # peaks above this leave mastering no room
MIX_LOW_PEAK_DBTP = -20.0  # peaks under this: a 16-bit mix throws resolution away
# A mix's peak-to-loudness ratio: an unlimited mix has 12-20 dB; under SQUASHED
# a limiter or heavy bus compression has flattened it, under DENSE it may have.
MIX_SQUASHED_PLR_DB = 9.0
MIX_DENSE_PLR_DB = 11.0
DYNAMICS_MIN_SECONDS = 10.0  # shorter files (a test tone) say little about dynamics


@dataclass(frozen=True)
class Judgement:
    summary: str
    notes: list[Note]  # what to fix first, first
    verdict: str  # pass, warn or fail
    targets: list[TargetView]  # what each delivery target would do (or need, for a mix)


def judge(m: MixMetrics, p: Profile, stage: str = StageName.MASTER,
          comparison: Comparison | None = None, reference: ReferenceView | None = None,
          genre: bool = True, told: Genre | None = None) -> Judgement:
    """The review of measurements `m` at `stage`, against profile `p`: everything
    the verdict rests on, decided here once. `genre`: the octave bands' reference
    is a genre's curve (not a reference track); `told`: the genre the event gave."""
    notes = notes_for(m, p, comparison, reference, stage, genre, told)
    return Judgement(summarise(m, p, stage), notes, verdict_for(notes),
                     delivery_targets(m, stage))


def verdict_for(notes: list[Note]) -> str:
    """fail: something to fix first; warn: something to consider; pass."""
    severities = {note.severity for note in notes}
    return "fail" if "fix" in severities else "warn" if "consider" in severities else "pass"


# -- the measurements against the profile ------------------------------------------------------


def with_profile(raw: dict[str, Any], profile: Profile, stage: str = StageName.MASTER,
                 reference: TonalReference | None = None,
                 genre: Genre | None = None) -> MixMetrics:
    """The measurements as the review's metrics: the tonal reference beside each
    octave band (a reference track's when `reference` is given, else the genre's
    curve, else the profile's; see tonal.aligned), the unused
    headroom (a master: under the profile's ceiling; a mix: under full scale), the
    loudness curves."""
    metrics = MixMetrics(**raw)
    reference = reference or (curve_of(profile) if genre is None else tonal.from_curve(
        f"the reference curve for {genre.title}", genre.curve))
    levels = tonal.aligned(reference, metrics.octave_bands)
    bands = [band.model_copy(update={"reference_db": levels.get(band.hz)})
             for band in metrics.octave_bands]
    headroom = None if metrics.true_peak_dbtp is None else rounded(
        ceiling(profile, stage) - metrics.true_peak_dbtp, 2)
    curve = LoudnessCurve(step_seconds=1.0, momentary=raw.get("momentary_lufs", []),
                          short_term=metrics.short_term_lufs)
    return metrics.model_copy(update={"octave_bands": bands, "headroom_db": headroom,
                                      "loudness_curve": curve,
                                      "tonal_reference": reference.name})


def ceiling(profile: Profile, stage: str) -> float:
    """The true peak a file's headroom is counted under: full scale for a mix (its
    master's ceiling is mastering's to set), the profile's ceiling for a master."""
    return 0.0 if stage == "mix" else profile.max_true_peak_dbtp


def curve_of(profile: Profile) -> TonalReference:
    genre = CURVE_NAMES.get(profile.reference_curve, profile.title)
    return tonal.from_curve(f"the reference curve for {genre}", profile.reference_curve)


def profile_of(view: ProfileView) -> Profile:
    """The profile a stored review was judged against: the one of its name, else
    one with its stored figures (a profile since renamed or removed)."""
    known = PROFILES.get(view.name)
    return known or Profile(view.name, view.title, view.target_lufs, view.tolerance_lu,
                            view.max_true_peak_dbtp)


# -- the notes --------------------------------------------------------------------------------


def summarise(m: MixMetrics, profile: Profile, stage: str = StageName.MASTER) -> str:
    if m.integrated_lufs is None and m.duration_seconds < 0.4:
        return f"Too short to measure: {m.duration_seconds:g} s (loudness needs 0.4 s)."
    if m.integrated_lufs is None:
        return f"The mix is silent ({m.duration_seconds:g} s of nothing above -70 LUFS)."
    when = f"{length(m.duration_seconds)} at {m.sample_rate} Hz"
    if stage == "mix":
        peak = ("" if m.true_peak_dbtp is None
                else f", peaks at {tenths(m.true_peak_dbtp, True)} dBTP")
        plr = "" if m.plr_db is None else f", PLR {tenths(m.plr_db)} dB"
        return f"A mix at {tenths(m.integrated_lufs)} LUFS{peak}{plr}; {when}."
    delta = m.integrated_lufs - profile.target_lufs
    if loudness_verdict(profile.delivery, m.integrated_lufs) == "pass":
        level = f"on target for {profile.title}"
    else:
        side = "above" if delta > 0 else "below"
        level = f"{tenths(abs(delta))} LU {side} the {profile.title} target"
    peak = ("" if m.true_peak_dbtp is None or not over_ceiling(profile.delivery, m.true_peak_dbtp)
            else f", true peak {tenths(m.true_peak_dbtp, True)} dBTP over the "
                 f"{profile.max_true_peak_dbtp:g} dBTP ceiling")
    return f"Integrated {tenths(m.integrated_lufs)} LUFS, {level}{peak}; {when}."


def rule_notes(m: MixMetrics, p: Profile, stage: str = StageName.MASTER) -> list[str]:
    """Specific observations, what to fix first first, each saying what to change."""
    return [note.text for note in notes_for(m, p, stage=stage)]


def notes_for(m: MixMetrics, p: Profile, comparison: Comparison | None = None,
              reference: ReferenceView | None = None, stage: str = StageName.MASTER,
              genre: bool = True, told: Genre | None = None) -> list[Note]:
    """The review's notes, ordered by severity (fix, consider, info) and, within
    one, by what to change first: clipping in the render (nothing after it can
    undo it), then loudness (it moves everything after it)."""
    if m.integrated_lufs is None and m.duration_seconds < 0.4:
        return [Note(severity="fix", code="too_short", text=(
            f"The file holds {m.duration_seconds:g} s of audio: too short for a loudness "
            "measurement (400 ms at least); check that the export rendered the whole "
            "song."))]
    if m.integrated_lufs is None:
        return [Note(severity="fix", code="silent", text=(
            "Nothing in the file rises above -70 LUFS: check that the export rendered "
            "the right tracks and was not muted."))]
    if stage == "mix":
        notes = [*_clipping_notes(m), *_mix_level_notes(m), *_mix_dynamics_notes(m),
                 *_dc_notes(m, stage), *_stereo_notes(m, told, stage),
                 *tonal.notes(m, genre, told), *_cut_notes(m, stage), *_format_notes(m, stage)]
    else:
        level = _level_notes(m, p, told)
        notes = [*_clipping_notes(m, level), *level, *_dc_notes(m, stage),
                 *_stereo_notes(m, told, stage), *tonal.notes(m, genre, told, master=True),
                 *_cut_notes(m, stage), *_silence_notes(m), *_format_notes(m, stage)]
    if reference is not None:
        notes.append(Note(severity="info", code="reference", text=reference.note))
    if comparison is not None and comparison.previous_run_id is not None:
        notes.append(Note(severity="info", code="previous_export", text=comparison.note))
    return sorted(notes, key=lambda note: SEVERITIES.index(note.severity))


# -- a mix ---------------------------------------------------------------------------------------


def _mix_level_notes(m: MixMetrics) -> list[Note]:
    assert m.integrated_lufs is not None
    notes = [Note(severity="info", code="mix_loudness", text=(
        f"Integrated {tenths(m.integrated_lufs)} LUFS"
        + ("" if m.loudness_range_lu is None else
           f", loudness range {tenths(m.loudness_range_lu)} LU")
        + ": information for mastering, not a verdict; the master's loudness is set "
        "there (the delivery targets below say what each platform asks for)."))]
    headroom = _mix_headroom_note(m)
    return notes if headroom is None else [*notes, headroom]


def _mix_headroom_note(m: MixMetrics) -> Note | None:
    """The mix's peaks against the 3-6 dB under full scale mastering engineers ask
    for. Judged on the peak as the note shows it (one decimal), so that the figure
    and the words never disagree at a band's edge."""
    if m.true_peak_dbtp is None or m.clipped_runs:  # clipping has its own note, first
        return None
    peak = round(m.true_peak_dbtp, 1)
    low, high = MIX_HEADROOM_DB
    if peak > MIX_NO_HEADROOM_DBTP:
        return Note(severity="consider", code="no_headroom", text=(
            f"Peaks reach {tenths(peak, True)} dBTP: no headroom. Mastering engineers ask for "
            f"peaks {low:g} to {high:g} dB under full scale, room for their EQ and compression "
            "before their own limiter; lower the mix bus (or every fader) by about "
            f"{fixed(peak + (low + high) / 2, 0)} dB: nothing else in the mix changes."))
    if peak > -low:
        return Note(severity="info", code="headroom", text=(
            f"Peaks at {tenths(peak, True)} dBTP: {tenths(-peak)} dB of headroom, a little "
            f"under the {low:g}-{high:g} dB mastering engineers ask for; fine in a 24-bit or float "
            "file."))
    if peak < MIX_LOW_PEAK_DBTP and m.bit_depth is not None and m.bit_depth <= 16:
        return Note(severity="consider", code="low_level", text=(
            f"Peaks only at {tenths(peak, True)} dBTP in a {m.bit_depth}-bit file: the quiet "
            "parts lose resolution; export 24-bit or float, or bring the mix bus up to "
            f"peak around -{high:g} dBFS."))
    if peak < -high:
        return Note(severity="info", code="headroom", text=(
            f"Peaks at {tenths(peak, True)} dBTP: {tenths(-peak)} dB of headroom, more than the "
            f"{low:g}-{high:g} dB mastering engineers ask for: fine, they have room to "
            "spare; nothing to change."))
    return Note(severity="info", code="headroom", text=(
        f"Peaks at {tenths(peak, True)} dBTP: {tenths(-peak)} dB of headroom, as mastering "
        f"engineers ask ({low:g}-{high:g} dB: room for their EQ and compression before their "
        "limiter)."))


def _mix_dynamics_notes(m: MixMetrics) -> list[Note]:
    """Squashing: a limiter or heavy bus compression on the mix leaves mastering
    nothing to shape."""
    plr = m.plr_db
    if plr is None or m.duration_seconds < DYNAMICS_MIN_SECONDS:
        return []
    if plr < MIX_SQUASHED_PLR_DB:
        return [Note(severity="fix", code="squashed", text=(
            f"Peak-to-loudness ratio {tenths(plr)} dB: the mix is squashed (an unlimited mix "
            "has 12-20 dB); a limiter or heavy compression on the mix bus is flattening "
            "it. Bypass it and send the mix with its peaks: loudness is mastering's job, "
            "and squashed transients cannot be brought back."))]
    if plr < MIX_DENSE_PLR_DB:
        return [Note(severity="consider", code="dense", text=(
            f"Peak-to-loudness ratio {tenths(plr)} dB: a dense mix (an unlimited mix has "
            "12-20 dB); if a limiter or clipper is on the mix bus, bypass it for the "
            "mastering engineer."))]
    if m.loudness_range_lu is not None and m.loudness_range_lu > 15:
        return [Note(severity="info", code="wide_range", text=(
            f"Loudness range {tenths(m.loudness_range_lu)} LU: a wide one; mastering can even "
            "it out, or ride the quiet sections up in the mix."))]
    return []


# -- a master ------------------------------------------------------------------------------------


def _level_notes(m: MixMetrics, p: Profile, told: Genre | None = None) -> list[Note]:
    """Loudness against the profile's target, said as its platform plays it; its
    severity is the target's verdict (agentbox.review.delivery), the one its row
    shows, except for a quiet master with peak room and nothing clipped: the
    platforms only play it quieter, a warning at most."""
    assert m.integrated_lufs is not None
    t = p.delivery
    delta = m.integrated_lufs - t.integrated_lufs
    verdict = loudness_verdict(t, m.integrated_lufs, m.true_peak_dbtp)
    if delta < 0 and verdict != "pass" and quiet_by_choice(t, m.true_peak_dbtp):
        return [Note(severity=SEVERITY_OF[verdict], code="too_quiet", text=(
            f"Integrated {tenths(m.integrated_lufs)} LUFS is {tenths(-delta)} LU below the "
            f"{p.title} target of {t.integrated_lufs:g} LUFS, with "
            f"{tenths(t.true_peak_max_dbtp - (m.true_peak_dbtp or 0.0))} dB of peak room "
            f"and nothing clipped: {as_platforms_play(m, -delta)}. A dynamic master may "
            f"stay so; to play as loud as others, {raise_it(t, -delta, m.true_peak_dbtp)}.")),
            *_ceiling_notes(m, t, -delta), *_master_dynamics_notes(m, told)]
    where = (f"Integrated {tenths(m.integrated_lufs)} LUFS is {tenths(abs(delta))} LU "
             f"{'above' if delta > 0 else 'below'} the {p.title} target of "
             f"{t.integrated_lufs:g} LUFS")
    if verdict == "pass":
        level = Note(severity="info", code="on_target", text=(
            f"Integrated {tenths(m.integrated_lufs)} LUFS sits within ±{t.tolerance_lu:g} LU of "
            f"the {p.title} target ({t.integrated_lufs:g} LUFS)."))
    elif delta > 0:
        level = Note(severity=SEVERITY_OF[verdict], code="too_loud",
                     text=f"{where}: {_loud(t, delta)}.")
    else:
        level = Note(severity=SEVERITY_OF[verdict], code="too_quiet", text=(
            f"{where}: {_quiet(t, -delta, m.true_peak_dbtp)}."))
    shortfall = -delta if verdict != "pass" and delta < 0 else 0.0
    return [level, *_ceiling_notes(m, t, shortfall), *_master_dynamics_notes(m, told)]


def as_platforms_play(m: MixMetrics, by: float) -> str:
    """What each streaming platform does with a master `by` LU under -14 LUFS: turned
    up as far as its peaks allow, or not at all."""
    said = []
    for t in (TARGETS_BY_NAME["spotify"], TARGETS_BY_NAME["apple_music"],
              TARGETS_BY_NAME["youtube"]):
        wanted = t.integrated_lufs - (m.integrated_lufs or 0.0)
        if t.normalisation == UP_TO_PEAK and wanted > 0:
            room = max(0.0, t.true_peak_max_dbtp - (m.true_peak_dbtp or 0.0))
            up = min(wanted, room)
            said.append(f"{t.platform} turns it up {tenths(up)} dB"
                        + (" (as far as its peaks allow)" if up < wanted else ""))
        elif t.normalisation == DOWN_ONLY or wanted > 0:
            said.append(f"{t.title} play it as it is, {tenths(max(wanted, 0.0))} dB "
                        "quieter than their louder tracks")
    return "; ".join(said) if said else f"it plays {tenths(by)} dB quieter"


def _loud(t: Target, by: float) -> str:
    """What the platform does with a master `by` LU louder than its target, and what
    to do."""
    if t.normalisation in (UP_TO_PEAK, DOWN_ONLY):
        return (f"{t.platform} turns it down {tenths(by)} dB, so the extra loudness only costs "
                f"dynamics; ease the limiter by about {tenths(by)} dB")
    if t.normalisation == DELIVER:
        return (f"lower it {tenths(by)} dB to meet the specification (gain only: the peaks come "
                "down with it)")
    return (f"{t.platform} plays it as it is, louder than the {t.integrated_lufs:g} LUFS "
            f"usual there; easing the limiter by about {tenths(by)} dB keeps more punch")


def _quiet(t: Target, by: float, peak: float | None) -> str:
    """What the platform does with a master `by` LU quieter than its target, and what
    to do: raising it past the ceiling takes a limiter, not gain."""
    room = 0.0 if peak is None else t.true_peak_max_dbtp - peak
    raising = raise_it(t, by, peak)
    if t.normalisation == UP_TO_PEAK:
        if room >= by - 0.05:
            return (f"{t.platform} turns it up to the target (its peaks allow it), but not "
                    f"every platform turns quiet tracks up (YouTube and Tidal do not); "
                    f"{raising}")
        if room > 0.05:
            return (f"{t.platform} turns it up only {tenths(room)} dB, as far as its peaks "
                    f"allow, so it plays {tenths(by - room)} dB quieter than other tracks; to "
                    f"match them, {raising}")
        return (f"{t.platform} cannot turn it up (its peaks already reach "
                f"{t.true_peak_max_dbtp:g} dBTP), so it plays {tenths(by)} dB quieter than "
                f"other tracks; to match them, {raising}")
    if t.normalisation == DOWN_ONLY:
        return (f"{t.platform} does not turn quiet tracks up, so it plays {tenths(by)} dB "
                f"quieter than others; to match them, {raising}")
    if t.normalisation == DELIVER:
        return f"nobody turns it up, the file must meet the specification: {raising}"
    return (f"{t.platform} plays it as it is, {tenths(by)} dB quieter than the "
            f"{t.integrated_lufs:g} LUFS usual there; {raising}")


def _ceiling_notes(m: MixMetrics, t: Target, shortfall: float) -> list[Note]:
    """A peak over the ceiling; or, for a master `shortfall` LU too quiet, the
    headroom it leaves unused."""
    peak = m.true_peak_dbtp
    if peak is not None and over_ceiling(t, peak):
        after = " and will clip after lossy encoding" if peak > -0.5 else ""
        overs = [r for r in m.clipping_ranges if r.kind == "over"]
        where = f" (over 0 dBTP at {spans(overs)})" if overs else ""
        return [Note(severity="fix", code="true_peak_over", text=(
            f"True peak {tenths(peak, True)} dBTP exceeds the {t.true_peak_max_dbtp:g} dBTP "
            f"ceiling{after}{where}: lower the limiter's output ceiling by "
            f"{tenths(peak - t.true_peak_max_dbtp)} dB or enable its true-peak mode."))]
    # Quiet, and only part of the way up is free: the rest takes a limiter (when all
    # of it is free, the level note says gain alone does it).
    if peak is not None and m.headroom_db is not None and 1.0 <= m.headroom_db < shortfall:
        return [Note(severity="consider", code="unused_headroom", text=(
            f"The master peaks at {tenths(peak, True)} dBTP: {tenths(m.headroom_db)} dB of "
            f"headroom under the {t.true_peak_max_dbtp:g} dBTP ceiling is unused; the first "
            f"{tenths(m.headroom_db)} dB of raising it need no limiting."))]
    return []


# Genres whose songs move between verses and choruses; the others (ambient, orchestral,
# electronic, speech) are steady or shaped otherwise, and no verse is named to them.
VERSE_GENRES = frozenset({"pop", "rock", "hip_hop", "acoustic", "jazz"})
STEADY_GENRES = frozenset({"ambient", "electronic"})  # a narrow range is their nature


def _master_dynamics_notes(m: MixMetrics, told: Genre | None = None) -> list[Note]:
    notes = []
    if m.loudness_range_lu is not None:
        steady = told is not None and told.name in STEADY_GENRES
        if m.loudness_range_lu < 3 and m.duration_seconds >= 30 and not steady:
            move = ("consider letting the verses breathe: ease the master's compression and "
                    "limiting" if told is not None and told.name in VERSE_GENRES else
                    "if the music should move more, ease the master's compression and "
                    "limiting")
            notes.append(Note(severity="consider", code="narrow_range", text=(
                f"Loudness range {tenths(m.loudness_range_lu)} LU: very little movement "
                f"between sections; {move}.")))
        elif m.loudness_range_lu > 15:
            notes.append(Note(severity="consider", code="wide_range", text=(
                f"Loudness range {tenths(m.loudness_range_lu)} LU: quiet passages may get "
                "lost on phones and in cars; gentle compression on the master brings them "
                "up.")))
    if m.plr_db is not None and m.plr_db < 8 and m.duration_seconds >= 30:
        notes.append(Note(severity="consider", code="low_plr", text=(
            f"Peak-to-loudness ratio {tenths(m.plr_db)} dB: the transients are squashed; "
            "less limiting on the master would keep the punch.")))
    return notes


def _silence_notes(m: MixMetrics) -> list[Note]:
    """A master plays as it is: silence at its ends is a gap (a mix's is trimmed in
    mastering)."""
    notes = []
    if m.leading_silence_seconds > LEADING_SILENCE_SECONDS:
        notes.append(Note(severity="consider", code="leading_silence", text=(
            f"{tenths(m.leading_silence_seconds)} s of silence before the music starts: trim the "
            "start of the export (players play it as a gap).")))
    if m.trailing_silence_seconds > TRAILING_SILENCE_SECONDS:
        notes.append(Note(severity="consider", code="trailing_silence", text=(
            f"{tenths(m.trailing_silence_seconds)} s of silence at the end: shorten the render "
            "to the end of the reverb tail.")))
    return notes


# -- either --------------------------------------------------------------------------------------


def _clipping_notes(m: MixMetrics, level: list[Note] | None = None) -> list[Note]:
    """Clipping named by its evidence: how many flat runs at full scale, how long
    the longest, and whether that is heard or is a lossy decode's overs. On a master
    whose peaks are over the ceiling (`level`: its level notes), short runs are the
    ceiling's evidence, said in its note, not a note of their own."""
    if not m.clipped_runs:
        return []
    over = next((i for i, note in enumerate(level or []) if note.code == "true_peak_over"),
                None)
    if over is not None and level is not None and not audible_clipping(m):
        note = level[over]
        level[over] = note.model_copy(update={"text": note.text.rstrip(".") + (
            f"; its {m.clipped_runs} short flat run{'s' if m.clipped_runs != 1 else ''} at "
            f"full scale (the longest {m.clipped_longest_run} samples) are what a lossy "
            "file's overs leave when decoded, not clipping anyone hears.")})
        return []
    clipped = [r for r in m.clipping_ranges if r.kind == "clipping"]
    where = f" at {spans(clipped)}" if clipped else ""
    longest = m.clipped_longest_run
    evidence = (f"{m.clipped_samples} samples sit at full scale in {m.clipped_runs} "
                f"flat run{'s' if m.clipped_runs != 1 else ''} of 3 or more"
                + (f" (the longest {longest} samples)" if longest else "") + where)
    if not audible_clipping(m):
        return [Note(severity="consider", code="clipping", text=(
            f"{evidence}: short flat tops, as a lossy file's overs leave when decoded to "
            "a fixed-point file (or a limiter whose ceiling is at full scale), not "
            "clipping anyone hears; the first fix is the limiter's ceiling: -1 dBTP in "
            "true-peak mode."))]
    return [Note(severity="fix", code="clipping", text=(
        f"{evidence}: that is audible clipping in the render, not just a hot peak; "
        "lower the master fader or the limiter's input there."))]


def audible_clipping(m: MixMetrics) -> bool:
    """Flat runs long or many enough to be heard, or cut from a signal driven well
    past full scale (a file measured before the longest run was kept counts as
    heard, as it was judged then)."""
    return (not m.clipped_longest_run or m.clipped_longest_run >= AUDIBLE_RUN_SAMPLES
            or m.clipped_runs > AUDIBLE_RUNS
            or (m.true_peak_dbtp is not None and m.true_peak_dbtp >= DRIVEN_PAST_DBTP))


def _dc_notes(m: MixMetrics, stage: str) -> list[Note]:
    """A DC offset held through the file; removed where the file is made: a mix's
    on its mix bus, a master's on the master."""
    if abs(m.dc_offset) < DC_OFFSET_NOTED:
        return []
    where = "the mix bus" if stage == "mix" else "the master"
    return [Note(severity="consider", code="dc_offset", text=(
        f"DC offset of {fixed(m.dc_offset * 100, 2, True)} % of full scale: a high-pass filter "
        f"(or a DC-removal plug-in) on {where} would reclaim headroom."))]


def _stereo_notes(m: MixMetrics, told: Genre | None = None, stage: str = "mix") -> list[Note]:
    inverted = _polarity_note(m, stage)
    notes = [] if inverted is None else [inverted]
    if m.channels == 2 and not m.dual_mono and inverted is None:
        if m.mono_loudness_drop_lu is None:
            notes.append(Note(severity="fix", code="mono_cancels", text=(
                "Folded to mono the mix cancels out entirely: one side is "
                "polarity-inverted; flip the polarity of one channel.")))
        elif m.mono_loudness_drop_lu > 3:
            notes.append(Note(severity="consider", code="mono_drop", text=(
                f"Folded to mono it loses {tenths(m.mono_loudness_drop_lu)} LU: wide or phasey "
                "elements will vanish on mono speakers; narrow the widest ones.")))
    wide = None if inverted is not None else _low_end_wide(m, told, stage)
    if wide is not None:
        notes.append(wide)
    if m.mono:
        notes.append(Note(severity="info", code="mono", text=(
            "The file is mono (one channel): fine for a mono master; if you meant a stereo "
            "mix, check the export's channel setting.")))
    elif m.dual_mono:
        notes.append(Note(severity="consider", code="dual_mono", text=(
            "Left and right are identical (dual mono): the mix has no stereo image; check "
            "that the export was not summed to mono, or deliver it as a mono file.")))
    return notes


def _polarity_note(m: MixMetrics, stage: str) -> Note | None:
    """One channel's polarity, one note: the correlation, the mono fold and the low
    end's width are its evidence, not three faults."""
    corr = m.stereo_correlation
    if corr is None or corr >= OUT_OF_PHASE_BELOW:
        return None
    evidence = [f"stereo correlation {fixed(corr, 2, True)}"]
    if m.channels == 2 and not m.dual_mono:
        evidence.append("folded to mono it cancels out entirely"
                        if m.mono_loudness_drop_lu is None else
                        f"folded to mono it loses {tenths(m.mono_loudness_drop_lu)} LU")
    if m.low_end_correlation is not None and m.low_end_correlation < 0:
        evidence.append(f"below {LOW_END_HZ:g} Hz {fixed(m.low_end_correlation, 2, True)}")
    fix = ("flip the polarity of one channel (or of the stereo sources that are "
           "inverted)" if stage == "mix" else
           "if a whole channel is inverted, flip its polarity on the master; if only "
           "some sources are, send it back to the mix")
    return Note(severity="fix", code="out_of_phase", text=(
        f"Left and right are largely out of phase, one cause for all of this: "
        f"{', '.join(evidence)}; {fix}."))


def _cut_notes(m: MixMetrics, stage: str) -> list[Note]:
    """A render that stops, or starts, while the music plays. A mix must hold its
    whole tail (mastering makes the fades; a cut tail cannot be put back); a master
    may stop dead on purpose."""
    assert m.integrated_lufs is not None
    notes = []
    floor = m.integrated_lufs - CUT_EDGE_LU
    if m.end_lufs is not None and m.end_lufs > floor and m.trailing_silence_seconds < 0.05:
        notes.append(Note(severity="fix" if stage == "mix" else "consider", code="cut_tail",
                          text=(
            f"The render stops while the music plays (its last 100 ms at "
            f"{tenths(m.end_lufs)} LUFS, against {tenths(m.integrated_lufs)} for the whole): a "
            "last note or a reverb tail is cut off; extend the render past the end of the tail"
            + (", and leave the fade to mastering." if stage == "mix" else
               " (if the song stops dead on purpose, a moment of silence after it still "
               "helps players and crossfades)."))))
    if (m.start_lufs is not None and m.start_lufs > floor and m.leading_silence_seconds < 0.01
            and (m.start_onset_db is None or m.start_onset_db > -CUT_ONSET_DB)):
        notes.append(Note(severity="consider", code="cut_start", text=(
            f"The render starts in the music (its first 100 ms at {tenths(m.start_lufs)} LUFS, "
            "sounding from the very first sample, with no attack): the first note is cut, "
            "or clicks; start the render a moment before the music.")))
    return notes


def _low_end_wide(m: MixMetrics, told: Genre | None, stage: str = "mix") -> Note | None:
    """A wide low end: a fault in a produced record (it thins out in mono and on
    club systems), natural in a room's recording (an orchestra's basses and its
    hall), where only a low end out of phase is one."""
    corr = m.low_end_correlation
    room = told is not None and not told.mono_low_end
    if corr is None or corr >= (0.0 if room else LOW_END_CORRELATION_BELOW):
        return None
    where = f"Below {LOW_END_HZ:g} Hz left and right correlate at {fixed(corr, 2, True)}"
    if room:
        assert told is not None
        return Note(severity="fix", code="low_end_wide", text=(
            f"{where}: out of phase, which even {told.title}'s wide low end is not; the "
            "bass thins out in mono. " + ("Check the polarity of the low instruments' "
            "microphones." if stage == "mix" else "Send it back to the mix: the low "
            "instruments' polarity is set there.")))
    words = "" if told is not None else (
        " (a recording in a room, orchestral or acoustic, is often this wide down there: "
        "send its genre and it is judged as one)")
    return Note(
        severity="fix" if corr < 0 else "consider", code="low_end_wide",
        text=(f"{where}: the bass is wide or out of phase and thins out in mono and on "
              "club systems; make the low end mono (a mid/side EQ or a mono-maker below "
              f"120 Hz){words}."))


def _format_notes(m: MixMetrics, stage: str) -> list[Note]:
    notes = []
    if m.bit_depth is None:
        if stage == "mix":
            notes.append(Note(severity="fix", code="lossy", text=(
                "Export the mix again as WAV, AIFF or FLAC, at the session's sample rate "
                f"and 24-bit or 32-bit float: a lossy {m.file_format} file has lost part "
                "of the sound for good, and mastering needs all of it. The figures of "
                f"this review are the {m.file_format}'s, close to the mix's (its peaks "
                "may read a little higher).")))
        else:
            notes.append(Note(severity="consider", code="lossy", text=(
                f"A lossy {m.file_format} file: deliver a WAV, AIFF or FLAC master; the "
                "platforms encode it again, and peaks of a lossy file are not the "
                "master's.")))
    elif m.bit_depth < 16:
        notes.append(Note(severity="fix", code="low_bit_depth", text=(
            f"{m.bit_depth}-bit audio: export at 24-bit (or at least 16-bit, dithered).")))
    elif m.bit_depth == 16 and stage == "mix":
        notes.append(Note(severity="consider", code="mix_bit_depth", text=(
            "A 16-bit mix: mastering works best from the session's resolution; export "
            "24-bit or 32-bit float, without dither (dither belongs to the master).")))
    if m.sample_rate < 44_100:
        notes.append(Note(severity="fix", code="low_sample_rate", text=(
            f"{m.sample_rate} Hz sample rate: export at 44.1 kHz or 48 kHz; delivery "
            "platforms expect at least 44.1 kHz.")))
    return notes


def spans(ranges: list[ClippingRange]) -> str:
    """Where these ranges are, as the page's chart caption says it."""
    return places((r.start, r.end) for r in ranges)
