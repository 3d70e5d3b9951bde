"""A run told for people: the verdict, the headline figures, the notes in order.

`agentbox send --wait`, `show`, `runs`, `watch` and the desktop notification
speak of a mix review with these functions. They read the result document as
stored (a dict), field by field, so that a review written by an older or newer
agentbox (fewer or more fields) still reads: what is missing is left out.
Every text taken from a run is made one line (`one_line`), so that a newline
in a file or project name cannot forge a line of agentbox's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import unquote, urlsplit

# Every figure the page and the CLI name, in the order a mastering engineer reads them:
# (key in metrics, what it is called, unit, decimals)
FIGURES = (
    ("integrated_lufs", "Integrated loudness", "LUFS", 1),
    ("true_peak_dbtp", "True peak", "dBTP", 1),
    ("loudness_range_lu", "Loudness range (LRA)", "LU", 1),
    ("plr_db", "Peak to loudness (PLR)", "dB", 1),
    ("short_term_max_lufs", "Short-term maximum", "LUFS", 1),
    ("momentary_max_lufs", "Momentary maximum", "LUFS", 1),
    ("sample_peak_dbfs", "Sample peak", "dBFS", 1),
    ("headroom_db", "Unused headroom", "dB", 1),
    ("stereo_correlation", "Stereo correlation", "", 2),
    ("mono_loudness_drop_lu", "Lost when folded to mono", "LU", 1),
    ("low_end_correlation", "Low-end correlation", "", 2),
    ("clipped_samples", "Clipped samples", "", 0),
    ("duration_seconds", "Duration", "s", 1),
)
FIGURE_NAMES = {key: (name, unit, digits) for key, name, unit, digits in FIGURES}
# A difference of two levels is not a level: two loudnesses differ in LU (EBU Tech
# 3341), two peaks in dB.
CHANGE_UNITS = {"LUFS": "LU", "dBTP": "dB", "dBFS": "dB"}
# Peaks are shown with their sign: +0.3 dBTP is over full scale and must not read
# as under it.
SIGNED_UNITS = ("dBTP", "dBFS")
TARGET_TITLES = {"streaming": "Streaming (Spotify, YouTube, Tidal)",
                 "apple_music": "Apple Music", "broadcast": "Broadcast (EBU R 128)",
                 "club": "Club / DJ", "podcast": "Podcast"}

# The headline figures, in the order people read them: metrics key, label, unit.
HEADLINE = (
    ("integrated_lufs", "", "LUFS"),
    ("true_peak_dbtp", "true peak ", "dBTP"),
    ("loudness_range_lu", "LRA ", "LU"),
    ("plr_db", "PLR ", "dB"),
)
SEVERITY_MARKS = {"fix": "fix", "consider": "consider", "info": "info"}


def one_line(value: Any) -> str:
    """Text from a run as one line of output: control characters written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _signed(value: float) -> str:
    return f"{value:+.1f}"


def change_unit(unit: str) -> str:
    """The unit of a difference of two figures in `unit`: LUFS -> LU, dBTP -> dB."""
    return CHANGE_UNITS.get(unit, unit)


def local_time(iso: str) -> str:
    """14:02 (today), else 3 Dec 14:02, in this machine's time zone; what is not an
    ISO time, as it is."""
    try:
        moment = datetime.fromisoformat(iso).astimezone()
    except ValueError:
        return iso
    if moment.date() == datetime.now().astimezone().date():
        return moment.strftime("%H:%M")
    return f"{moment.day} {moment.strftime('%b %H:%M')}"


def metrics_of(result: Any) -> Mapping[str, Any]:
    found = result.get("metrics") if isinstance(result, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def plr(metrics: Mapping[str, Any]) -> float | None:
    """Peak-to-loudness ratio: the review's `plr_db`, else true peak minus integrated."""
    given = _number(metrics.get("plr_db"))
    if given is not None:
        return given
    peak, loudness = (_number(metrics.get(k)) for k in ("true_peak_dbtp", "integrated_lufs"))
    return None if peak is None or loudness is None else peak - loudness


def headline(result: Any) -> str:
    """`-9.8 LUFS · true peak +0.4 dBTP · LRA 5.2 LU · PLR 10.2 dB` (what is known)."""
    metrics = metrics_of(result)
    parts = []
    for key, label, unit in HEADLINE:
        value = plr(metrics) if key == "plr_db" else _number(metrics.get(key))
        if value is not None:
            shown = _signed(value) if key == "true_peak_dbtp" else f"{value:.1f}"
            parts.append(f"{label}{shown} {unit}")
    if not parts and "integrated_lufs" in metrics:
        parts.append("silence (no loudness to measure)")
    return " · ".join(parts)


def file_name(run: Mapping[str, Any]) -> str:
    """The reviewed file's name: the review's `file.name`, else the end of its
    `mix_url`, else the run view's `file` (the name the event's payload gives, for a
    run that was not reviewed: queued, retrying, failed)."""
    result = run.get("result")
    if isinstance(result, Mapping):
        file = result.get("file")
        if isinstance(file, Mapping) and isinstance(file.get("name"), str):
            return one_line(file["name"])
        if isinstance(result.get("mix_url"), str):
            return one_line(mix_name(result["mix_url"]))
    named = run.get("file")
    return one_line(named) if isinstance(named, str) else ""


def mix_name(url: str) -> str:
    """The file's name from a mix_url (a path, a file:// URL, a Windows path)."""
    parts = urlsplit(url)
    path = unquote(parts.path) if parts.scheme == "file" else url
    return PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name


def project_of(run: Mapping[str, Any]) -> str:
    """The run view's `project`, else the review's `project_id`."""
    project = run.get("project")
    result = run.get("result")
    if not isinstance(project, str) and isinstance(result, Mapping):
        project = result.get("project_id")
    return one_line(project) if isinstance(project, str) else ""


def verdict_of(run: Mapping[str, Any]) -> str:
    """pass / warn / fail for a review; the run's status for anything else."""
    result = run.get("result")
    verdict = result.get("verdict") if isinstance(result, Mapping) else None
    if isinstance(verdict, str) and run.get("status") == "succeeded":
        return one_line(verdict)
    return one_line(run.get("status", ""))


def notes(result: Any) -> list[tuple[str, str]]:
    """(severity, text) in the review's order (what to fix first); severity may be ''."""
    if not isinstance(result, Mapping):
        return []
    structured = result.get("notes")
    # When the configured model wrote the notes, they are the review's words; the
    # rules' structured notes stay in the document for scripts.
    if result.get("notes_source") == "llm":
        structured = None
    if isinstance(structured, list) and all(isinstance(n, Mapping) for n in structured):
        return [(one_line(SEVERITY_MARKS.get(str(n.get("severity")), "")),
                 one_line(n.get("text", ""))) for n in structured if n.get("text")]
    texts = result.get("review_notes")
    if isinstance(texts, list):
        return [("", one_line(text)) for text in texts]
    return []


def comparison(result: Any) -> list[str]:
    """The comparison with the project's previous export, as lines (none if absent)."""
    found = result.get("comparison") if isinstance(result, Mapping) else None
    if not isinstance(found, Mapping):
        return []
    previous = found.get("previous_run_id")
    if previous is None:
        return ["First export of this project: nothing to compare with yet."]
    when = found.get("previous_accepted_at")
    lines = ["Compared with the previous export ("
             + (f"{one_line(local_time(when))}, " if isinstance(when, str) else "")
             + f"{one_line(previous)}):"]
    deltas = found.get("deltas")
    if isinstance(deltas, Mapping):
        order = {key: i for i, key in enumerate(FIGURE_NAMES)}  # as the page reads them
        changes = [_delta(str(name), change) for name, value in
                   sorted(deltas.items(), key=lambda item: order.get(item[0], len(order)))
                   if (change := _number(value)) is not None and round(change, 1) != 0]
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
    found = result.get("targets") if isinstance(result, Mapping) else None
    if not isinstance(found, list):
        return []
    lines = []
    for target in found:
        if not isinstance(target, Mapping) or not isinstance(target.get("name"), str):
            continue
        gain = _number(target.get("gain_db"))
        verdict = target.get("verdict")
        title = TARGET_TITLES.get(target["name"], target["name"].replace("_", " "))
        note = target.get("note")
        lines.append(f"  {one_line(title):<36}"
                     + (f" {_signed(gain):>6} dB" if gain is not None else "")
                     + (f"  {one_line(verdict)}" if isinstance(verdict, str) else "")
                     + (f": {one_line(note)}" if isinstance(note, str) and note else ""))
    return lines


def review_lines(run: Mapping[str, Any], name: str | None = None) -> list[str]:
    """A finished run for people: verdict, figures, notes, comparison; or why it failed.
    `name`: what to call the file (default: the review's file name, else the run id)."""
    name = one_line(name) if name else file_name(run) or one_line(run.get("run_id", ""))
    status = run.get("status")
    result = run.get("result")
    if status != "succeeded":
        error = run.get("error_code")
        why = (f": {one_line(error)}: {one_line(run.get('error_message') or '')}"
               if error else "")
        return [f"{name}: {one_line(status)}{why}"]
    if not metrics_of(result):
        return [f"{name}: succeeded"]
    lines = [f"{name}: {verdict_of(run)}", f"  {headline(result)}"]
    if isinstance(result, Mapping) and isinstance(result.get("summary"), str):
        lines.append(f"  {one_line(result['summary'])}")
    found = notes(result)
    if found:
        lines.append("Notes, what to fix first:")
        lines += [f"  {i}. " + (f"[{severity}] " if severity else "") + text
                  for i, (severity, text) in enumerate(found, 1)]
    platform = targets(result)
    if platform:
        lines += ["Delivery targets (gain their normalisation applies):", *platform]
    lines += comparison(result)
    return lines


def short(run: Mapping[str, Any]) -> str:
    """One line: `night-drive.wav: pass · -14.2 LUFS · true peak -1.1 dBTP · …`."""
    name = file_name(run) or one_line(run.get("run_id", ""))
    if run.get("status") != "succeeded":
        error = run.get("error_code")
        return f"{name}: {one_line(run.get('status'))}" + (f" ({one_line(error)})"
                                                           if error else "")
    figures = headline(run.get("result"))
    return f"{name}: {verdict_of(run)}" + (f" · {figures}" if figures else "")
