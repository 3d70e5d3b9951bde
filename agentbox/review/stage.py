"""The stage of the work a file is at, which decides how it is judged: a mix goes
to mastering (judged on what a mastering engineer asks for, never on its
loudness), a master goes to its platform (judged against its delivery target).

The stage comes, first to last: from a re-judgment asked for on a review (its
other stage, for the same bytes); from the event, for the one file
(`payload.stage`); from the event, for its project from now on
(`payload.project_stage`); from the watch folder (`agentbox watch --stage`, sent as
`payload.default_stage`); from the project (the stage remembered for it, only when
the musician said so for the project); from the configuration (`mix_stage`); and
otherwise weighed from the file's evidence (`evidence`: a lossy codec, 16-bit PCM
and its dither, a release's tags, the file name's words, a limiter's signature,
against 24-bit or float, headroom and no tags) with the project's last export's
stage (a project does not flip between two renders of one song without strong
evidence). An explicit stage for the one file always beats a remembered one: a
master sent once does not make the project's later mixes masters. Every review
says in one sentence which stage it judged, the evidence, and how to change it.

When the evidence is split, the review is judged at the side it leans to, its
verdict holds under both readings (agentbox.review.agent judges the other reading
too), and its sentence gives the first fix under each and the one click that
settles it (`both_readings`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from agentbox.review.figures import tenths
from agentbox.review.words import FIRST_FIXES

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
    split: bool = False  # the evidence is split: judged under both readings
    readings: Readings | None = None  # split: the first fix under each reading


@dataclass(frozen=True)
class Readings:
    """The first fix under each reading of split evidence, as its note says it."""

    mix: str
    master: str


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


def choose(given: Given, heard: Mapping[str, Any], name: str = "",
           before: Before | None = None) -> Stage:
    """The stage to judge at, and the sentence that says why: a stage said for this
    file beats the one remembered for its project; with none said, the file's
    evidence (`heard`: its measurements; `name`: its file name) and the project's
    last export (`before`) decide."""
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
    return inferred(heard, name, before)


# -- the stage from the file's evidence ------------------------------------------------------------


@dataclass(frozen=True)
class Clue:
    """One piece of evidence: `weight` toward a master (+) or a mix (-), in words."""

    weight: int
    words: str


@dataclass(frozen=True)
class Before:
    """The project's last export, as the stage reads it: a project does not flip
    between two renders of one song without evidence."""

    stage: str  # "mix" or "master"
    called: str  # "the 14:02:37 export"


# How much each piece of evidence weighs; MASTER_AT or more is a master, MIX_AT or
# less a mix, anything between is split (both readings, and a question).
MASTER_AT, MIX_AT = 2, -2
STRONG = 4  # evidence this strong turns a project's stage; weaker follows it
LOSSY_WEIGHT = 3  # a lossy file is a release's copy: mixes go to mastering lossless
SESSION_RATES = (48_000, 88_200, 96_000, 176_400, 192_000)
PINNED_SHARE = 0.15  # a limiter holds a ceiling: its peaks meet it this often
FLAT_RUNS = 10  # flat-topped runs at full scale: a clipper or a limiter at 0 dBFS
STEADY_LRA_LU, STEADY_PLR_DB = 4.0, 12.0  # a short-term loudness that barely moves
HEADROOM_DBTP = -3.0  # peaks this far under full scale: a mix's headroom
MASTER_WORDS = frozenset({"master", "mastered", "final", "release", "remaster"})
MIX_WORDS = frozenset({"mix", "mixdown", "bounce", "rough", "premaster", "demo", "stem",
                       "stems"})


def evidence(heard: Mapping[str, Any], name: str = "") -> list[Clue]:
    """What the file says of its stage: its codec, bit depth and rate, its tags, its
    name's words, a limiter's signature, its headroom."""
    return [clue for clue in (*_format_clues(heard), _tag_clue(heard), _name_clue(name),
                              *_limiter_clues(heard), _headroom_clue(heard))
            if clue is not None]


def _format_clues(heard: Mapping[str, Any]) -> list[Clue]:
    bits, rate = heard.get("bit_depth"), int(heard.get("sample_rate") or 0)
    fmt = str(heard.get("file_format") or "")
    if bits is None:
        return [Clue(LOSSY_WEIGHT, f"a lossy {fmt} file, as releases are shipped")]
    if bits == 16:
        dither = " with dither in its quiet stretches" if heard.get("dithered") else ""
        return [Clue(3 if dither else 2, f"16-bit PCM{dither}, as releases are delivered")]
    if bits >= 24:
        depth = "float" if heard.get("sample_format") in ("FLOAT", "DOUBLE") else f"{bits}-bit"
        at_session = rate in SESSION_RATES
        where = f"{depth} at {rate / 1000:g} kHz"
        return [Clue(-1, f"{where}, a session's resolution" if at_session
                     else f"{where}, as a session exports")]
    return []


def _tag_clue(heard: Mapping[str, Any]) -> Clue | None:
    tags = [str(tag) for tag in heard.get("tags") or []]
    if tags:
        return Clue(2 if len(tags) >= 2 else 1, f"tagged with its {_listed(tags)}")
    if heard.get("bit_depth") is not None and heard.get("bit_depth") != 16:
        return Clue(-1, "no release tags")
    return None


def _name_clue(name: str) -> Clue | None:
    words = set(re.split(r"[^a-z]+", Path(name).stem.lower()))
    if words & MASTER_WORDS:
        return Clue(2, f"its name says {sorted(words & MASTER_WORDS)[0]!r}")
    if words & MIX_WORDS:
        return Clue(-2, f"its name says {sorted(words & MIX_WORDS)[0]!r}")
    return None


def _limiter_clues(heard: Mapping[str, Any]) -> list[Clue]:
    found = []
    peak, loudness, plr = (heard.get(key) for key in ("true_peak_dbtp", "integrated_lufs",
                                                      "plr_db"))
    sample_peak, pinned = heard.get("sample_peak_dbfs"), heard.get("peaks_pinned")
    if looks_mastered(peak, loudness, plr):
        assert peak is not None and loudness is not None
        found.append(Clue(STRONG, f"limited close to full scale (true peak "
                                  f"{tenths(peak, True)} dBTP) at streaming loudness "
                                  f"({tenths(loudness)} LUFS)"))
    if (pinned is not None and sample_peak is not None and pinned >= PINNED_SHARE
          and sample_peak >= HEADROOM_DBTP):
        found.append(Clue(2, f"its peaks pinned under one ceiling ({tenths(sample_peak, True)} "
                             f"dBFS, met in {round(pinned * 100)} % of its loud moments)"))
    runs = int(heard.get("clipped_runs") or 0)
    if runs >= FLAT_RUNS:
        found.append(Clue(1, f"{runs} flat-topped runs at full scale"))
    lra = heard.get("loudness_range_lu")
    if (lra is not None and plr is not None and lra <= STEADY_LRA_LU and plr <= STEADY_PLR_DB
            and float(heard.get("duration_seconds") or 0) >= 30):
        found.append(Clue(1, f"a short-term loudness that barely moves (LRA {tenths(lra)} LU, "
                             f"PLR {tenths(plr)} dB)"))
    return found


def _headroom_clue(heard: Mapping[str, Any]) -> Clue | None:
    peak = heard.get("true_peak_dbtp")
    if peak is not None and peak <= HEADROOM_DBTP:
        return Clue(-1, f"peaks {tenths(-peak)} dB under full scale, a mix's headroom")
    return None


def score(clues: list[Clue]) -> int:
    return sum(clue.weight for clue in clues)


def looks_mastered(true_peak: float | None, loudness: float | None,
                   plr: float | None) -> bool:
    return (true_peak is not None and loudness is not None and plr is not None
            and true_peak >= MASTERED_PEAK_DBTP and loudness >= MASTERED_LOUDNESS_LUFS
            and plr <= MASTERED_PLR_DB)


def inferred(heard: Mapping[str, Any], name: str = "", before: Before | None = None
             ) -> Stage:
    """The stage the evidence points to: a master, a mix, or split (judged at the
    side it leans to, or the project's stage, and said to be a question)."""
    clues = evidence(heard, name)
    total = score(clues)
    leaning = StageName.MASTER if total > 0 else StageName.MIX
    if before is not None and before.stage != leaning and abs(total) < STRONG:
        held = StageName(before.stage)
        if MIX_AT < total < MASTER_AT:
            return Stage(held, AUTO, split(held, clues, before), split=True)
        return Stage(held, AUTO, _said(held.value, (
            f"no stage was given, and {before.called} of the project was judged a "
            f"{held.value}; this file's evidence ({_weighed(clues)}) is not enough to "
            "change that")))
    if MIX_AT < total < MASTER_AT:
        return Stage(leaning, AUTO, split(leaning, clues, before), split=True)
    looks = "it looks mastered" if leaning == StageName.MASTER else "it looks like a mix"
    turned = "" if before is None or before.stage == leaning else (
        f", unlike {before.called} of the project")
    return Stage(leaning, AUTO, _said(leaning.value, (
        f"no stage was given and {looks}{turned}: {_weighed(clues)}")))


def split(stage: StageName, clues: list[Clue], before: Before | None) -> str:
    """The sentence for split evidence, before the first fixes are known (the review
    adds them: `both_readings`)."""
    held = "" if before is None or before.stage != stage else (
        f", as {before.called} of the project was")
    return (f"Judged as a {stage.value}{held}, but the evidence is split: "
            f"{_weighed(clues)}. The verdict holds under both readings.")


def both_readings(reason: str, as_mix: str, as_master: str) -> str:
    """The split sentence with the first fix under each reading, and how to choose."""
    return (f"{reason}{FIRST_FIXES}{as_mix}; as a master: {as_master}. "
            "Judge it as a master or as a mix with one click on its page (or send it "
            "with agentbox send --stage master, or --stage mix).")


def _weighed(clues: list[Clue]) -> str:
    """The evidence in words: what marks a master, then what marks a mix."""
    master = [clue.words for clue in clues if clue.weight > 0]
    mix = [clue.words for clue in clues if clue.weight < 0]
    said = []
    if master:
        said.append(f"for a master, {_listed(master)}")
    if mix:
        said.append(f"for a mix, {_listed(mix)}")
    return "; ".join(said) or "nothing in the file marks either"


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _said(stage: str, why: str) -> str:
    other = "master" if stage == "mix" else "mix"
    judged = ("Judged as a mix going to mastering" if stage == "mix"
              else "Judged as a master against its delivery target")
    return (f"{judged}: {why}. To judge it as a {other}, send it with stage {other} "
            f"(agentbox send --stage {other}, or \"stage\": \"{other}\" in the payload).")
