"""Runs as people read them in a terminal: the review of a finished run, the table of
`agentbox runs`, `agentbox show`. What `agentbox`, the watched folders and the MCP
tools print.

A mix review's run is told in a musician's words: its verdict, or what became of
the export (review.present.outcome: "reviewing…", "couldn't review: the file is
empty — export it again"), never a run state's name beside it. The engine's
account of a run (its state, attempts, history, callbacks) is `show`'s Details,
at the end. Another agent's run is told in its own terms.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from agentbox.logs import one_line
from agentbox.review import digest, present
from agentbox.review.figures import local_time, tenths
from agentbox.review.names import FORMER_MIX_REVIEW, MIX_REVIEW

if TYPE_CHECKING:
    from agentbox.models import RunDetail, RunView

# A run as the terminal reads it: a model the client built, or the JSON object
# agentbox sent (`Client.runs_json`: what `agentbox runs` lists, building no model).
# Both are read by name: run["status"], run.get("result").
Run: TypeAlias = "Mapping[str, Any] | RunView"

WIDTH = 100  # `agentbox runs` fits a terminal this wide (a narrower one: its own width)
SHORT_ID_DIGITS = 10  # at least: run ids 256 ms apart differ in them
MIX_REVIEW_AGENTS = frozenset({MIX_REVIEW, FORMER_MIX_REVIEW})


def line(value: Any) -> str:
    """Text from a run (an agent's message, an event's data) as one line of output:
    a newline in it cannot make a line of its own that looks like agentbox's."""
    return one_line(value)


def is_review(result: Any) -> bool:
    """A result that validates as a mix review (another agent's may use its key names)."""
    from agentbox.review.model import as_review

    return as_review(result) is not None


def mix_review_agents() -> frozenset[str]:
    """The built-in mix review, by every name its runs carry (the one it had before it
    moved as well): its runs are told in a musician's words. The names alone
    (review.names), not the review's contract: that loads the engine, which `agentbox
    runs` needs not."""
    return MIX_REVIEW_AGENTS


def reviews(run: Run) -> bool:
    """Whether `run` is the mix review's (told in a musician's words)."""
    return run["agent"] in mix_review_agents()


def outcome(run: Run) -> present.ExportState:
    """What became of an export with no verdict (yet), in a musician's words."""
    return present.outcome(run["status"], run.get("error_code"), run.get("error_message"))


def told(run: RunView, name: str | None = None) -> list[str]:
    """A finished run for people: the review; what became of an export that has none;
    another agent's status and result (as JSON)."""
    if run.status != "succeeded" and reviews(run):
        named = line(name) if name else digest.file_name(run.as_json()) or line(run.run_id)
        return [f"{named}: {line(outcome(run).text)}"]
    if run.status != "succeeded" or run.result is None or is_review(run.result):
        return digest.review_lines(run.as_json(), name)
    return [f"{line(name or run.run_id)}: succeeded", "result: " + json.dumps(run.result)]


def summary_line(run: RunView) -> str:
    """A finished run in one line: `night-drive.wav: pass · -14.2 LUFS · …`, or what
    became of the export (`empty.wav: couldn't review: the file is empty — …`)."""
    if run.status == "succeeded" or not reviews(run):
        return digest.short(run.as_json())
    return told(run)[0]


# -- agentbox runs -----------------------------------------------------------------------------

# A run's state in a word, for a run that is not the mix review's.
STATE_WORDS = {"accepted": "queued", "processing": "running…", "failed_retryable": "retrying",
               "succeeded": "done", "failed_permanent": "failed", "dead_lettered": "gave up"}
# The mix review's outcome in a word, where its verdict would be.
OUTCOME_WORDS = {"reviewing": "reviewing…", "waiting": "render unfinished",
                 "failed": "couldn't review", "done": "no review"}
RUN_COLUMNS = ("WHEN", "PROJECT", "FILE", "REVIEW", "LUFS", "PEAK", "LRA", "ID")
WHY_COLUMNS = ("WHEN", "PROJECT", "FILE", "WHY", "ID")
SHRINKING = ("FILE", "PROJECT", "WHY")  # cut short (…) to fit the width, the widest first
# Narrower, a name is cut too short to tell apart: 80 columns (a terminal's default
# on macOS and Windows) leave the names of `agentbox runs` 9 columns each.
MIN_SHRUNK = 8
NAMES = ("PROJECT", "FILE")  # cut in the middle; a sentence, at its end


def verdict_word(run: Run) -> str:
    """The review's verdict (pass, warn, fail), else what became of the export, in a
    word or two; another agent's run: its state in a word."""
    if run["status"] == "succeeded":
        found = present.read(run.get("result"))
        if found is not None and found.verdict:
            return found.verdict
    if reviews(run):
        return OUTCOME_WORDS[outcome(run).kind]
    return STATE_WORDS.get(run["status"], line(run["status"]))


def why(run: Run) -> str:
    """Why a run failed, as its readers need it: a musician's words for the review."""
    if reviews(run):
        return line(outcome(run).text)
    code, message = run.get("error_code"), run.get("error_message")
    return line(f"{code}: {message}" if code else STATE_WORDS.get(run["status"], ""))


def figure(run: Run, key: str, signed: bool = False) -> str:
    found = present.read(run.get("result"))
    value = found.figure(key) if found is not None else None
    if value is None:
        return "-"
    return tenths(value, signed)


def short_ids(run_ids: Sequence[str]) -> dict[str, str]:
    """Each run id as the start of it no other listed id has (at least
    SHORT_ID_DIGITS digits, without `run_`): what `show` and `replay` take."""
    ordered = sorted(set(run_ids))
    short = {}
    for i, run_id in enumerate(ordered):
        neighbours = ordered[max(i - 1, 0):i] + ordered[i + 1:i + 2]
        shared = max((_common(run_id, other) for other in neighbours), default=0)
        body = run_id.removeprefix("run_")
        short[run_id] = body[:max(SHORT_ID_DIGITS, shared - (len(run_id) - len(body)) + 1)]
    return short


def _common(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def runs_table(found: Sequence[Mapping[str, Any]], width: int = WIDTH) -> list[str]:
    """`agentbox runs`: newest first, when, project, file, the verdict (or what became
    of the export) and the headline figures, and a short id; `width` columns at most.
    Each run as agentbox sent it (Client.runs_json)."""
    ids = short_ids([run["run_id"] for run in found])
    rows = [(*_where(run), verdict_word(run),
             figure(run, "integrated_lufs"), figure(run, "true_peak_dbtp", signed=True),
             figure(run, "loudness_range_lu"), ids[run["run_id"]]) for run in found]
    return table(RUN_COLUMNS, rows, right=("LUFS", "PEAK", "LRA"), width=width)


def why_table(found: Sequence[Mapping[str, Any]], width: int = WIDTH) -> list[str]:
    """`agentbox dead-letters`: when, project, file, why it failed, a short id."""
    ids = short_ids([run["run_id"] for run in found])
    rows = [(*_where(run), why(run), ids[run["run_id"]]) for run in found]
    return table(WHY_COLUMNS, rows, width=width)


def _where(run: Mapping[str, Any]) -> tuple[str, str, str]:
    """A row's WHEN, PROJECT and FILE."""
    return (line(local_time(run["accepted_at"])), digest.project_of(run) or "-",
            digest.file_name(run) or "-")


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]],
          right: tuple[str, ...] = (), width: int = WIDTH) -> list[str]:
    """Columns two spaces apart, the widest cut short (…) until the lines fit `width`
    columns of a terminal (where an emoji or a CJK character takes two)."""
    widths = [max(columns(row[i]) for row in [header, *rows]) for i in range(len(header))]
    shrinking = [header.index(name) for name in SHRINKING if name in header]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        widest = max(shrinking, key=lambda i: widths[i])
        if widths[widest] <= MIN_SHRUNK:
            break
        widths[widest] -= 1

    def cells(row: tuple[str, ...]) -> str:
        return "  ".join(_fit(cell, room, header[i], header[i] in right)
                         for i, (cell, room) in enumerate(zip(row, widths, strict=True)))

    return [cells(header).rstrip(), *(cells(row).rstrip() for row in rows)]


def columns(text: str) -> int:
    """How many terminal columns `text` takes (its length where that is unknown).
    Printable ASCII takes one a character; wcwidth, which tells the rest, is imported
    for the text that needs it (its tables took `agentbox runs` 0.01 s to load)."""
    if text.isascii() and text.isprintable():
        return len(text)
    import wcwidth

    found = wcwidth.wcswidth(text)
    return len(text) if found < 0 else int(found)


def _fit(cell: str, width: int, name: str, right: bool) -> str:
    if columns(cell) > width and name in NAMES:  # a name's end (v3, .wav) tells it apart
        head = _within(cell, (width - 1) // 2)
        cell = head + "…" + _within(cell[::-1], width - 1 - columns(head))[::-1]
    elif columns(cell) > width:
        cell = _within(cell, width - 1) + "…"
    padding = " " * (width - columns(cell))
    return padding + cell if right else cell + padding


def _within(text: str, width: int) -> str:
    """The longest start of `text` that takes at most `width` columns."""
    taken = 0
    for i, char in enumerate(text):
        taken += columns(char)
        if taken > width:
            return text[:i]
    return text


# -- agentbox show -----------------------------------------------------------------------------


def show_lines(run: RunDetail) -> list[str]:
    """`agentbox show`: the review (or what became of the export, or another agent's
    result) first, where it came from, then the engine's Details."""
    if reviews(run) or is_review(run.result):
        lines = told(run)
    else:
        lines = [f"{line(run.run_id)}: {verdict_word(run)}"]
        if run.result is not None:
            lines.append("result: " + json.dumps(run.result))
    seen = run.as_json()
    project, file = digest.project_of(seen), digest.file_name(seen)
    where = [f"project {project}" if project else "", f"file {file}" if file else "",
             f"sent {line(local_time(run.accepted_at))}"]
    return [*lines, "", " · ".join(w for w in where if w), "", *details(run)]


def wrapped(lines: list[str], width: int) -> list[str]:
    """`lines` wrapped at word boundaries to `width` columns, each continuation under
    its line's indentation, or, for a row of columns (a platform's), under its last
    column (a word longer than a line stays whole)."""
    out: list[str] = []
    width = max(width, 20)
    for text in lines:
        out.extend(textwrap.wrap(text, width=width, subsequent_indent=_hang(text, width),
                                 break_long_words=False, break_on_hyphens=False) or [""])
    return out


# A row of columns: two or more spaces between them, the last one starting within
# this share of the width (further on, two spaces are a sentence's, not a column's).
HANGING_SHARE = 0.5
COLUMN_GAP = re.compile(r"\S {2,}(?=\S)")


def _hang(text: str, width: int) -> str:
    """A continuation's indentation: under a row's last column, else two columns
    under the line's own indentation."""
    indent = len(text) - len(text.lstrip(" "))
    gaps = [gap.end() for gap in COLUMN_GAP.finditer(text, indent, int(width * HANGING_SHARE))]
    return " " * (gaps[-1] if gaps else indent + 2)


def terminal_width(interactive: bool) -> int:
    """How wide `agentbox runs` may print: a terminal's own width up to WIDTH (COLUMNS
    when set), WIDTH into a pipe or a file, so that what a script reads stays put."""
    if not interactive and "COLUMNS" not in os.environ:
        return WIDTH
    return max(1, min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns))


def needs_pager(lines: list[str], height: int, interactive: bool) -> bool:
    """Page `agentbox show` only on a terminal, and only when it does not fit."""
    return interactive and len(lines) > height - 1


def details(run: RunDetail) -> list[str]:
    """The engine's account of a run: its state, agent, event, history, callbacks."""
    lines = ["Details:",
             f"  run {run.run_id}  {run.status}, attempt {run.attempt}, "
             f"retries {run.retry_count}",
             f"  agent {line(run.agent)}",
             f"  event {line(run.event_type)} from {line(run.source)} "
             f"(event {line(run.event_id)})"]
    if run.error_code:
        lines.append(f"  error {line(run.error_code)}: {line(run.error_message)}")
    if run.body_removed_at:
        lines.append(f"  event body removed by retention at {run.body_removed_at} "
                     "(the run cannot be replayed)")
    if run.correlation_id or run.hop:
        lines.append(f"  chain {run.correlation_id}, caused by {run.causation_id}, "
                     f"hop {run.hop}")
    lines.append("  history:")
    for change in run.history or []:
        note = f"  ({line(change.note)})" if change.note else ""
        lines.append(f"    {change.at}  {change.status:<16} attempt {change.attempt}{note}")
    for c in run.callbacks:
        lines.append(f"  callback {c.notification_id}: {c.state} after "
                     f"{c.attempts} attempt(s)"
                     f"{' - ' + line(c.last_error) if c.last_error else ''}")
    return lines
