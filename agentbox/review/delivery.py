"""A file against the delivery targets: the one rule that says how far off a
target a master is (`target_verdict`: the review's verdict on its loudness and
peak, and every platform row, read it from here), what each platform's playback
does to it (`as_played`), and, for a mix, what mastering for each would take
(`once_mastered`).

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

from collections.abc import Callable

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
    return "fail" if abs(delta) > OFF_BY_TOLERANCES * t.tolerance_lu else "warn"


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
        return f"raise it {by:.1f} dB (gain alone does it: its peaks stay under the ceiling)"
    return (f"raise it {by:.1f} dB with a limiter holding the true peak at "
            f"{t.true_peak_max_dbtp:g} dBTP (gain alone would take the peaks "
            f"{by - room:.1f} dB over it)")


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
                      gain_db=None if gain is None else round(gain, 1),
                      result_true_peak_dbtp=None if peak is None else round(peak, 1),
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
    the rule, and what to do."""
    if m.integrated_lufs is None or m.true_peak_dbtp is None:
        return _view(t, None, None, "fail", "nothing to play: the file is silent or too short")
    loudness, peak = m.integrated_lufs, m.true_peak_dbtp
    gain = playback_gain(t, loudness, peak)
    note = _played(t, loudness, peak, gain)
    if over_ceiling(t, peak):
        # the ceiling is the uploaded file's: the encode runs before any turning down
        note += (f"; the file's true peak, {peak:+.1f} dBTP, is over the "
                 f"{t.true_peak_max_dbtp:g} dBTP ceiling for uploads (the encode, before "
                 "any turning down, may clip it): set the "
                 f"limiter's ceiling to {t.true_peak_max_dbtp:g} dBTP, in true-peak mode")
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
        return f"turned down {-gain:.1f} dB"
    return f"turned up {gain:.1f} dB" if gain > 0.05 else "plays as it is"


def _loud(t: Target, by: float, gain: float) -> str:
    if t.normalisation in (UP_TO_PEAK, DOWN_ONLY):
        return f"turned down {-gain:.1f} dB: the extra loudness only costs dynamics"
    return (f"plays as it is, {by:.1f} LU louder than {t.integrated_lufs:g} LUFS: "
            + ("lower it that much (gain only)" if t.normalisation == DELIVER else
               "fine in a club, at the cost of punch"))


def _quiet(t: Target, by: float, gain: float, peak: float) -> str:
    off = by - gain  # how much quieter than the target it plays there
    raising = raise_it(t, by, peak)
    if t.normalisation == DOWN_ONLY:
        return (f"not turned up (quiet tracks are not): plays {off:.1f} dB quieter than "
                f"the target; {raising}")
    if t.normalisation != UP_TO_PEAK:
        return (f"plays as it is, {by:.1f} LU quieter than {t.integrated_lufs:g} LUFS: "
                f"{raising}")
    if raised_to_target(t, round(by, 1), peak):  # the verdict's rule, at the review's 0.1 dB
        return (f"turned up {gain:.1f} dB, to the target, but not every player turns quiet "
                f"tracks up: {raising}")
    if gain > 0.05:
        return (f"turned up only {gain:.1f} dB (as far as its peaks allow, to "
                f"{t.true_peak_max_dbtp:g} dBTP): plays {off:.1f} dB quieter than the "
                f"target; {raising}")
    return (f"not turned up (its peaks already reach {t.true_peak_max_dbtp:g} dBTP): plays "
            f"{off:.1f} dB quieter than the target; {raising}")


def once_mastered(m: MixMetrics, t: Target) -> TargetView:
    """What mastering this mix for `t` would take: no verdict, a mix is not played
    anywhere yet."""
    if m.integrated_lufs is None or m.true_peak_dbtp is None:
        return _view(t, None, None, None, "nothing to master: the file is silent or too short")
    louder = t.integrated_lufs - m.integrated_lufs
    needed_plr = t.true_peak_max_dbtp - t.integrated_lufs
    plr = m.true_peak_dbtp - m.integrated_lufs
    change = (f"{louder:.1f} dB louder than this mix" if louder > 0.05 else
              f"{-louder:.1f} dB quieter than this mix" if louder < -0.05 else
              "as loud as this mix")
    limiting = (f"its PLR of {plr:.1f} dB comes down to {needed_plr:g} dB there: about "
                f"{plr - needed_plr:.1f} dB of limiting" if plr - needed_plr > 0.5 else
                f"its PLR of {plr:.1f} dB fits: no limiting needed")
    return _view(t, None, None, None, (
        f"{t.integrated_lufs:g} LUFS under {t.true_peak_max_dbtp:g} dBTP: {change}; "
        f"{limiting}"))
