"""The stage of the work a file is at, which decides how it is judged: a mix goes
to mastering (judged on what a mastering engineer asks for, never on its
loudness), a master goes to its platform (judged against its delivery target).

The stage comes, first to last: from the event (`payload.stage`); from the project
(the last stage given for it sticks); from the watch folder (`agentbox watch
--stage`, sent as `payload.default_stage`); from the configuration (`mix_stage`);
and otherwise from the file itself: limited close to full scale at streaming
loudness with a low peak-to-loudness ratio, it looks mastered; anything else is
a mix. Every review says in one sentence which stage it judged, why, and how to
change it.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a master looks like to `auto`: its true peak close to full scale (a limiter's
# ceiling), its loudness at or above the quietest streaming normalisation (Apple
# Music, -16 LUFS), and a peak-to-loudness ratio a limiter leaves (a master at
# -14 LUFS under -1 dBTP has 13 dB; an unlimited mix has 15-20).
MASTERED_PEAK_DBTP = -2.0
MASTERED_LOUDNESS_LUFS = -16.0
MASTERED_PLR_DB = 14.0
STAGES = ("mix", "master")  # a mix goes to mastering; a master to its platform
AUTO = "auto"
CONFIG_STAGES = (AUTO, *STAGES)


@dataclass(frozen=True)
class Stage:
    stage: str  # "mix" or "master"
    source: str  # "event", "project", "watch", "config" or "auto"
    reason: str  # one sentence: which stage, why, how to change it


@dataclass(frozen=True)
class Given:
    """What was said about the stage, before the file is listened to."""

    event: str | None = None  # payload.stage
    project: str | None = None  # the last stage given for the project
    project_name: str = ""
    project_since: str = ""  # when it was given ("the 14:02 export")
    watch: str | None = None  # payload.default_stage (a watch folder's --stage)
    config: str = AUTO  # mix_stage


def choose(given: Given, true_peak: float | None, loudness: float | None,
           plr: float | None) -> Stage:
    """The stage to judge at, and the sentence that says why."""
    if given.event:
        return Stage(given.event, "event", _said(
            given.event, f'the export says so ("stage": "{given.event}"); later exports '
            "of this project are judged so too until another stage is given"))
    if given.project:
        since = f", on {given.project_since}" if given.project_since else ""
        return Stage(given.project, "project", _said(
            given.project, f"it is the last stage given for the project "
            f"{given.project_name!r}{since}"))
    if given.watch:
        return Stage(given.watch, "watch", _said(
            given.watch, f"the watched folder says so (agentbox watch --stage {given.watch})"))
    if given.config in ("mix", "master"):
        return Stage(given.config, "config", _said(
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
        return Stage("master", AUTO, _said("master", (
            f"no stage was given and it looks mastered: limited close to full scale "
            f"(true peak {true_peak:+.1f} dBTP) at streaming loudness ({loudness:.1f} LUFS) "
            f"with a low peak-to-loudness ratio ({plr:.1f} dB)")))
    why = "no stage was given and it does not look mastered"
    if true_peak is not None and loudness is not None:
        why += f" ({loudness:.1f} LUFS, true peak {true_peak:+.1f} dBTP"
        why += f", PLR {plr:.1f} dB)" if plr is not None else ")"
    return Stage("mix", AUTO, _said("mix", why))


def _said(stage: str, why: str) -> str:
    other = "master" if stage == "mix" else "mix"
    judged = ("Judged as a mix going to mastering" if stage == "mix"
              else "Judged as a master against its delivery target")
    return (f"{judged}: {why}. To judge it as a {other}, send it with stage {other} "
            f"(agentbox send --stage {other}, or \"stage\": \"{other}\" in the payload).")
