"""A mix review as the page shows it: the figures a musician reads, a verdict,
the platform table, notes in order, the charts, and comparisons between exports.

It stands on agentbox.review.present, the reading every reader shares: what a
stored document holds is shown, what it does not is left out, and the verdict
and the notes are the judge's as stored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from markupsafe import Markup

from agentbox.archive.records import ProjectExport
from agentbox.review import charts, present
from agentbox.review.figures import (
    FIGURES,
    SIGNED_UNITS,
    change_unit,
    finite,
    fixed,
    mmss,
    places,
    tenths,
)
from agentbox.review.model import MixReview, as_review
from agentbox.review.present import mix_name

MINUS = "\N{MINUS SIGN}"


def signed(value: Any, digits: int = 1) -> str:
    """+1.2 / \N{MINUS SIGN}0.4 (a true minus sign), or — when there is nothing."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(
            value):
        return "—"
    return fixed(value, digits, signed=True).replace("-", MINUS)  # "0.0": nothing changed


def number(value: Any, digits: int = 1) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(
            value):
        return "—"
    return fixed(value, digits).replace("-", MINUS)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class Review(present.Review):
    """One stored mix review, read for the page: the reading every reader shares
    (agentbox.review.present) with its model, its format line and its charts."""

    model: MixReview

    @classmethod
    def of(cls, result: Any) -> Review | None:
        """The page's review of a run's result; None for a result that is not a mix
        review (another agent's may use its key names)."""
        model = as_review(result)
        shared = present.read(result) if model is not None else None
        if model is None or shared is None:
            return None
        return cls(shared.doc, shared.metrics, shared.verdict, shared.notes, model)

    @property
    def format_line(self) -> str:
        """WAV · 48 kHz · 24-bit · stereo · 3:02"""
        m = self.metrics
        depth = self.file.get("bit_depth", m.get("bit_depth"))
        count = m.get("channels")
        channels = "mono" if count == 1 else "stereo" if count == 2 else f"{count} channels"
        if m.get("dual_mono") is True:
            channels += " (both channels identical: dual mono)"
        rate = self.figure("sample_rate")
        parts = [str(m.get("file_format") or self.file.get("format") or "")]
        if rate:
            parts.append(f"{rate / 1000:g} kHz")
        if isinstance(depth, int):
            parts.append(f"{depth}-bit")
        return " · ".join([*parts, channels, mmss(self.duration)])

    @property
    def duration(self) -> float:
        return self.figure("duration_seconds") or 0.0

    @property
    def figures(self) -> list[tuple[str, str, str, str]]:
        """(key, name, value, unit) of every headline figure the review holds."""
        return [(key, name, number(self.figure(key), digits), unit)
                for key, name, unit, digits in FIGURES if self.figure(key) is not None]

    @property
    def comparison_run_id(self) -> str | bool | None:
        """The previous export the review names; None if it names none (its
        project's first), or False when the document has no comparison at all."""
        if "previous_run_id" not in self.comparison:
            return False
        named = self.comparison["previous_run_id"]
        return named if isinstance(named, str) else None

    # -- the charts --------------------------------------------------------------------

    @property
    def clipping(self) -> list[tuple[float, float]]:
        """Where the mix clips (samples at full scale), as the clipping note names it."""
        return self.ranges("clipping")

    @property
    def clipping_text(self) -> str:
        """Where the mix clips, in the words of the clipping note: "0:16-0:18, 1:04
        and 12 more"."""
        return places(self.clipping)

    @property
    def overs(self) -> list[tuple[float, float]]:
        """Where the true peak goes over 0 dBTP between samples, as the true-peak
        note names it."""
        return self.ranges("over")

    @property
    def overs_text(self) -> str:
        return places(self.overs)

    def loudness_chart(self, phone: bool = False) -> Markup:
        """The chart for a desktop, or (phone) one drawn for a phone's width: the
        page shows one of the two (its stylesheet, by the screen's width)."""
        curve = _dict(self.metrics.get("loudness_curve"))
        step = finite(curve.get("step_seconds")) or 1.0

        def read(values: Any) -> charts.Curve | None:
            found = [finite(v) for v in _list(values)]
            return charts.Curve(step, found) if any(v is not None for v in found) else None

        short_term = read(curve.get("short_term"))
        momentary = read(curve.get("momentary"))
        if short_term is None:  # reviews before the curve: short-term once a second
            short_term = read(self.metrics.get("short_term_lufs"))
            short_term = short_term and charts.Curve(1.0, short_term.values)
        p = self.model.profile
        return Markup(charts.loudness_chart(
            duration=self.duration, short_term=short_term,
            momentary=momentary, target=None if self.stage == "mix" else p.target_lufs,
            tolerance=p.tolerance_lu,
            clipping=self.clipping, overs=self.overs, **_variant("loudness-plot", phone)))

    def tonal_chart(self, phone: bool = False) -> Markup:
        bands = []
        for b in _list(self.metrics.get("octave_bands")):
            hz = finite(_dict(b).get("hz"))
            if hz is not None and hz > 0:
                bands.append(charts.Band(hz, finite(b.get("db")), finite(b.get("reference_db"))))
        return Markup(charts.tonal_chart(sorted(bands, key=lambda b: b.hz),
                                         self.tonal_reference,
                                         **_variant("tonal-balance", phone)))

    @property
    def tonal_reference(self) -> str:
        """What the tonal chart's dashed line is: "the reference curve for music"."""
        named = self.metrics.get("tonal_reference")
        return named if isinstance(named, str) and named else "the reference curve"


def _variant(element_id: str, phone: bool) -> dict[str, Any]:
    """A review chart's frame, id and classes: the desktop's keeps the id the page
    and its tests know; a phone's is narrower, so that its text stays readable."""
    if not phone:
        return {"element_id": element_id, "css": "chart for-wide"}
    return {"element_id": f"{element_id}-phone", "css": "chart for-phone",
            "frame": charts.Frame(charts.PHONE_WIDTH, 300, left=46, right=12)}


# -- exports and their comparison ------------------------------------------------------------


@dataclass(frozen=True)
class ExportRow:
    run_id: str
    project: str
    status: str
    accepted_at: str
    finished_at: str | None
    review: Review | None
    sent_file: str = ""  # the file the event named, for an export with no review (yet)
    archived: bool = False  # retention removed its run: no run page to link to
    error_code: str | None = None  # why its run failed, or is being tried again
    error_message: str | None = None
    number: int | None = None  # its place among the project page's exports, oldest #1
    same_audio_as: int | None = None  # the earliest earlier export of identical audio
    rejudge_of: str | None = None  # a re-judgment: the run of the export it judges again

    @property
    def file_name(self) -> str:
        return self.review.file_name if self.review else self.sent_file

    @property
    def label(self) -> str:
        """What the project page calls it everywhere: "#3 Night Drive.wav". The
        number tells apart renders of one file name, however close in time."""
        name = self.file_name or "(no file named)"
        return name if self.number is None else f"#{self.number} {name}"

    @property
    def outcome(self) -> present.ExportState:
        """What a musician reads where a verdict would be, for an export with none."""
        return present.outcome(self.status, self.error_code, self.error_message)


def export_row(export: ProjectExport, event: dict[str, Any] | None = None,
               error: tuple[str | None, str | None] = (None, None)) -> ExportRow:
    """`event`: the export's stored event, which names its file when no review does;
    `error`: its run's error code and message, which say why there is none."""
    payload = event.get("payload") if isinstance(event, dict) else None
    url = payload.get("mix_url") if isinstance(payload, dict) else None
    named = payload.get("file_name") if isinstance(payload, dict) else None  # a re-judgment's
    file = named if isinstance(named, str) else mix_name(url) if isinstance(url, str) else ""
    return ExportRow(export.run_id, export.project, export.status, export.accepted_at,
                     export.finished_at, Review.of(export.result), file, export.archived,
                     *error, rejudge_of=rejudged(export.result, payload))


def rejudged(result: Any, payload: Any = None) -> str | None:
    """The run a re-judgment judges again (its review says, or, before it has one,
    its event), else None: a render of its own."""
    for said in (result, payload):
        found = said.get("rejudge_of") if isinstance(said, dict) else None
        if isinstance(found, str) and found:
            return found
    return None


def numbered(rows: list[ExportRow]) -> list[ExportRow]:
    """A project's exports (newest first) numbered from the oldest of them, #1, each
    with the number of the earliest export of the same audio before it; a
    re-judgment has the number of the export it judges again."""
    places = numbers([(row.run_id, row.rejudge_of) for row in rows],
                     [row.review.model.file.sha256 if row.review and row.review.model.file
                      else None for row in rows])
    return [replace(row, number=number, same_audio_as=same)
            for row, (number, same) in zip(rows, places, strict=True)]


def numbers(exports: Sequence[tuple[str, str | None]], hashes: Sequence[str | None]
            ) -> list[tuple[int | None, int | None]]:
    """For a project's exports, newest first, as (run_id, the run it re-judges or
    None), and the hashes of the audio their reviews heard: each one's number (the
    renders counted from the oldest, #1; a re-judgment takes the number of the export
    it judges, None if that one is not among them) and the number of the earliest
    earlier render of the same audio (same_audio_as)."""
    renders = [i for i, (_, of) in enumerate(exports) if of is None]
    same = same_audio([hashes[i] for i in renders])
    number_of: dict[str, int] = {}
    found: list[tuple[int | None, int | None]] = [(None, None)] * len(exports)
    for k, i in enumerate(renders):
        number_of[exports[i][0]] = len(renders) - k
        found[i] = (len(renders) - k, same[k])
    for i, (_, of) in enumerate(exports):
        if of is not None:
            found[i] = (number_of.get(of), None)
    return found


def same_audio(hashes: Sequence[str | None]) -> list[int | None]:
    """For a project's exports' audio hashes (newest first, numbered from the oldest,
    #1): the number of the earliest earlier export with the same hash, else None."""
    first: dict[str, int] = {}
    found: list[int | None] = [None] * len(hashes)
    for number, i in enumerate(range(len(hashes) - 1, -1, -1), start=1):
        sha = hashes[i]
        if sha:
            found[i] = first.get(sha)
            first.setdefault(sha, number)
    return found


@dataclass(frozen=True)
class Delta:
    key: str
    name: str
    unit: str
    before: str
    after: str
    change: str
    raw_change: float | None


def deltas(before: Review | None, after: Review, given: dict[str, Any] | None = None
           ) -> list[Delta]:
    """Every headline figure of two reviews and its change (after minus before); the
    review's own deltas (`given`) win where it has them."""
    out = []
    for key, name, unit, digits in FIGURES:
        b = before.figure(key) if before else None
        a = after.figure(key)
        change = finite((given or {}).get(key))
        if change is None and a is not None and b is not None:
            change = a - b
        if a is None and b is None and change is None:
            continue
        shown = signed if unit in SIGNED_UNITS else number
        out.append(Delta(key, name, change_unit(unit), shown(b, digits), shown(a, digits),
                         signed(change, digits), change))
    return out


@dataclass(frozen=True)
class Compared:
    """What the review page compares with: the project's export before this one."""

    run_id: str | None  # None: this is the project's first export
    accepted_at: str | None
    review: Review | None
    this: Review
    archived: bool = False  # retention removed that run: its review is the project's copy

    @property
    def rows(self) -> list[Delta]:
        given = _dict(self.this.comparison.get("deltas"))
        return deltas(self.review, self.this, given) if self.run_id else []

    @property
    def note(self) -> str:
        note = self.this.comparison.get("note")
        if isinstance(note, str):
            return note
        return _change_note(self.review, self.this) if self.review else ""


def _change_note(before: Review, after: Review) -> str:
    """"1.2 LU louder than the previous export; true peak now over the ceiling." """
    parts = []
    b, a = before.figure("integrated_lufs"), after.figure("integrated_lufs")
    if a is not None and b is not None and round(a - b, 1):
        parts.append(f"{tenths(abs(a - b))} LU {'louder' if a > b else 'quieter'} than the "
                     "previous export")
    ceiling = after.model.profile.max_true_peak_dbtp
    b, a = before.figure("true_peak_dbtp"), after.figure("true_peak_dbtp")
    if a is not None and b is not None and (a > ceiling) != (b > ceiling):
        parts.append(f"true peak now {'over' if a > ceiling else 'under'} the {ceiling:g} dBTP "
                     "ceiling")
    if not parts:
        return "About the same as the previous export."
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def choose_pair(reviewed: list[ExportRow], a: str | None, b: str | None
                ) -> tuple[ExportRow, ExportRow] | None:
    """The two exports to compare: those asked for, else the latest two (newest first
    in `reviewed`); the older of the two comes first."""
    by_id = {row.run_id: row for row in reviewed}
    if len(reviewed) < 2:
        return None
    first = by_id.get(a or "") or reviewed[1]
    second = by_id.get(b or "") or reviewed[0]
    return first, second


def compare(first: ExportRow, second: ExportRow) -> list[Delta]:
    assert first.review is not None and second.review is not None
    return deltas(first.review, second.review)


def trend_charts(reviewed: list[ExportRow]) -> list[Markup]:
    """Integrated loudness, true peak and loudness range across the exports."""
    oldest_first = list(reversed(reviewed))
    charts_out = []
    latest = reviewed[0].review if reviewed else None
    for key, element, title, unit, guide in (
            ("integrated_lufs", "trend-integrated", "Integrated loudness", "LUFS",
             "target"),
            ("true_peak_dbtp", "trend-true-peak", "True peak", "dBTP", "ceiling"),
            ("loudness_range_lu", "trend-lra", "Loudness range (LRA)", "LU", None)):
        points = [charts.TrendPoint(row.accepted_at, value, row.run_id, row.label,
                                    None if row.number is None else f"#{row.number}")
                  for row in oldest_first if row.review is not None
                  and (value := row.review.figure(key)) is not None]
        line = None
        if latest is not None and latest.stage == "mix":
            pass  # a mix has no target and no ceiling of its own: mastering sets them
        elif latest is not None and guide == "target":
            line = (latest.model.profile.target_lufs,
                    f"target {latest.model.profile.target_lufs:g}")
        elif latest is not None and guide == "ceiling":
            line = (latest.model.profile.max_true_peak_dbtp,
                    f"ceiling {latest.model.profile.max_true_peak_dbtp:g}")
        charts_out.append(Markup(charts.trend_chart(element, title, unit, points, line)))
    return charts_out
