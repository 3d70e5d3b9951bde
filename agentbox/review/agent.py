"""The built-in `mix_review` agent: it listens to the rendered mix and says what a
mastering engineer would say about its level, peaks and mono compatibility.

The agent only puts the review together: the file is measured in an analysis
process (agentbox.review.analysis), judged by the one judge
(agentbox.review.judge), set beside the project's previous export
(agentbox.review.compare) and a reference track, the event's or the project's
(agentbox.review.reference), and, when a model is configured, given notes in
prose (agentbox.review.llm).
"""

from __future__ import annotations

import asyncio

from agentbox.archive import Archive
from agentbox.engine.agents import AgentContext, PermanentAgentError
from agentbox.events import Event
from agentbox.review.analysis import Analysis, local_path
from agentbox.review.compare import compare_with_previous, measure_reference
from agentbox.review.judge import judge, with_profile
from agentbox.review.llm import LlmSettings, llm_notes
from agentbox.review.model import MixReview, ProfileView
from agentbox.review.profiles import DEFAULT_PROFILE, PROFILES, Profile
from agentbox.review.reference import Track, against, on_its_curve, project_reference


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
    settings = ctx.settings
    profile = choose_profile(getattr(payload, "profile", None)
                             or (settings.mix_profile if settings else None))
    archive = ctx.service(Archive)  # keeps the bytes reviewed, when the app has one
    measured, file = await analysis.measure(local_path(mix_url), mix_url, ctx,
                                            archive.incoming if archive else None)
    if archive is not None and file.sha256 and file.size_bytes is not None:
        archive.keep(run_id=ctx.run_id, project=project_id, sha256=file.sha256,
                     size=file.size_bytes, file_name=file.name)
    metrics = with_profile(measured, profile)
    # The event's reference track wins for this event; else the project's, if any.
    reference_url = getattr(payload, "reference_url", None)
    track = await measure_reference(str(reference_url), ctx, analysis) if reference_url \
        else await project_reference(ctx, project_id)
    reference = track if not isinstance(track, Track) else None
    if isinstance(track, Track):
        metrics = on_its_curve(metrics, track)
        reference = against(metrics, track)
    comparison = await compare_with_previous(ctx, project_id, metrics, profile)
    judged = judge(metrics, profile, comparison, reference)
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
        file=file,
        targets=judged.targets,
        comparison=comparison,
        reference=reference,
        notes=judged.notes,
    )


def choose_profile(name: str | None) -> Profile:
    """The event's profile, else AGENTBOX_MIX_PROFILE, else streaming."""
    chosen = name or DEFAULT_PROFILE
    profile = PROFILES.get(chosen)
    if profile is None:
        raise PermanentAgentError(f"unknown profile {chosen!r}; use one of "
                                  f"{', '.join(PROFILES)}", "unknown_profile")
    return profile
