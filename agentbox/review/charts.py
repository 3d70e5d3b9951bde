"""The status page's charts, drawn on the server as inline SVG.

No script and no CDN: a chart is part of the page, readable without a network,
and each has a <title> and <desc> for screen readers. Axis ticks carry classes
(`x-tick`, `y-tick`) and times that the browser shows in its own time zone carry
`data-utc` (the page's script formats them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from markupsafe import escape

from agentbox.review.figures import SIGNED_UNITS, mmss, tenths

TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
LOUDNESS_FLOOR = -60.0  # quieter readings are drawn on the chart's bottom edge
MOMENTARY = "#98a2b3"
SHORT_TERM = "#1f5fbf"
TARGET = "#127a3e"
CLIP = "#b42318"
OVER = "#dc6803"
EN_DASH = "\N{EN DASH}"
# A chart drawn for a phone: scaled to a 360 px screen its 11-unit text stays
# readable (the 900-unit chart of a desktop would shrink it to 4 px).
PHONE_WIDTH = 420
LEGEND_ROW = 14.0


def time_step(span: float, ticks: int = 8) -> int:
    """The tick spacing, in whole seconds, giving at most about `ticks` ticks."""
    return next((s for s in TIME_STEPS if span / s <= ticks), TIME_STEPS[-1])


def level_step(span: float) -> int:
    return 3 if span <= 24 else 6 if span <= 48 else 12


@dataclass(frozen=True)
class Frame:
    """A plot area inside an SVG of width by height, with margins for the axes."""

    width: float
    height: float
    left: float = 52.0
    right: float = 16.0
    top: float = 24.0
    bottom: float = 40.0

    def x(self, fraction: float) -> float:
        return self.left + (self.width - self.left - self.right) * fraction

    def y(self, fraction: float) -> float:
        return self.height - self.bottom - (self.height - self.top - self.bottom) * fraction


@dataclass(frozen=True)
class Key:
    """One entry of a chart's legend: a line, or a swatch of a colour the chart fills."""

    label: str
    colour: str
    swatch: float | None = None  # the swatch's opacity; None: a line

    @property
    def width(self) -> float:  # in the chart's units, at its 11-unit text
        return (24 if self.swatch is not None else 28) + 6.2 * len(self.label)


def _legend_rows(frame: Frame, keys: Sequence[Key]) -> list[list[tuple[float, Key]]]:
    """The legend's entries by row, each at its x: a row ends where the next entry
    would run past the chart's right edge."""
    rows: list[list[tuple[float, Key]]] = [[]]
    x = frame.left
    for key in keys:
        if rows[-1] and x + key.width - 6 > frame.width - frame.right:
            rows.append([])
            x = frame.left
        rows[-1].append((x, key))
        x += key.width
    return rows


def _room_for(frame: Frame, keys: Sequence[Key]) -> Frame:
    """The frame with a top margin that holds every row of the legend."""
    rows = len(_legend_rows(frame, keys))
    return replace(frame, top=frame.top + LEGEND_ROW * (rows - 1))


def _open(element_id: str, frame: Frame, title: str, desc: str, css: str = "chart") -> str:
    return (f'<svg id="{element_id}" class="{css}" viewBox="0 0 {frame.width:.0f} '
            f'{frame.height:.0f}" width="{frame.width:.0f}" height="{frame.height:.0f}" '
            f'role="img" aria-labelledby="{element_id}-title {element_id}-desc">'
            f'<title id="{element_id}-title">{escape(title)}</title>'
            f'<desc id="{element_id}-desc">{escape(desc)}</desc>')


def _axis_titles(frame: Frame, x_title: str, y_title: str) -> str:
    middle_y = (frame.top + frame.height - frame.bottom) / 2
    return (f'<text class="axis-title" x="{frame.x(0.5):.1f}" y="{frame.height - 4:.1f}" '
            f'text-anchor="middle">{escape(x_title)}</text>'
            f'<text class="axis-title" x="12" y="{middle_y:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 12 {middle_y:.1f})">{escape(y_title)}</text>')


def _polylines(points: Sequence[tuple[float, float] | None], colour: str, width: float,
               css: str) -> str:
    """One polyline per unbroken run of points (None breaks the line: silence)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for point in points:
        if point is None:
            runs.append([])
        else:
            runs[-1].append(point)
    return "".join(
        f'<polyline class="{css}" fill="none" stroke="{colour}" stroke-width="{width}" '
        f'stroke-linejoin="round" points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in run)}"/>'
        for run in runs if len(run) > 1)


@dataclass(frozen=True)
class Curve:
    step_seconds: float
    values: Sequence[float | None]

    def thinned(self, most: int) -> Curve:
        """At most `most` points, each the loudest of the readings it stands for (an
        hour of momentary loudness is 36,000 readings; the chart is 900 pixels)."""
        if len(self.values) <= most:
            return self
        size = math.ceil(len(self.values) / most)
        loudest = [max((v for v in self.values[i:i + size] if v is not None), default=None)
                   for i in range(0, len(self.values), size)]
        return Curve(self.step_seconds * size, loudest)


def loudness_chart(*, duration: float, short_term: Curve | None, momentary: Curve | None,
                   target: float | None, tolerance: float,
                   clipping: Sequence[tuple[float, float]] = (),
                   overs: Sequence[tuple[float, float]] = (),
                   frame: Frame | None = None, element_id: str = "loudness-plot",
                   css: str = "chart") -> str:
    """Loudness over time: momentary and short-term curves, LUFS gridlines, the
    target band (none for a mix: its loudness is mastering's to set) and the places
    where the mix clips."""
    keys = [Key("short-term (3 s)", SHORT_TERM)]
    keys += [Key("momentary (400 ms)", MOMENTARY)] if momentary is not None else []
    keys += [Key("clipping", CLIP, 0.4)] if clipping else []
    keys += [Key("over 0 dBTP", OVER, 0.4)] if overs else []
    frame = _room_for(frame or Frame(900, 280), keys)
    most = int(frame.width)
    momentary = momentary.thinned(most) if momentary else None
    short_term = short_term.thinned(most) if short_term else None
    curves = [c for c in (momentary, short_term) if c is not None]
    readings = [v for c in curves for v in c.values if v is not None and math.isfinite(v)]
    if not readings:
        return ""
    span_x = max(duration, max(len(c.values) * c.step_seconds for c in curves), 1.0)
    band = [] if target is None else [target - tolerance, target + tolerance]
    high = max([*readings, *band]) + 2
    low = max(min([*readings, *band]) - 2, LOUDNESS_FLOOR)
    step = level_step(high - low)
    low, high = math.floor(low / step) * step, math.ceil(high / step) * step

    def px(t: float) -> float:
        return frame.x(min(t, span_x) / span_x)

    def py(v: float) -> float:
        return frame.y((min(max(v, low), high) - low) / (high - low))

    parts = [_open(element_id, frame, "Loudness over time",
                   f"Momentary and short-term loudness in LUFS over {mmss(span_x)}"
                   + ("" if target is None else
                      f", against the target of {target:g} LUFS ± {tolerance:g} LU")
                   + (f"; clipping in {len(clipping)} place(s)" if clipping else "")
                   + (f"; over 0 dBTP in {len(overs)} place(s)" if overs else "") + ".",
                   css),
             _background(frame)]
    if target is not None:
        parts.append(f'<rect class="target-band" x="{frame.x(0):.1f}" '
                     f'y="{py(target + tolerance):.1f}" width="{frame.x(1) - frame.x(0):.1f}" '
                     f'height="{py(target - tolerance) - py(target + tolerance):.1f}" '
                     f'fill="{TARGET}" fill-opacity="0.12"><title>target {target:g} LUFS '
                     f'± {tolerance:g} LU</title></rect>')
    parts.append(_level_grid(frame, low, high, step, py))
    tick = time_step(span_x)
    for second in range(0, int(span_x) + 1, tick):
        x = px(second)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{frame.y(0):.1f}" '
                     f'y2="{frame.y(0) + 4:.1f}" stroke="#98a2b3"/>'
                     f'<text class="x-tick" x="{x:.1f}" y="{frame.y(0) + 16:.1f}" '
                     f'text-anchor="middle">{mmss(second)}</text>')
    parts += [_mark(start, end, "clip", CLIP, "clipping", px, frame) for start, end in clipping]
    parts += [_mark(start, end, "over", OVER, "over 0 dBTP", px, frame) for start, end in overs]
    if momentary is not None:
        parts.append(_polylines(
            [None if v is None else (px((i + 1) * momentary.step_seconds), py(v))
             for i, v in enumerate(momentary.values)], MOMENTARY, 1, "momentary"))
    if short_term is not None:
        parts.append(_polylines(
            [None if v is None else (px((i + 1) * short_term.step_seconds), py(v))
             for i, v in enumerate(short_term.values)], SHORT_TERM, 2, "short-term"))
    if target is not None:
        parts.append(f'<text class="band-label" x="{frame.x(1) - 4:.1f}" '
                     f'y="{py(target + tolerance) - 4:.1f}" text-anchor="end" fill="{TARGET}">'
                     f'target {target:g} LUFS</text>')
    parts.append(_legend(frame, keys))
    parts.append(_axis_titles(frame, "time (mm:ss)", "loudness (LUFS)"))
    parts.append(_frame_box(frame))
    return "".join(parts) + "</svg>"


def _mark(start: float, end: float, css: str, colour: str, what: str,
          px: Callable[[float], float], frame: Frame) -> str:
    """A faint band over the curve and a solid mark on top, where `what` happens."""
    x0, width = px(start) - 1, max(px(end) - px(start), 0) + 2
    return (f'<rect class="{css}-band" x="{x0:.1f}" y="{frame.y(1):.1f}" '
            f'width="{width:.1f}" height="{frame.y(0) - frame.y(1):.1f}" '
            f'fill="{colour}" fill-opacity="0.08"/>'
            f'<rect class="{css}-marker" x="{x0:.1f}" y="{frame.y(1):.1f}" '
            f'width="{width:.1f}" height="7" fill="{colour}"><title>{what} at '
            f'{mmss(start)}{EN_DASH + mmss(end) if mmss(end) != mmss(start) else ""}'
            f'</title></rect>')


def _legend(frame: Frame, keys: Sequence[Key]) -> str:
    """The legend in the top margin (_room_for made it tall enough), its last row
    just above the plot."""
    rows = _legend_rows(frame, keys)
    out = []
    for number, row in enumerate(rows):
        base = frame.top - 6 - LEGEND_ROW * (len(rows) - 1 - number)  # the text's baseline
        for x, key in row:
            if key.swatch is None:
                out.append(f'<line x1="{x:.1f}" x2="{x + 16:.1f}" y1="{base - 4:.1f}" '
                           f'y2="{base - 4:.1f}" stroke="{key.colour}" stroke-width="2"/>'
                           f'<text class="legend" x="{x + 20:.1f}" y="{base:.1f}">'
                           f'{escape(key.label)}</text>')
            else:
                out.append(f'<rect class="key" x="{x:.1f}" y="{base - 9:.1f}" width="10" '
                           f'height="10" fill="{key.colour}" fill-opacity="{key.swatch:g}"/>'
                           f'<text class="legend" x="{x + 14:.1f}" y="{base:.1f}">'
                           f'{escape(key.label)}</text>')
    return "".join(out)


def _plot_rect(frame: Frame) -> str:
    return (f'x="{frame.x(0):.1f}" y="{frame.y(1):.1f}" width="{frame.x(1) - frame.x(0):.1f}" '
            f'height="{frame.y(0) - frame.y(1):.1f}"')


def _background(frame: Frame) -> str:
    return f'<rect {_plot_rect(frame)} fill="#fff"/>'


def _level_grid(frame: Frame, low: float, high: float, step: int,
                py: Callable[[float], float]) -> str:
    """A labelled horizontal gridline every `step` from `low` to `high`."""
    lines = []
    for level in range(int(low), int(high) + 1, step):
        y = py(level)
        lines.append(f'<line class="grid" x1="{frame.x(0):.1f}" x2="{frame.x(1):.1f}" '
                     f'y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e7ec"/>'
                     f'<text class="y-tick" x="{frame.left - 6:.1f}" y="{y + 3.5:.1f}" '
                     f'text-anchor="end">{level}</text>')
    return "".join(lines)


def _frame_box(frame: Frame) -> str:
    return f'<rect {_plot_rect(frame)} fill="none" stroke="#d0d5dd"/>'


@dataclass(frozen=True)
class Band:
    hz: float
    db: float | None
    reference_db: float | None


def band_label(hz: float) -> str:
    return f"{hz / 1000:g}k" if hz >= 1000 else f"{hz:g}"


def tonal_chart(bands: Sequence[Band], reference: str = "the reference curve",
                frame: Frame | None = None, element_id: str = "tonal-balance",
                css: str = "chart") -> str:
    """Tonal balance: the mix's level per octave band against its reference (the
    profile's curve, or a reference track's bands), named as `reference`; where they
    differ, a band of colour says which way."""
    levels = [v for b in bands for v in (b.db, b.reference_db) if v is not None]
    if len(bands) < 2 or not levels:
        return ""
    compared = [b.db - b.reference_db for b in bands
                if b.db is not None and b.reference_db is not None]
    keys = [Key("this mix", SHORT_TERM), Key(reference.removeprefix("the "), TARGET)]
    keys += [Key("mix louder than reference", CLIP, 0.18)] if any(d > 0 for d in compared) else []
    keys += ([Key("mix quieter than reference", SHORT_TERM, 0.18)]
             if any(d <= 0 for d in compared) else [])
    frame = _room_for(frame or Frame(900, 240), keys)
    step = level_step(max(levels) - min(levels) + 6)
    low = math.floor((min(levels) - 3) / step) * step
    high = math.ceil((max(levels) + 3) / step) * step

    def px(i: int) -> float:
        return frame.x((i + 0.5) / len(bands))

    def py(v: float) -> float:
        return frame.y((v - low) / (high - low))

    parts = [_open(element_id, frame, "Tonal balance by octave band",
                   f"The mix's level in each octave band (solid) against {reference} "
                   "(dashed), in dB; shaded where they differ: red where the mix is "
                   "louder, blue where it is quieter.", css),
             _background(frame)]
    parts.append(_level_grid(frame, low, high, step, py))
    for i, band in enumerate(bands):
        parts.append(f'<text class="x-tick" x="{px(i):.1f}" y="{frame.y(0) + 16:.1f}" '
                     f'text-anchor="middle">{band_label(band.hz)}</text>')
        if band.db is not None and band.reference_db is not None:
            top, bottom = sorted((py(band.db), py(band.reference_db)))
            over = band.db > band.reference_db
            parts.append(f'<rect class="band-delta" x="{px(i) - 9:.1f}" y="{top:.1f}" '
                         f'width="18" height="{max(bottom - top, 1):.1f}" '
                         f'fill="{CLIP if over else SHORT_TERM}" fill-opacity="0.18">'
                         f'<title>{band_label(band.hz)} Hz: '
                         f'{tenths(band.db - band.reference_db, True)} dB '
                         f'against the reference</title></rect>')
    curve = [None if b.reference_db is None else (px(i), py(b.reference_db))
             for i, b in enumerate(bands)]
    measured = [None if b.db is None else (px(i), py(b.db)) for i, b in enumerate(bands)]
    parts.append(_polylines(curve, TARGET, 1.5, "reference").replace(
        "<polyline ", '<polyline stroke-dasharray="5 4" '))
    parts.append(_polylines(measured, SHORT_TERM, 2, "measured"))
    for i, band in enumerate(bands):
        if band.db is not None:
            parts.append(f'<circle cx="{px(i):.1f}" cy="{py(band.db):.1f}" r="3" '
                         f'fill="{SHORT_TERM}"><title>{band_label(band.hz)} Hz: '
                         f'{tenths(band.db)} dB</title></circle>')
    parts.append(_legend(frame, keys))
    parts.append(_axis_titles(frame, "octave band (Hz)", "level (dB)"))
    parts.append(_frame_box(frame))
    return "".join(parts) + "</svg>"


@dataclass(frozen=True)
class TrendPoint:
    at: str  # ISO 8601 UTC
    value: float
    run_id: str
    label: str  # what the point's tooltip names (an export: "#3 Night Drive.wav")
    tick: str | None = None  # its label on the x axis ("#3"); None: its date


def _reading(value: float, unit: str) -> str:
    """A figure as the pages show it: one decimal, a peak with its sign."""
    return tenths(value, signed=unit in SIGNED_UNITS)


def trend_chart(element_id: str, title: str, unit: str, points: Sequence[TrendPoint],
                guide: tuple[float, str] | None = None, frame: Frame | None = None) -> str:
    """One figure across a project's exports, oldest left; each point links to its
    review (unless its run is gone). `guide` is a horizontal reference line (a target,
    a ceiling)."""
    frame = frame or Frame(440, 210, left=46, top=34, bottom=44)
    if not points:
        return ""
    values = [p.value for p in points] + ([guide[0]] if guide else [])
    step = level_step(max(values) - min(values) + 2)
    step = 1 if max(values) - min(values) < 4 else step
    low = math.floor(min(values) - 1)
    high = math.ceil(max(values) + 1)
    low, high = math.floor(low / step) * step, math.ceil(high / step) * step

    def px(i: int) -> float:
        return frame.x(0.5 if len(points) == 1 else 0.04 + 0.92 * i / (len(points) - 1))

    def py(v: float) -> float:
        return frame.y((v - low) / (high - low))

    parts = [_open(element_id, frame, title,
                   f"{title} of each export, oldest left, in {unit}."),
             _background(frame)]
    parts.append(_level_grid(frame, low, high, step, py))
    if guide is not None:
        y = py(guide[0])
        parts.append(f'<line x1="{frame.x(0):.1f}" x2="{frame.x(1):.1f}" y1="{y:.1f}" '
                     f'y2="{y:.1f}" stroke="{TARGET}" stroke-dasharray="5 4"/>'
                     f'<text class="band-label" x="{frame.x(1) - 4:.1f}" y="{y - 4:.1f}" '
                     f'text-anchor="end" fill="{TARGET}">{escape(guide[1])}</text>')
    parts.append(_polylines([(px(i), py(p.value)) for i, p in enumerate(points)],
                            SHORT_TERM, 2, "trend"))
    labelled = _labelled(len(points), px(1) - px(0) if len(points) > 1 else frame.width,
                         28 if all(p.tick for p in points) else 90)
    for i, point in enumerate(points):
        circle = (f'<circle class="point" cx="{px(i):.1f}" cy="{py(point.value):.1f}" r="4" '
                  f'fill="{SHORT_TERM}"><title>{escape(point.label)}: '
                  f'{_reading(point.value, unit)} {escape(unit)}</title></circle>')
        # No link on a point: a chart is one image to assistive technology, which
        # may hold nothing focusable; each export's row in the table beside it links.
        parts.append(circle)
        if i in labelled:
            parts.append(_trend_tick(point, px(i), frame.y(0) + 16, "middle" if point.tick
                                     or len(points) == 1 else "start" if i == 0
                                     else "end" if i == len(points) - 1 else "middle"))
    parts.append(f'<text class="chart-title" x="{frame.left:.1f}" y="{frame.top - 8:.1f}">'
                 f'{escape(title)}</text>')
    parts.append(_axis_titles(frame, "export", unit))
    parts.append(_frame_box(frame))
    return "".join(parts) + "</svg>"


def _labelled(count: int, spacing: float, room: float) -> set[int]:
    """Which of `count` points, `spacing` apart, get a label `room` wide: every
    one that fits, always the latest, none crowding the latest."""
    every = max(1, math.ceil(room / spacing))
    last = count - 1
    return {i for i in range(0, count, every) if i == last or last - i >= every} | {last}


def _trend_tick(point: TrendPoint, x: float, y: float, anchor: str) -> str:
    """A point's label under the axis: its number, or its date (in the browser's
    time zone: the page's script rewrites it from data-utc)."""
    if point.tick:
        return (f'<text class="x-tick" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">'
                f'{escape(point.tick)}</text>')
    return (f'<text class="x-tick" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" '
            f'data-utc="{escape(point.at)}" data-style="short">'
            f'{escape(point.at[5:16].replace("T", " "))}</text>')
