"""A file against the delivery targets: the one rule that says how far off a
target a master is (`target_verdict`: the review's verdict on its loudness and
peak, and every platform row, read it from here), what each platform's playback
does to it (`as_played`), and, for a mix, what mastering for each would take
(`once_mastered`). Each row says only what differs on its platform; what they
would all say again is said once beside them (`shared_note`).

The rule, for a master and one target:
- a true peak over the target's ceiling fails: the encode may clip it;
- a loudness within the tolerance passes;
- a master louder than a platform that turns it down (or than a club master)
  is a warning: it plays as loud as everything else, the extra loudness only
  cost it punch;
- a master quieter than a platform that turns it up as far as its peaks allow,
  with the peak room to be turned up all the way, is a warning: there it plays at
  the target and costs nothing; only the platforms that never turn up (YouTube,
  Tidal, Amazon Music, a listener with normalisation off) play it quieter;
- otherwise (too quiet anywhere; off a delivery specification) more than three
  tolerances fails and less is a warning. A quiet master plays quieter than the
  rest wherever nothing turns it up (YouTube, Tidal, Amazon Music, a listener
  with normalisation off; Spotify only as far as its peaks allow): raise it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agentbox.review.figures import rounded, tenths
from agentbox.review.model import MixMetrics, TargetView
from agentbox.review.profiles import AS_IS, DELIVER, DOWN_ONLY, TARGETS, UP_TO_PEAK, Target
from agentbox.review.stage import StageName

# A true peak this close over a ceiling reads as at it (the review shows one
# decimal): no verdict turns on a difference it cannot show.
PEAK_SLACK_DB = 0.05
OFF_BY_TOLERANCES = 3  # further off a target than this many tolerances fails
SEVERITY_OF = {"pass": "info", "warn": "consider", "fail": "fix"}  # a verdict as a note's


def over_ceiling(t: Target, peak: float) -> bool:
    return peak > t.true_peak_max_dbtp + PEAK_SLACK_DB


def distance(t: Target, loudness: float) -> float:
    """The master's loudness minus the target's, as the review shows it (0.1 LU)."""
    return round(loudness - t.integrated_lufs, 1)


def loudness_verdict(t: Target, loudness: float, peak: float | None = None) -> str:
    """pass, warn or fail for a master's loudness (and true peak, when known)
    against `t` (the module's rule)."""
    delta = distance(t, loudness)
    if abs(delta) <= t.tolerance_lu:
        return "pass"
    if delta > 0 and t.normalisation != DELIVER:
        return "warn"
    if delta < 0 and raised_to_target(t, -delta, peak):
        return "warn"
    if delta < 0 and quiet_by_choice(t, peak):
        return "warn"
    return "fail" if abs(delta) > OFF_BY_TOLERANCES * t.tolerance_lu else "warn"


# Peak room under the ceiling that makes a quiet master a choice, not a fault: the
# platforms only play it quieter (one that must meet a specification still fails).
QUIET_ROOM_DB = 1.0


def quiet_by_choice(t: Target, peak: float | None) -> bool:
    """A master under `t`'s loudness with QUIET_ROOM_DB of peak room or more (so
    nothing at full scale): a warning at most, where a platform plays it."""
    return (t.normalisation != DELIVER and peak is not None
            and t.true_peak_max_dbtp - peak >= QUIET_ROOM_DB)


def raised_to_target(t: Target, by: float, peak: float | None) -> bool:
    """Whether `t` turns a master `by` LU under its target all the way up (its peaks
    leave the room under the ceiling)."""
    return (t.normalisation == UP_TO_PEAK and peak is not None
            and t.true_peak_max_dbtp - peak >= by - PEAK_SLACK_DB)


def target_verdict(t: Target, loudness: float, peak: float) -> str:
    """pass, warn or fail for a master of this loudness and true peak on `t`."""
    return "fail" if over_ceiling(t, peak) else loudness_verdict(t, loudness, peak)


def raise_it(t: Target, by: float, peak: float | None) -> str:
    """How to raise a master `by` dB to `t`: gain, or a limiter once gain would take
    its peaks past the ceiling."""
    room = 0.0 if peak is None else t.true_peak_max_dbtp - peak
    if room >= by:
        return f"raise it {tenths(by)} dB (gain alone does it: its peaks stay under the ceiling)"
    return (f"raise it {tenths(by)} dB with a limiter holding the true peak at "
            f"{t.true_peak_max_dbtp:g} dBTP (gain alone would take the peaks "
            f"{tenths(by - room)} dB over it)")


def delivery_targets(m: MixMetrics, stage: str = StageName.MASTER) -> list[TargetView]:
    """What each platform does with this master; for a mix, what mastering for it
    would take."""
    assess: Callable[[MixMetrics, Target], TargetView] = (
        once_mastered if stage == "mix" else as_played)
    return [assess(m, target) for target in TARGETS]


def _view(t: Target, gain: float | None, peak: float | None, verdict: str | None,
          note: str) -> TargetView:
    return TargetView(name=t.name, title=t.title, integrated_target_lufs=t.integrated_lufs,
                      true_peak_max_dbtp=t.true_peak_max_dbtp,
                      gain_db=None if gain is None else rounded(gain, 1),
                      result_true_peak_dbtp=None if peak is None else rounded(peak, 1),
                      verdict=verdict, note=note)


def playback_gain(t: Target, loudness: float, peak: float) -> float:
    """What `t`'s playback applies to a file of this loudness and true peak."""
    wanted = t.integrated_lufs - loudness
    if t.normalisation in (DELIVER, AS_IS):
        return 0.0
    if wanted <= 0 or t.normalisation == DOWN_ONLY:
        return min(wanted, 0.0)
    return min(wanted, max(0.0, t.true_peak_max_dbtp - peak))  # UP_TO_PEAK


def as_played(m: MixMetrics, t: Target) -> TargetView:
    """A master on `t`: the gain its playback applies, where it plays, the verdict of
    the rule, and what differs there (what every row would say is `shared_note`'s)."""
    if m.integrated_lufs is None or m.true_peak_dbtp is None:
        return _view(t, None, None, "fail", "nothing to play: the file is silent or too short")
    loudness, peak = m.integrated_lufs, m.true_peak_dbtp
    gain = playback_gain(t, loudness, peak)
    note = _played(t, loudness, peak, gain)
    if over_ceiling(t, peak):
        note += f"; over its {t.true_peak_max_dbtp:g} dBTP ceiling"
    return _view(t, gain, peak + gain, target_verdict(t, loudness, peak), note)


def _played(t: Target, loudness: float, peak: float, gain: float) -> str:
    """What `t` does with the file's loudness and, when it is off the target, what
    to do."""
    wanted = t.integrated_lufs - loudness  # > 0: quieter than the target
    if loudness_verdict(t, loudness) == "pass":
        return _heard(t, gain)
    if wanted < 0:
        return _loud(t, -wanted, gain)
    return _quiet(t, wanted, gain, peak)


def _heard(t: Target, gain: float) -> str:
    if t.normalisation in (DELIVER, AS_IS):
        return f"plays as it is, within ±{t.tolerance_lu:g} LU of {t.integrated_lufs:g} LUFS"
    if gain < -0.05:
        return f"turned down {tenths(-gain)} dB"
    return f"turned up {tenths(gain)} dB" if gain > 0.05 else "plays as it is"


def _loud(t: Target, by: float, gain: float) -> str:
    if t.normalisation in (UP_TO_PEAK, DOWN_ONLY):
        return f"turned down {tenths(-gain)} dB"  # what that costs: LOUD_COSTS, said once
    return (f"plays as it is, {tenths(by)} LU louder than {t.integrated_lufs:g} LUFS: "
            + ("lower it that much" if t.normalisation == DELIVER else
               "fine in a club, at the cost of punch"))


def _quiet(t: Target, by: float, gain: float, peak: float) -> str:
    off = by - gain  # how much quieter than the target it plays there
    raising = _raise_row(t, by, peak)
    if t.normalisation == DOWN_ONLY:
        return f"not turned up: plays {tenths(off)} dB quieter; {raising}"
    if t.normalisation != UP_TO_PEAK:
        return (f"plays as it is, {tenths(by)} LU quieter than {t.integrated_lufs:g} LUFS: "
                f"{raising}")
    if raised_to_target(t, round(by, 1), peak):  # the verdict's rule, at the review's 0.1 dB
        return f"turned up {tenths(gain)} dB, to the target; {raising}"
    if gain > 0.05:
        return (f"turned up only {tenths(gain)} dB, as far as its peaks allow: plays "
                f"{tenths(off)} dB quieter; {raising}")
    return f"not turned up (its peaks reach the ceiling): plays {tenths(off)} dB quieter; {raising}"


def _off(t: Target, loudness: float) -> float:
    """How far under (> 0) or over (< 0) `t`'s target a master is where its row says
    what to do (`_played`); 0.0 within the tolerance."""
    if loudness_verdict(t, loudness) == "pass":
        return 0.0
    return t.integrated_lufs - loudness


def _over_shared(over: list[Target], peak: float) -> str:
    """The ceiling a master's true peak is over, said once: the most common ceiling
    first, then the others with their platforms."""
    by_ceiling: dict[float, list[str]] = {}
    for t in over:
        by_ceiling.setdefault(t.true_peak_max_dbtp, []).append(t.title)
    ceilings = sorted(by_ceiling, key=lambda c: -len(by_ceiling[c]))
    where = ("every platform's upload ceiling" if len(over) == len(TARGETS) else
             "the upload ceiling of " + _and(t.title for t in over))
    others = "".join(f"; for {_and(by_ceiling[c])}, {c:g} dBTP" for c in ceilings[1:])
    return (f"The file's true peak, {tenths(peak, signed=True)} dBTP, is over {where}: the encode, "
            "before any turning down, may clip it. Set the limiter's ceiling, in true-peak "
            f"mode, to {ceilings[0]:g} dBTP{others}.")


def _and(names: Iterable[str]) -> str:
    said = list(names)
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]


def _mix_shared(loudness: float, peak: float) -> str:
    """A mix's rows share its peak-to-loudness ratio: a master's is at most its
    ceiling minus its target, and limiting takes off the rest."""
    return (f"This mix's PLR (true peak minus loudness) is {tenths(peak - loudness)} dB; a "
            "master's can be at most its ceiling minus its target, and limiting takes off "
            "the rest.")


def _raise_row(t: Target, by: float, peak: float) -> str:
    """`raise_it` for a row: the amount and the means; how a limiter is set is the
    shared sentence's (LIMITER)."""
    gain_alone = t.true_peak_max_dbtp - peak >= by
    return f"raise it {tenths(by)} dB " + ("(gain alone)" if gain_alone else "with a limiter")


# What every row that needs it would say again, said once beside the table.
LOUD_COSTS = ("Where it is turned down, the extra loudness only costs dynamics: it plays "
              "as loud as everything else there.")
LOWER = "Lower it with gain alone where a row says so."
QUIET = ("Not every player turns a quiet track up (YouTube, Tidal, Amazon Music, a "
         "listener with normalisation off play it as it is).")
LIMITER = ("Where a row says “with a limiter”, gain alone would take the peaks over its "
           "ceiling: hold them there with a limiter in true-peak mode.")


def shared_note(m: MixMetrics, stage: str = StageName.MASTER) -> str:
    """What all platform rows share, said once (the rows say only what differs):
    for a master, the ceiling its peak is over and the advice that repeats; for a
    mix, its peak-to-loudness ratio. "" when the rows share nothing worth saying."""
    if m.integrated_lufs is None or m.true_peak_dbtp is None:
        return ""
    if stage == StageName.MIX:
        return _mix_shared(m.integrated_lufs, m.true_peak_dbtp)
    loudness, peak = m.integrated_lufs, m.true_peak_dbtp
    over = [t for t in TARGETS if over_ceiling(t, peak)]
    quiet = [t for t in TARGETS if _off(t, loudness) > 0]
    loud = {t.normalisation for t in TARGETS if _off(t, loudness) < 0}
    said = [_over_shared(over, peak)] if over else []
    said += [QUIET] if {t.normalisation for t in quiet} & {UP_TO_PEAK, DOWN_ONLY} else []
    limited = any(t.true_peak_max_dbtp - peak < t.integrated_lufs - loudness for t in quiet)
    said += [LIMITER] if limited else []
    said += [LOUD_COSTS] if loud & {UP_TO_PEAK, DOWN_ONLY} else []
    said += [LOWER] if DELIVER in loud else []
    return " ".join(said)


def once_mastered(m: MixMetrics, t: Target) -> TargetView:
    """What mastering this mix for `t` would take: no verdict, a mix is not played
    anywhere yet."""
    if m.integrated_lufs is None or m.true_peak_dbtp is None:
        return _view(t, None, None, None, "nothing to master: the file is silent or too short")
    louder = t.integrated_lufs - m.integrated_lufs
    needed_plr = t.true_peak_max_dbtp - t.integrated_lufs
    plr = m.true_peak_dbtp - m.integrated_lufs
    change = (f"{tenths(louder)} dB louder than this mix" if louder > 0.05 else
              f"{tenths(-louder)} dB quieter than this mix" if louder < -0.05 else
              "as loud as this mix")
    # the mix's own PLR is the shared sentence's (`_mix_shared`)
    limiting = (f"about {tenths(plr - needed_plr)} dB of limiting, to a PLR of {needed_plr:g} dB"
                if plr - needed_plr > 0.5 else "no limiting needed")
    return _view(t, None, None, None, (
        f"{t.integrated_lufs:g} LUFS under {t.true_peak_max_dbtp:g} dBTP: {change}; "
        f"{limiting}"))
