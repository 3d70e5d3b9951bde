"""The stage of the work a file is at, which decides how it is judged: a mix goes
to mastering (judged on what a mastering engineer asks for, never on its
loudness), a master goes to its platform (judged against its delivery target).

The stage comes, first to last: from a re-judgment asked for on a review (its
other stage, for the same bytes); from the event, for the one file
(`payload.stage`); from the event, for its project from now on
(`payload.project_stage`); from the watch folder (`agentbox watch --stage`, sent as
`payload.default_stage`); from the project (the stage remembered for it, only when
the musician said so for the project); from the configuration (`mix_stage`); and
otherwise from the file itself: limited close to full scale at streaming loudness
with a low peak-to-loudness ratio, it looks mastered; anything else is a mix. An
explicit stage for the one file always beats a remembered one: a master sent once
does not make the project's later mixes masters. Every review says in one sentence
which stage it judged, why, and how to change it.

From the file alone the stage is sometimes ambiguous: a file that peaks at full
scale like a limited master but is quieter than -16 LUFS, or more open than a
PLR of 14 dB, may be a hot mix or a dynamic master (orchestral, ambient, much game
music). It is judged as a mix, and its sentence says that it is ambiguous, the
first fix under each reading, and how to choose.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agentbox.review.profiles import DEFAULT_PROFILE, PROFILES

# What a master looks like to `auto`: its true peak close to full scale (a limiter's
# ceiling), its loudness at or above the quietest streaming normalisation (Apple
# Music, -16 LUFS), and a peak-to-loudness ratio a limiter leaves (a master at
# -14 LUFS under -1 dBTP has 13 dB; an unlimited mix has 15-20).
MASTERED_PEAK_DBTP = -2.0
MASTERED_LOUDNESS_LUFS = -16.0
MASTERED_PLR_DB = 14.0
class StageName(StrEnum):
    """The stage of the work: a mix goes to mastering, a master to its platform."""

    MIX = "mix"
    MASTER = "master"


STAGES = tuple(stage.value for stage in StageName)  # ("mix", "master"), as options say them
AUTO = "auto"
CONFIG_STAGES = (AUTO, *STAGES)


@dataclass(frozen=True)
class Stage:
    """The stage a review judges, where it came from, and the sentence saying so."""

    stage: StageName
    source: str  # "rejudge", "event", "project", "watch", "config" or "auto"
    reason: str  # one sentence: which stage, why, how to change it


@dataclass(frozen=True)
class Given:
    """What was said about the stage, before the file is listened to."""

    event: str | None = None  # payload.stage: this file only
    project: str | None = None  # the stage remembered for the project
    project_name: str = ""
    project_since: str = ""  # when it was given ("the 14:02 export")
    project_now: bool = False  # `project` was given by this very event (project_stage)
    watch: str | None = None  # payload.default_stage (a watch folder's --stage)
    config: str = AUTO  # mix_stage
    rejudge: str | None = None  # a re-judgment's stage (payload.stage with rejudge_of)
    rejudged: str = ""  # the review re-judged, as the notes name it ("the 14:02 export")


def choose(given: Given, true_peak: float | None, loudness: float | None,
           plr: float | None) -> Stage:
    """The stage to judge at, and the sentence that says why: a stage said for this
    file beats the one remembered for its project."""
    if given.rejudge:
        return Stage(StageName(given.rejudge), "rejudge", _said(
            given.rejudge, f"re-judged at your request, the same audio as "
            f"{given.rejudged or 'an earlier review'}"))
    if given.event:
        return Stage(StageName(given.event), "event", _said(
            given.event, f'the export says so ("stage": "{given.event}", for this file '
            "only)"))
    if given.project and given.project_now:
        return Stage(StageName(given.project), "project", _said(
            given.project, f'the export says so for the project ("project_stage": '
            f'"{given.project}"); its later exports are judged so too unless they say '
            "otherwise"))
    if given.watch:
        return Stage(StageName(given.watch), "watch", _said(
            given.watch, f"the watched folder says so (agentbox watch --stage {given.watch})"))
    if given.project:
        since = f", on {given.project_since}" if given.project_since else ""
        return Stage(StageName(given.project), "project", _said(
            given.project, f"it is the stage remembered for the project "
            f"{given.project_name!r}{since}"))
    if given.config in ("mix", "master"):
        return Stage(StageName(given.config), "config", _said(
            given.config, f'the configuration says so (mix_stage = "{given.config}", '
            "AGENTBOX_MIX_STAGE)"))
    return inferred(true_peak, loudness, plr)


def looks_mastered(true_peak: float | None, loudness: float | None,
                   plr: float | None) -> bool:
    return (true_peak is not None and loudness is not None and plr is not None
            and true_peak >= MASTERED_PEAK_DBTP and loudness >= MASTERED_LOUDNESS_LUFS
            and plr <= MASTERED_PLR_DB)


def inferred(true_peak: float | None, loudness: float | None, plr: float | None) -> Stage:
    if looks_mastered(true_peak, loudness, plr):
        assert true_peak is not None and loudness is not None and plr is not None
        return Stage(StageName.MASTER, AUTO, _said("master", (
            f"no stage was given and it looks mastered: limited close to full scale "
            f"(true peak {true_peak:+.1f} dBTP) at streaming loudness ({loudness:.1f} LUFS) "
            f"with a low peak-to-loudness ratio ({plr:.1f} dB)")))
    if true_peak is not None and loudness is not None and true_peak >= MASTERED_PEAK_DBTP:
        return Stage(StageName.MIX, AUTO, ambiguous(true_peak, loudness, plr))
    why = "no stage was given and it does not look mastered"
    if true_peak is not None and loudness is not None:
        why += f" ({loudness:.1f} LUFS, true peak {true_peak:+.1f} dBTP"
        why += f", PLR {plr:.1f} dB)" if plr is not None else ")"
    return Stage(StageName.MIX, AUTO, _said("mix", why))


def ambiguous(true_peak: float, loudness: float, plr: float | None) -> str:
    """The sentence for a file that peaks like a master but is not as loud or as
    limited as one: both readings, each one's first fix, and how to choose."""
    quieter = f"{loudness:.1f} LUFS" + ("" if plr is None else f", PLR {plr:.1f} dB")
    target = PROFILES[DEFAULT_PROFILE].delivery
    as_mix = (f"as a mix, lower the mix bus by about {true_peak + 4.5:.0f} dB for "
              "mastering's headroom")
    over = true_peak - target.true_peak_max_dbtp
    as_master = (f"as a master, lower the limiter's ceiling by {over:.1f} dB (true peak "
                 f"{target.true_peak_max_dbtp:g} dBTP at most for streaming)" if over > 0.05
                 else f"as a master, nothing to fix in its peaks; the {target.title} "
                 f"target is {target.integrated_lufs:g} LUFS")
    return (f"Judged as a mix going to mastering, but from the file alone this is "
            f"ambiguous: no stage was given, and it peaks at {true_peak:+.1f} dBTP as a "
            f"limited master does, yet is quieter or more open than most masters "
            f"({quieter}), as a hot mix or a dynamic master (orchestral, ambient, much "
            f"game music) is. The first fix: {as_mix}; {as_master}. If it is a finished "
            "master, send it with stage master (agentbox send --stage master, or "
            "\"stage\": \"master\" in the payload); a mix needs nothing said.")


def _said(stage: str, why: str) -> str:
    other = "master" if stage == "mix" else "mix"
    judged = ("Judged as a mix going to mastering" if stage == "mix"
              else "Judged as a master against its delivery target")
    return (f"{judged}: {why}. To judge it as a {other}, send it with stage {other} "
            f"(agentbox send --stage {other}, or \"stage\": \"{other}\" in the payload).")
