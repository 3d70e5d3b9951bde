"""Runs as people read them in a terminal: the review of a finished run, a run's row
in `agentbox runs`. What `agentbox`, the watched folders and the MCP tools print."""

from __future__ import annotations

import json
from typing import Any

from agentbox.review import digest


def line(value: Any) -> str:
    """Text from a run (an agent's message, an event's data) as one line of output:
    a newline in it cannot make a line of its own that looks like agentbox's."""
    return digest.one_line(value)


def is_review(result: Any) -> bool:
    """A result that validates as a mix review (another agent's may use its key names)."""
    from agentbox.review.model import as_review

    return as_review(result) is not None


def told(run: dict[str, Any], name: str | None = None) -> list[str]:
    """A finished run for people: the review, else its status and result as JSON."""
    result = run.get("result")
    if run.get("status") != "succeeded" or result is None or is_review(result):
        return digest.review_lines(run, name)
    return [f"{line(name or run['run_id'])}: succeeded", "result: " + json.dumps(result)]


RUN_COLUMNS = ("RUN", "STATUS", "PROJECT", "FILE", "LUFS", "TRUE PEAK", "VERDICT", "EVENT",
               "RETRIES", "ERROR")


def run_row(run: dict[str, Any]) -> tuple[str, ...]:
    """One run as the cells of `agentbox runs`."""
    metrics = digest.metrics_of(run.get("result"))
    loudness, peak = (metrics.get(k) for k in ("integrated_lufs", "true_peak_dbtp"))
    return (line(run["run_id"]), line(run["status"]), digest.project_of(run)[:32],
            digest.file_name(run)[:32],
            f"{loudness:.1f}" if isinstance(loudness, int | float) else "-",
            f"{peak:+.1f}" if isinstance(peak, int | float) else "-",
            _verdict_cell(run), line(run["event_type"]),
            str(run["retry_count"]), line(run["error_code"] or ""))


def _verdict_cell(run: dict[str, Any]) -> str:
    result = run.get("result")
    verdict = result.get("verdict") if isinstance(result, dict) else None
    return line(verdict) if isinstance(verdict, str) else "-"


def runs_table(found: list[dict[str, Any]]) -> list[str]:
    """The lines of `agentbox runs`: a header, then a row per run, columns aligned."""
    rows = [RUN_COLUMNS, *(run_row(run) for run in found)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(RUN_COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            .rstrip() for row in rows]


def show_lines(run: dict[str, Any]) -> list[str]:
    """`agentbox show`: the run, its history, its review (or result) and callbacks."""
    lines = [f"{run['run_id']}  {run['status']}  {run['event_type']} from {run['source']} "
             f"(event {run['event_id']})",
             f"agent {run['agent']}, attempt {run['attempt']}, retries {run['retry_count']}"
             + (f", {line(run['error_code'])}: {line(run['error_message'])}"
                if run["error_code"] else "")]
    if digest.project_of(run):
        lines.append(f"project {digest.project_of(run)}")
    if digest.file_name(run):
        lines.append(f"file {digest.file_name(run)}")
    if run.get("body_removed_at"):
        lines.append(f"event body removed by retention at {run['body_removed_at']} "
                     "(the run cannot be replayed)")
    if run["correlation_id"] or run["hop"]:
        lines.append(f"chain {run['correlation_id']}, caused by {run['causation_id']}, "
                     f"hop {run['hop']}")
    lines.append("\nhistory:")
    for change in run["history"]:
        note = f"  ({line(change['note'])})" if change["note"] else ""
        lines.append(f"  {change['at']}  {change['status']:<16} attempt "
                     f"{change['attempt']}{note}")
    result = run.get("result")
    if is_review(result):
        lines.append("\n" + "\n".join(digest.review_lines(run)))
    elif result is not None:
        lines.append("\nresult: " + json.dumps(result))
    for c in run.get("callbacks", []):
        lines.append(f"callback {c['notification_id']}: {c['state']} after {c['attempts']} "
                     f"attempt(s){' - ' + line(c['last_error']) if c['last_error'] else ''}")
    return lines
