"""A stored mix review, read: the one accessor every reader goes through (the page,
the terminal, the MCP server, desktop notifications).

It reads the result document as stored (a dict), field by field, so that a review
written by an older or newer agentbox (fewer or more fields) still reads: what is
missing is left out. The verdict and the notes are the judge's, as stored; a
review stored before reviews carried a verdict is given one here, once, by the
same judge (agentbox.review.judge), never by a rule of its own.

A review that tells its verdict is read without the review's model or the judge
(pydantic and the judging modules are imported for one that does not): `agentbox
runs` and `show` print a stored review without building them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from agentbox.review.figures import finite
from agentbox.review.words import FIRST_FIXES, SEVERITIES, STAGES, VERDICTS

if TYPE_CHECKING:
    from agentbox.review.model import MixReview

# Old results name their delivery targets only; these are their titles.
TARGET_TITLES = {"streaming": "Streaming (Spotify, YouTube, Tidal)",
                 "apple_music": "Apple Music", "broadcast": "Broadcast (EBU R 128)",
                 "club": "Club / DJ", "podcast": "Podcast"}


_RANK = {severity: i for i, severity in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class NoteLine:
    severity: str  # fix, consider or info; "" when the review does not say
    text: str
    code: str = ""


@dataclass(frozen=True)
class TargetRow:
    """What one delivery target's loudness normalisation would do to the mix."""

    name: str
    title: str
    target_lufs: float | None
    ceiling_dbtp: float | None
    gain_db: float | None
    peak_after_dbtp: float | None
    verdict: str | None
    note: str


@dataclass(frozen=True)
class Review:
    """One stored mix review, as people read it."""

    doc: Mapping[str, Any]
    metrics: Mapping[str, Any]
    verdict: str | None  # pass, warn or fail; None when it cannot be known
    notes: tuple[NoteLine, ...]  # what to fix first, first

    def figure(self, key: str) -> float | None:
        """A figure of the metrics; the peak-to-loudness ratio worked out from true
        peak and loudness for a review stored before it was measured."""
        value = finite(self.metrics.get(key))
        if value is None and key == "plr_db":
            peak, loudness = self.figure("true_peak_dbtp"), self.figure("integrated_lufs")
            return None if peak is None or loudness is None else peak - loudness
        return value

    @property
    def file(self) -> Mapping[str, Any]:
        return _mapping(self.doc.get("file"))

    @property
    def file_name(self) -> str:
        """The reviewed file's name: the review's `file.name`, else the end of its
        `mix_url`; "" when it names neither."""
        name = self.file.get("name")
        if isinstance(name, str) and name:
            return name
        url = self.doc.get("mix_url")
        return mix_name(url) if isinstance(url, str) else ""

    @property
    def project(self) -> str:
        project = self.doc.get("project_id")
        return project if isinstance(project, str) else ""

    @property
    def stage(self) -> str | None:
        """"mix" or "master": the stage it was judged at; None for a review stored
        before stages (it was judged as a master)."""
        stage = self.doc.get("stage")
        return stage if stage in STAGES else None

    @property
    def stage_reason(self) -> str:
        reason = self.doc.get("stage_reason")
        return reason if isinstance(reason, str) else ""

    @property
    def stage_evidence(self) -> str:
        """The stage sentence without the first fixes and the choice, for a page that
        asks the question beside it (the whole sentence when it does not ask)."""
        reason = self.stage_reason
        return reason.split(FIRST_FIXES, 1)[0] if self.asks else reason

    @property
    def asks(self) -> Mapping[str, str] | None:
        """The question a review puts first when its stage was inferred and the
        evidence was split: the first fix under each reading, by stage ("mix",
        "master"); None when the stage was given or the evidence was clear."""
        readings = _mapping(self.doc.get("stage_readings"))
        if self.doc.get("stage_source") != "auto" or self.doc.get("stage_split") is not True:
            return None
        fixes = {stage: readings.get(stage) for stage in STAGES}
        if not all(isinstance(fix, str) and fix for fix in fixes.values()):
            return None
        return {stage: str(fix) for stage, fix in fixes.items()}

    @property
    def summary(self) -> str:
        summary = self.doc.get("summary")
        return summary if isinstance(summary, str) else ""

    @property
    def targets(self) -> list[TargetRow]:
        out = []
        for t in _list(self.doc.get("targets")):
            if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
                continue
            title = t.get("title")
            if not isinstance(title, str) or not title:
                title = TARGET_TITLES.get(t["name"], t["name"].replace("_", " "))
            verdict = t.get("verdict")
            out.append(TargetRow(
                t["name"], title, finite(t.get("integrated_target_lufs")),
                finite(t.get("true_peak_max_dbtp")), finite(t.get("gain_db")),
                finite(t.get("result_true_peak_dbtp")),
                verdict if verdict in VERDICTS else None,
                t["note"] if isinstance(t.get("note"), str) else ""))
        return out

    @property
    def targets_note(self) -> str:
        """What every platform row shares, said once ("" in older reviews: their rows
        each say it)."""
        note = self.doc.get("targets_note")
        return note if isinstance(note, str) else ""

    @property
    def comparison(self) -> Mapping[str, Any]:
        return _mapping(self.doc.get("comparison"))

    @property
    def reference(self) -> Mapping[str, Any]:
        return _mapping(self.doc.get("reference"))

    def ranges(self, kind: str) -> list[tuple[float, float]]:
        """(start, end) in seconds of each stretch of `kind`: "clipping" (samples at
        full scale) or "over" (above 0 dBTP between them)."""
        out = []
        for r in _list(self.metrics.get("clipping_ranges")):
            r = _mapping(r)
            start, end = finite(r.get("start")), finite(r.get("end"))
            if start is not None and r.get("kind", "clipping") == kind:
                out.append((start, end if end is not None and end >= start else start))
        return out


def read(result: Any) -> Review | None:
    """A run's result as a review, or None when it holds no measurements."""
    if not isinstance(result, Mapping) or not isinstance(result.get("metrics"), Mapping):
        return None
    return Review(result, result["metrics"], _verdict(result), tuple(_notes(result)))


def _verdict(doc: Mapping[str, Any]) -> str | None:
    given = doc.get("verdict")
    if given in VERDICTS:
        return str(given)
    from agentbox.review.model import as_review  # a review stored without a verdict

    model = as_review(dict(doc))
    return None if model is None else judged_verdict(model)


def judged_verdict(model: MixReview) -> str:
    """The judge's verdict on a review stored without one, at its stage (a review
    that old has none: it was judged as a master, against its profile)."""
    from agentbox.review.judge import judge, profile_of

    return judge(model.metrics, profile_of(model.profile), model.stage).verdict


def _notes(doc: Mapping[str, Any]) -> list[NoteLine]:
    # When the configured model wrote the notes, they are the review's words; the
    # rules' structured notes stay in the document for scripts.
    structured = None if doc.get("notes_source") == "llm" else doc.get("notes")
    given = [n for n in _list(structured) if isinstance(n, Mapping)
             and isinstance(n.get("text"), str) and n["text"]]
    if given:
        found = [NoteLine(str(n["severity"]) if n.get("severity") in SEVERITIES else "",
                      n["text"], str(n.get("code") or "")) for n in given]
        # What to fix first, first, as the judge orders them (sorted stably: a
        # document written otherwise keeps its order within a severity).
        return sorted(found, key=lambda n: _RANK.get(n.severity, len(_RANK)))
    return [NoteLine("", text) for text in _list(doc.get("review_notes"))
            if isinstance(text, str) and text]


def mix_name(url: str) -> str:
    """The file's name from a mix_url (a path, a file:// URL, a Windows path)."""
    parts = urlsplit(url)
    path = unquote(parts.path) if parts.scheme == "file" else url
    return PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# -- what became of an export that has no review -------------------------------------------

# A retry the render itself will end: the file is still being written, or stopped
# short and may yet be finished.
RENDER_UNFINISHED = frozenset({"mix_incomplete", "mix_truncated"})
# Why a review could not be made, in a musician's words, by error code; the
# agent's own sentence where it says more.
COULD_NOT = {
    "mix_not_found": "the file is not there any more — export it again",
    "mix_truncated": "the render was cut short — export it again",
    "mix_incomplete": "the file kept changing while it was read — export it again",
    "unsupported_mix_url": "the export names no file on this computer",
    "timeout": "it took too long — try again, or export a shorter file",
    "analysis_crashed": "the analysis stopped unexpectedly — try again",
}
EMPTY_FILE = "the file is empty — export it again"
UNREADABLE = ("it is not audio agentbox can read (whatever its name says) — export it "
              "again as WAV, AIFF or FLAC")
MESSAGE_CHARACTERS = 200


@dataclass(frozen=True)
class ExportState:
    """What became of an export that has no verdict (yet), as a musician reads it:
    `kind` is reviewing, waiting (for the render to finish), failed, or done (an
    agent that answered something other than a review)."""

    kind: str
    text: str

    @property
    def pending(self) -> bool:
        return self.kind in ("reviewing", "waiting")


def outcome(status: str, error_code: str | None = None,
            error_message: str | None = None) -> ExportState:
    """The words for a run's state where a verdict would be: "reviewing…", "waiting
    for the render to finish", "couldn't review: the file is empty — export it
    again". Never a run state's own name."""
    if status in ("accepted", "processing"):
        return ExportState("reviewing", "reviewing…")
    if status == "failed_retryable":
        if error_code in RENDER_UNFINISHED:
            return ExportState("waiting", "waiting for the render to finish")
        return ExportState("reviewing", "reviewing… (trying again shortly)")
    if status == "succeeded":  # an agent that answered something other than a review
        return ExportState("done", "finished without a review")
    return ExportState("failed", "couldn't review: " + _why(error_code, error_message))


def _why(error_code: str | None, error_message: str | None) -> str:
    message = " ".join((error_message or "").split())
    if error_code == "mix_unreadable":
        return EMPTY_FILE if "empty (0 bytes)" in message else UNREADABLE
    if error_code in COULD_NOT:
        return COULD_NOT[error_code]
    if message:
        short = message[:MESSAGE_CHARACTERS]
        return short + ("…" if len(message) > MESSAGE_CHARACTERS else "")
    return "something went wrong — its Details say what"
