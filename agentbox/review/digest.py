"""A run told for people, in the terminal: the verdict, the headline figures, the
notes in order.

`agentbox send --wait`, `show`, `runs`, `watch` and the desktop notification
speak of a mix review with these functions. They read the review through
agentbox.review.present (what a stored document holds; what is missing is left
out). Every text taken from a run is made one line (`one_line`), so that a
newline in a file or project name cannot forge a line of agentbox's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentbox.logs import one_line
from agentbox.review.figures import FIGURE_NAMES, change_unit, finite, local_time, tenths
from agentbox.review.present import Review, TargetRow, read

# The headline figures, in the order people read them: metrics key, label, unit.
HEADLINE = (
    ("integrated_lufs", "", "LUFS"),
    ("true_peak_dbtp", "true peak ", "dBTP"),
    ("loudness_range_lu", "LRA ", "LU"),
    ("plr_db", "PLR ", "dB"),
)


def metrics_of(result: Any) -> Mapping[str, Any]:
    review = read(result)
    return review.metrics if review else {}


def headline(result: Any) -> str:
    """`-9.8 LUFS · true peak +0.4 dBTP · LRA 5.2 LU · PLR 10.2 dB` (what is known)."""
    review = read(result)
    return _headline(review) if review else ""


def _headline(review: Review) -> str:
    parts = []
    for key, label, unit in HEADLINE:
        value = review.figure(key)
        if value is not None:
            shown = tenths(value, signed=key == "true_peak_dbtp")
            parts.append(f"{label}{shown} {unit}")
    if not parts and "integrated_lufs" in review.metrics:
        parts.append("silence (no loudness to measure)")
    return " · ".join(parts)


def file_name(run: Mapping[str, Any]) -> str:
    """The reviewed file's name (the review's), else the run view's `file` (the name
    the event's payload gives, for a run that was not reviewed: queued, retrying,
    failed)."""
    review = read(run.get("result"))
    if review is not None and review.file_name:
        return one_line(review.file_name)
    named = run.get("file")
    return one_line(named) if isinstance(named, str) else ""


def project_of(run: Mapping[str, Any]) -> str:
    """The run view's `project`, else the review's `project_id`."""
    project = run.get("project")
    if not isinstance(project, str):
        review = read(run.get("result"))
        project = review.project if review else None
    return one_line(project) if project else ""


def run_verdict(run: Mapping[str, Any], review: Review | None = None) -> str:
    """pass / warn / fail for a review; the run's status for anything else.
    `review`: the run's result, when it has been read already."""
    if run.get("status") == "succeeded" and review is None:
        review = read(run.get("result"))
    if run.get("status") == "succeeded" and review is not None and review.verdict:
        return review.verdict
    return one_line(run.get("status", ""))


def notes(result: Any) -> list[tuple[str, str]]:
    """(severity, text) in the review's order (what to fix first); severity may be ''."""
    review = read(result)
    return [(n.severity, one_line(n.text)) for n in review.notes] if review else []


def comparison(result: Any) -> list[str]:
    """The comparison with the project's previous export, as lines (none if absent)."""
    review = read(result)
    return _comparison(review.comparison) if review else []


def _comparison(found: Mapping[str, Any]) -> list[str]:
    if not found:
        return []
    previous = found.get("previous_run_id")
    if previous is None:
        return ["First export of this project: nothing to compare with yet."]
    when = found.get("previous_accepted_at")
    lines = ["Compared with the previous export ("
             + (f"{one_line(local_time(when, seconds=True))}, " if isinstance(when, str)
                else "")
             + f"{one_line(previous)}):"]
    deltas = found.get("deltas")
    if isinstance(deltas, Mapping):
        order = {key: i for i, key in enumerate(FIGURE_NAMES)}  # as the page reads them
        changes = [_delta(str(name), change) for name, value in
                   sorted(deltas.items(), key=lambda item: order.get(item[0], len(order)))
                   if (change := finite(value)) is not None and round(change, 1) != 0]
        if changes:
            lines.append("  " + ", ".join(changes))
    if found.get("note"):
        lines.append("  " + one_line(found["note"]))
    return lines


def _delta(key: str, change: float) -> str:
    """"Integrated loudness +2.6 LU" for a figure the page names, else its key."""
    name, unit, digits = FIGURE_NAMES.get(key, (key.replace("_", " "), "", 1))
    unit = change_unit(unit)
    return f"{one_line(name)} {change:+.{digits}f}" + (f" {unit}" if unit else "")


def targets(result: Any) -> list[str]:
    """One line per delivery target: what its normalisation would do to the mix."""
    review = read(result)
    return _target_lines(review) if review else []


def _target_lines(review: Review) -> list[str]:
    """The platform rows, their titles in one column as wide as the widest, then what
    they all share, said once (a review from before that has none: its rows say it)."""
    width = max((len(one_line(t.title)) for t in review.targets), default=0)
    shared = [f"  {one_line(review.targets_note)}"] if review.targets_note else []
    return [_target_line(t, width) for t in review.targets] + shared


def _target_line(t: TargetRow, width: int = 36) -> str:
    said = t.gain_db is not None or t.verdict
    return (f"  {one_line(t.title):<{width}}"
            + (f" {tenths(t.gain_db, signed=True):>6} dB" if t.gain_db is not None else "")
            + (f"  {t.verdict}" if t.verdict else "")
            + ((": " if said else "  ") + one_line(t.note) if t.note else ""))


def review_lines(run: Mapping[str, Any], name: str | None = None) -> list[str]:
    """A finished run for people: verdict, figures, notes, comparison; or why it failed.
    `name`: what to call the file (default: the review's file name, else the run id)."""
    name = one_line(name) if name else file_name(run) or one_line(run.get("run_id", ""))
    status = run.get("status")
    if status != "succeeded":
        error = run.get("error_code")
        why = (f": {one_line(error)}: {one_line(run.get('error_message') or '')}"
               if error else "")
        return [f"{name}: {one_line(status)}{why}"]
    review = read(run.get("result"))
    if review is None or not review.metrics:
        return [f"{name}: succeeded"]
    return [f"{name}: {run_verdict(run, review)}", f"  {_headline(review)}",
            *_body(review, one_line(run.get("run_id", "")))]


def asked(review: Review, ref: str) -> list[str]:
    """The question a review with split evidence of its stage asks, in words, with
    the command that settles it ([] when it does not ask)."""
    fixes = review.asks
    if fixes is None:
        return []
    return ["Is it a master or a mix? Its evidence is split; the verdict holds under both.",
            f"  As a master, the first fix: {one_line(fixes['master'])}.",
            f"  As a mix, the first fix: {one_line(fixes['mix'])}.",
            f"  Settle it: agentbox rejudge {ref or 'REF'} --stage master (or --stage mix)"]


def _body(review: Review, ref: str = "") -> list[str]:
    lines = [f"  {one_line(review.summary)}"] if review.summary else []
    lines += asked(review, ref)
    if review.stage_reason:
        lines.append(f"  {one_line(review.stage_reason)}")
    if review.notes:
        lines.append("Notes, what to fix first:")
        lines += [f"  {i}. " + (f"[{n.severity}] " if n.severity else "") + one_line(n.text)
                  for i, n in enumerate(review.notes, 1)]
    if review.targets:
        lines += ["Once mastered, for each platform:" if review.stage == "mix" else
                  "Delivery targets (gain their normalisation applies):",
                  *_target_lines(review)]
    return lines + _comparison(review.comparison)


def short(run: Mapping[str, Any]) -> str:
    """One line: `night-drive.wav: pass · -14.2 LUFS · true peak -1.1 dBTP · …`."""
    name = file_name(run) or one_line(run.get("run_id", ""))
    if run.get("status") != "succeeded":
        error = run.get("error_code")
        return f"{name}: {one_line(run.get('status'))}" + (f" ({one_line(error)})"
                                                           if error else "")
    review = read(run.get("result"))
    figures = _headline(review) if review else ""
    return f"{name}: {run_verdict(run, review)}" + (f" · {figures}" if figures else "")
