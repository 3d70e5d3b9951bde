"""The built-in `mix_review` agent: it listens to the rendered mix and says what
a mastering engineer would say about it, for the stage the work is at.

The agent only puts the review together: the file is measured in an analysis
process (agentbox.review.analysis), its stage chosen (agentbox.review.stage), set
beside the project's previous export (agentbox.review.compare) and a reference
track, the event's or the project's (agentbox.review.reference), judged by the
one judge (agentbox.review.judge), and, when a model is configured, given notes
in prose (agentbox.review.llm).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentbox.archive import Archive
from agentbox.archive.history import History
from agentbox.engine.agents import AgentContext, PermanentAgentError, admission
from agentbox.events import Event
from agentbox.review import renders, stage, tonal
from agentbox.review.analysis import Analysis, local_path
from agentbox.review.compare import (
    Previous,
    compare_with_previous,
    given_stage,
    measure_reference,
    previous_export,
)
from agentbox.review.delivery import shared_note
from agentbox.review.genres import GENRES, Genre
from agentbox.review.judge import Judgement, ceiling, judge, verdict_for, with_profile
from agentbox.review.llm import LlmSettings, llm_notes
from agentbox.review.model import (
    SEVERITIES,
    Comparison,
    MixReview,
    ProfileView,
    ReferenceView,
    StageReadings,
    as_review,
)
from agentbox.review.profiles import DEFAULT_PROFILE, PROFILES, Profile
from agentbox.review.reference import Track, against, project_reference
from agentbox.review.settings import ReviewSettings
from agentbox.review.stage import Before, Given, Stage, StageName

# The folders a sender's files must be in (AGENTBOX_MIX_ROOTS), for the admission
# check, which is given the event only: the app sets them at its setup
# (confine_mixes); the review checks them again from its own settings.
_mix_roots: tuple[Path, ...] = ()


def confine_mixes(roots: tuple[Path, ...]) -> None:
    global _mix_roots
    _mix_roots = roots


def outside_roots(path: Path, roots: tuple[Path, ...]) -> str | None:
    """Why `path` may not be read (outside every root, its links followed); None: it
    may, or no roots are set."""
    if not roots:
        return None
    real = os.path.realpath(path)
    if any(os.path.commonpath([real, str(root)]) == str(root) for root in roots):
        return None
    return ("is outside the folders agentbox may read mixes from (AGENTBOX_MIX_ROOTS: "
            f"{os.pathsep.join(str(root) for root in roots)})")


async def mix_file_is_there(event: Event) -> list[dict[str, Any]]:
    """Refused before it is accepted: a mix_url that names no local file, as the
    review would find it (a look at the path, not a read of the file), or one (or a
    reference_url) outside AGENTBOX_MIX_ROOTS."""
    mix_url = getattr(event.payload, "mix_url", None)
    if not isinstance(mix_url, str):
        return []
    errors = []
    for field in ("mix_url", "reference_url"):
        url = getattr(event.payload, field, None)
        if url is None:
            continue
        try:
            path = local_path(str(url))
        except PermanentAgentError as exc:
            return [{"loc": ["payload", field], "msg": str(exc), "type": exc.code}]
        outside = await asyncio.to_thread(outside_roots, path, _mix_roots)
        if outside is not None:
            errors.append({"loc": ["payload", field], "type": "mix_outside_roots",
                           "msg": outside})
    if errors:
        return errors
    # In a thread: a path on a sleeping disk or a network share may take its time.
    if await asyncio.to_thread(local_path(mix_url).exists):
        await renders.identify(event, local_path(mix_url))  # Known: the latest export
        return []
    return [{"loc": ["payload", "mix_url"], "type": "mix_not_found", "msg": (
        "names no file on the machine agentbox runs on: check the path (an absolute path "
        "or a file:// URL) and that the render has been written")}]


@admission(mix_file_is_there, serial=renders.serial)
async def mix_review(event: Event, ctx: AgentContext) -> MixReview:
    """Measure the mix named by the event and review it against its profile."""
    analysis = ctx.service(Analysis)
    if analysis is not None:
        return await review(event, ctx, analysis)
    # A context made outside a server (a script, a test): an analysis of its own.
    analysis = Analysis.configured()
    try:
        return await review(event, ctx, analysis)
    finally:
        await asyncio.to_thread(analysis.shutdown)


async def review(event: Event, ctx: AgentContext, analysis: Analysis) -> MixReview:
    payload = event.payload
    project_id = str(getattr(payload, "project_id", ""))
    mix_url = str(getattr(payload, "mix_url", ""))
    settings = ctx.settings.of(ReviewSettings) if ctx.settings else ReviewSettings()
    profile = choose_profile(getattr(payload, "profile", None) or settings.mix_profile)
    roots = settings.mix_roots
    for url in (mix_url, getattr(payload, "reference_url", None)):
        outside = None if url is None else outside_roots(local_path(str(url)), roots)
        if outside is not None:
            raise PermanentAgentError(f"{url} {outside}", "mix_outside_roots")
    archive = ctx.service(Archive)  # keeps the bytes reviewed, when the app has one
    measured, file = await analysis.measure(local_path(mix_url), mix_url, ctx,
                                            archive.keeping if archive else None)
    if archive is not None and file.sha256 and file.size_bytes is not None:
        archive.keep(run_id=ctx.run_id, project=project_id, sha256=file.sha256,
                     size=file.size_bytes, file_name=file.name)
    previous = await previous_export(ctx, project_id)
    rejudged = await rejudged_export(ctx, payload)
    if rejudged is not None and rejudged.review is not None and rejudged.review.file:
        file = file.model_copy(update={"name": rejudged.review.file.name})
    stage = choose_stage(payload, settings, project_id, previous, measured, rejudged,
                         file.name)
    # The event's reference track wins for this event; else the project's, if any. Its
    # own balance stands in for the genre curve.
    reference_url = getattr(payload, "reference_url", None)
    track = await measure_reference(str(reference_url), ctx, analysis) if reference_url \
        else await project_reference(ctx, project_id)
    tonal_reference = None
    if isinstance(track, Track):
        tonal_reference = tonal.from_bands(f"{track.called} {track.name}",
                                           track.metrics.octave_bands)
    told = choose_genre(payload, previous)
    metrics = with_profile(measured, profile, stage.stage, tonal_reference, told)
    reference = against(metrics, track) if isinstance(track, Track) else track
    comparison = compare_with_previous(previous, metrics, ceiling(profile, stage.stage))
    judged = judge(metrics, profile, stage.stage, comparison, reference,
                   genre=tonal_reference is None, told=told)
    if stage.split:
        judged, stage = under_both(judged, stage, measured, profile, tonal_reference, told,
                                   comparison, reference)
    texts, source = [n.text for n in judged.notes], "rules"
    llm = LlmSettings.from_settings(settings)
    if llm is not None:
        prose = await llm_notes(llm, metrics, profile, project_id, ctx)
        if prose:
            texts, source = prose, "llm"
    return MixReview(
        project_id=project_id,
        summary=judged.summary,
        review_notes=texts,
        profile=ProfileView(**{k: v for k, v in profile.__dict__.items()
                               if k in ProfileView.model_fields}),
        metrics=metrics,
        notes_source=source,
        mix_url=mix_url,
        verdict=judged.verdict,
        stage=stage.stage,
        stage_reason=stage.reason,
        stage_source=stage.source,
        stage_split=stage.split,
        stage_readings=None if stage.readings is None else StageReadings(
            mix=stage.readings.mix, master=stage.readings.master),
        project_stage=remembered_stage(payload, previous),
        rejudge_of=None if rejudged is None else rejudged.run_id,
        file=file,
        targets=judged.targets,
        targets_note=shared_note(metrics, stage.stage),
        comparison=comparison,
        reference=reference,
        notes=judged.notes,
        genre=None if told is None else told.name,
    )


def under_both(judged: Judgement, chosen: Stage, measured: dict[str, Any], profile: Profile,
               tonal_reference: tonal.TonalReference | None, told: Genre | None,
               comparison: Comparison, reference: ReferenceView | None
               ) -> tuple[Judgement, Stage]:
    """Split evidence: the judgment at the chosen stage, with a verdict that holds
    under both readings (a note that is a fix under one reading only is something
    to consider), and the stage sentence given the first fix under each."""
    other = StageName.MIX if chosen.stage == StageName.MASTER else StageName.MASTER
    metrics = with_profile(measured, profile, other, tonal_reference, told)
    alternative = judge(metrics, profile, other, comparison, reference,
                        genre=tonal_reference is None, told=told)
    fixes = {note.code for note in alternative.notes if note.severity == "fix"}
    notes = sorted((note if note.severity != "fix" or note.code in fixes else
                    note.model_copy(update={"severity": "consider"}) for note in judged.notes),
                   key=lambda note: SEVERITIES.index(note.severity))
    held = replace(judged, notes=notes, verdict=verdict_for(notes))
    firsts = {chosen.stage: first_fix(held), other: first_fix(alternative)}
    reason = stage.both_readings(chosen.reason, firsts[StageName.MIX],
                                 firsts[StageName.MASTER])
    readings = stage.Readings(mix=firsts[StageName.MIX], master=firsts[StageName.MASTER])
    return held, replace(chosen, reason=reason, readings=readings)


def first_fix(judged: Judgement) -> str:
    """The first thing to change, as its note says it (its first sentence's advice),
    or that there is nothing."""
    first = next((note for note in judged.notes if note.severity in ("fix", "consider")),
                 None)
    if first is None:
        return "nothing to fix"
    sentence = first.text.split(". ")[0].rstrip(".")  # its first sentence
    return sentence[0].lower() + sentence[1:]


def choose_genre(payload: Any, previous: Previous) -> Genre | None:
    """The event's genre, else the last one given for the project (it sticks, as a
    stage does), else none."""
    name = getattr(payload, "genre", None) or (
        None if previous.review is None else previous.review.genre)
    return GENRES.get(name) if name else None


def choose_stage(payload: Any, settings: ReviewSettings, project: str, previous: Previous,
                 measured: dict[str, Any], rejudged: Previous | None = None,
                 name: str = "") -> Stage:
    """The stage from a re-judgment, the event (for the file, then for the project),
    the watch folder, the project's memory, the configuration, else the file
    (agentbox.review.stage)."""
    told = getattr(payload, "project_stage", None)
    given = Given(
        event=None if rejudged is not None else getattr(payload, "stage", None),
        project=remembered_stage(payload, previous), project_name=project,
        project_now=told in stage.STAGES,
        watch=getattr(payload, "default_stage", None),
        config=settings.mix_stage,
        rejudge=None if rejudged is None else getattr(payload, "stage", None),
        rejudged="" if rejudged is None else rejudged.called)
    return stage.choose(given, measured, name, stage_before(previous))


def stage_before(previous: Previous) -> Before | None:
    """The stage the project's last export was judged at, for the stage's evidence."""
    review = previous.review
    if review is None or review.stage not in stage.STAGES:
        return None
    return Before(str(review.stage), previous.called)


def remembered_stage(payload: Any, previous: Previous) -> str | None:
    """The stage the project remembers after this export: the one this event gives
    for the project ("auto" forgets it), else the one it remembered before."""
    told = getattr(payload, "project_stage", None)
    if told is not None:
        return told if told in stage.STAGES else None
    return given_stage(previous)


async def rejudged_export(ctx: AgentContext, payload: Any) -> Previous | None:
    """The review a re-judgment judges again (payload.rejudge_of), or None."""
    run_id = getattr(payload, "rejudge_of", None)
    history = ctx.service(History)
    if not run_id or history is None:
        return None
    found = await history.export(run_id)
    review = None if found is None else as_review(found.result)
    if found is None or review is None:
        raise PermanentAgentError(f"{run_id} is not a review agentbox has: nothing to "
                                  "judge again", "rejudge_unknown")
    return Previous(found.run_id, found.accepted_at, review)


def choose_profile(name: str | None) -> Profile:
    """The event's profile, else AGENTBOX_MIX_PROFILE, else streaming."""
    chosen = name or DEFAULT_PROFILE
    profile = PROFILES.get(chosen)
    if profile is None:
        raise PermanentAgentError(f"unknown profile {chosen!r}; use one of "
                                  f"{', '.join(PROFILES)}", "unknown_profile")
    return profile
