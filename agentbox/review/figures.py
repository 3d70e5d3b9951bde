"""The review's figures as people read them: their names, units and decimals, a
number read from a stored document, a time in a song, where the clipping is.

Every place that writes one of these (the notes, the page, the terminal, the
charts, the meter's messages) takes it from here, so that one mix reads the same
everywhere. A leaf: it imports nothing of agentbox.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

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
PLACES_LISTED = 8  # places named in words; the chart marks all
PLACE_GAP_SECONDS = 1.0  # places closer than this read as one


def finite(value: Any) -> float | None:
    """A number from a stored document: a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def fixed(value: float, digits: int = 1, signed: bool = False) -> str:
    """A reading to `digits` decimals as the review writes it, the one formatter of
    every sentence, table, chart label and terminal line: never "-0.0" (a reading
    that rounds to nothing is "0.0"); `signed`, with its sign: "+0.4", "-1.2"."""
    shown = round(value, digits) + 0.0  # + 0.0: -0.0 becomes 0.0
    return f"{shown:+.{digits}f}" if signed and shown != 0 else f"{shown:.{digits}f}"


def rounded(value: float, digits: int = 2) -> float:
    """A reading rounded for a stored document: never -0.0 (JSON would say "-0.0")."""
    return round(value, digits) + 0.0


def tenths(value: float, signed: bool = False) -> str:
    """A reading to 0.1 (`fixed`): "0.0", never "-0.0"; `signed`: "+0.4", "-1.2"."""
    return fixed(value, 1, signed)


def change_unit(unit: str) -> str:
    """The unit of a difference of two figures in `unit`: LUFS -> LU, dBTP -> dB."""
    return CHANGE_UNITS.get(unit, unit)


def mmss(seconds: float, decimals: int = 0) -> str:
    """A time in a song as a musician reads it: 1:05 for 65 s, 1:02:05 past an hour;
    with `decimals`, 0:17.2."""
    if decimals:
        minutes, rest = divmod(round(max(0.0, seconds), decimals), 60)
        return f"{int(minutes)}:{rest:0{3 + decimals}.{decimals}f}"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def length(seconds: float) -> str:
    """How long a file is: 3:02, or 8.0 s under a minute."""
    return mmss(seconds) if round(seconds) >= 60 else f"{tenths(seconds)} s"


def places(spans: Iterable[tuple[float, float]]) -> str:
    """Where something happens, as a musician reads it: "0:16-0:18, 1:04 and 12 more"
    (with an en dash; places less than a second apart read as one). The notes and the page's chart
    captions both say it so, and so name the same places."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start - merged[-1][1] < PLACE_GAP_SECONDS:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    shown = [mmss(a) + ("\N{EN DASH}" + mmss(b) if mmss(b) != mmss(a) else "")
             for a, b in merged[:PLACES_LISTED]]
    more = len(merged) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def local_time(iso: str, seconds: bool = False) -> str:
    """14:02 (today), else 3 Dec 14:02, in this machine's time zone; with `seconds`,
    14:02:37 (what tells apart two renders of one minute); what is not an ISO time,
    as it is."""
    try:
        moment = datetime.fromisoformat(iso).astimezone()
    except ValueError:
        return iso
    clock = moment.strftime("%H:%M:%S" if seconds else "%H:%M")
    if moment.date() == datetime.now().astimezone().date():
        return clock
    return f"{moment.day} {moment.strftime('%b')} {clock}"
