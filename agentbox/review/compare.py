"""A review beside others: the project's previous export, and a reference track.

Both are a bonus: a previous export that cannot be read, or a reference that
cannot be measured, is said so in the review and never fails it.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentbox.archive.history import History
from agentbox.engine.agents import AgentContext, PermanentAgentError, RetryableAgentError
from agentbox.review.analysis import Analysis, local_path
from agentbox.review.figures import local_time, rounded, tenths
from agentbox.review.model import Comparison, MixMetrics, MixReview, ReferenceView, as_review
from agentbox.review.present import mix_name
from agentbox.review.reference import Track

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
            found[name] = rounded(float(a) - float(b), 2)
    return found


@dataclass(frozen=True)
class Previous:
    """The project's export before this one, as the review reads it."""

    run_id: str | None = None  # None: the project's first export (or unreadable)
    accepted_at: str = ""
    review: MixReview | None = None
    unreadable: bool = False  # the store could not be read: no comparison, no stage

    @property
    def called(self) -> str:
        """How the notes name it: to the second, as two exports may share a minute."""
        return f"the {local_time(self.accepted_at, seconds=True)} export"


async def previous_export(ctx: AgentContext, project: str) -> Previous:
    """The project's previous reviewed export (the comparison's, and the stage's when
    one was given for the project); never an error: the comparison is a bonus."""
    history = ctx.service(History)
    if history is None or not project:
        return Previous()
    try:
        found = await history.previous_export(project, agent=ctx.agent,
                                              before_run_id=ctx.run_id)
    except Exception:
        ctx.log.warning("the previous export could not be read", exc_info=True)
        return Previous(unreadable=True)
    review = None if found is None else as_review(found.result)
    if found is None or review is None:
        return Previous()
    return Previous(found.run_id, found.accepted_at, review)


def given_stage(previous: Previous) -> str | None:
    """The stage remembered for the project, as its previous export carried it: only
    one the musician gave for the project (payload.project_stage), never one given
    for a single file."""
    review = previous.review
    return None if review is None else review.project_stage


def compare_with_previous(previous: Previous, m: MixMetrics, ceiling: float) -> Comparison:
    """This export beside the project's previous one; `ceiling`: the true peak this
    one is held under (a master's target's, a mix's full scale)."""
    if previous.unreadable:
        return Comparison(previous_run_id=None, note="The previous export could not be read.")
    if previous.review is None or previous.run_id is None:
        return Comparison(previous_run_id=None, note=(
            "The first export of this project: later exports will be compared with it."))
    old = previous.review.metrics
    changes = deltas(m, old)
    return Comparison(previous_run_id=previous.run_id,
                      previous_accepted_at=previous.accepted_at, deltas=changes,
                      note=_comparison_note(changes, m, old, ceiling, previous.called))


def _comparison_note(changes: dict[str, float], new: MixMetrics, old: MixMetrics,
                     ceiling: float, when: str) -> str:
    loudness = changes.get("integrated_lufs")
    if loudness is None:
        parts = [f"Compared with {when}"]
    elif abs(loudness) < 0.1:
        parts = [f"As loud as {when}"]
    else:
        louder = "louder" if loudness > 0 else "quieter"
        parts = [f"{tenths(abs(loudness))} LU {louder} than {when}"]
    over_now = new.true_peak_dbtp is not None and new.true_peak_dbtp > ceiling
    over_then = old.true_peak_dbtp is not None and old.true_peak_dbtp > ceiling
    if over_now and not over_then:
        parts.append("true peak now over the ceiling")
    elif over_then and not over_now:
        parts.append("true peak now under the ceiling")
    elif abs(changes.get("true_peak_dbtp", 0.0)) >= 0.5:
        parts.append(f"true peak {tenths(changes['true_peak_dbtp'], True)} dB")
    if abs(changes.get("loudness_range_lu", 0.0)) >= 1.0:
        parts.append(f"loudness range {tenths(changes['loudness_range_lu'], True)} LU")
    if new.clipped_runs and not old.clipped_runs:
        parts.append("clipping is new")
    elif old.clipped_runs and not new.clipped_runs:
        parts.append("the clipping is gone")
    if abs(changes.get("duration_seconds", 0.0)) >= 1.0:
        longer = changes["duration_seconds"]
        parts.append(f"{tenths(abs(longer))} s {'longer' if longer > 0 else 'shorter'}")
    return "; ".join(parts) + "."


async def measure_reference(url: str, ctx: AgentContext, analysis: Analysis
                            ) -> Track | ReferenceView:
    """The event's reference track measured, or, when it cannot be measured, the
    reference part of the review that says so (it never fails the review)."""
    try:
        raw, file = await analysis.measure(local_path(url), url, ctx)
    except (PermanentAgentError, RetryableAgentError) as exc:
        return ReferenceView(file=mix_name(url) or url, error=str(exc), source="event",
                             note=f"The reference track could not be measured: {exc}")
    return Track(MixMetrics(**raw), file.name, "event")
