"""Tonal balance: a mix's octave bands held against a reference, and the notes
for the octaves far from it.

A reference is a `TonalReference`: each octave's share of the power, in dB, under
a name the notes use. It comes from a genre's average curve (the profile's), or
from a reference track measured beside the mix; anything else that has octave
bands (a project's own reference, kept from earlier) makes one the same way
(`from_bands`). Genre curves are averages: their notes say that genres differ.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentbox.review.figures import tenths
from agentbox.review.genres import NO_PARTS, Genre, Parts
from agentbox.review.model import MixMetrics, Note, OctaveBand

OCTAVES_HZ = (31.5, 63.0, 125.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0)
TONAL_MIN_SECONDS = 10.0  # shorter files say little about tonal balance
TONAL_EXCESS_DB = 4.0  # an octave this far over the reference is a problem
TONAL_LACK_DB = 6.0  # one this far under it (a lack is heard less than an excess)
# With no genre and no reference track, the average curve says little about this
# track: released music departs from it by 5 dB and more in any octave (measured on
# the real-music corpus), so only departures beyond these are noted.
EXTREME_EXCESS_DB = 8.0
EXTREME_LACK_DB = 12.0
TONAL_NOTES_MAX = 3  # the furthest octaves; more would bury the rest of the review
EMPTY_DB = -60.0  # an octave this far under the whole holds next to nothing


@dataclass(frozen=True)
class TonalReference:
    name: str  # as the notes say it: "the streaming reference curve", "the reference track x.wav"
    levels: dict[float, float]  # octave centre (Hz) -> its share of the power, dB

    def over(self, octaves: Sequence[float]) -> dict[float, float]:
        """Its levels over `octaves` only, as shares of their total (as a mix's bands
        are, when its sample rate has fewer of them)."""
        found = {hz: self.levels[hz] for hz in octaves if hz in self.levels}
        total = sum(10 ** (db / 10) for db in found.values())
        if not total:
            return {}
        return {hz: round(db - 10 * math.log10(total), 1) for hz, db in found.items()}


def aligned(reference: TonalReference, bands: Sequence[OctaveBand]) -> dict[float, float]:
    """The reference's level beside each of the mix's octave bands, moved as a whole
    to sit on the mix where most of its octaves do (by the median difference). Both
    are shares of their own totals, so an octave far too strong lowers every other
    share: held against the bare shares it would read as every other octave too
    weak; against the aligned curve it stands out alone."""
    levels = reference.over([band.hz for band in bands])
    away = [band.db - levels[band.hz] for band in bands
            if band.hz in levels and band.db > EMPTY_DB]
    if not away:
        return levels
    offset = statistics.median(away)
    return {hz: round(db + offset, 1) for hz, db in levels.items()}


def from_curve(name: str, curve: Sequence[float]) -> TonalReference:
    """A genre's average curve (one level per octave, 31.5 Hz up)."""
    return TonalReference(name, dict(zip(OCTAVES_HZ, curve, strict=False)))


def from_bands(name: str, bands: Iterable[OctaveBand]) -> TonalReference:
    """A record's own octave bands (a reference track's)."""
    return TonalReference(name, {band.hz: band.db for band in bands})


# (code when over, code when under, octaves, what is over, what to try; what is
# under, what to try), low to high.
# The advice names the parts of the genre's arrangement ({low}, {low_mids},
# {presence}, {top}: genres.Parts), none with no genre.
REGIONS = (
    ("sub_rumble", None, (31.5,),
     "Sub-bass rumble", "high-pass what does not need it below 30 Hz and check the tails "
     "of {low}", "", ""),
    ("low_end_buildup", "thin_low_end", (63.0, 125.0),
     "Low-end build-up", "cut 2-3 dB there ({low}) or high-pass the tracks that do "
     "not need it",
     "Thin low end", "bring up {low} (a low shelf around 80 Hz), or check that they are "
     "not high-passed"),
    ("muddy", "hollow", (250.0, 500.0),
     "Muddy low mids", "cut 2-3 dB around 250-500 Hz on {low_mids}",
     "Hollow low mids", "ease the cuts around 250-500 Hz: the body of the mix is missing"),
    ("honky", "scooped", (1000.0,),
     "Honky mids", "a gentle dip around 1 kHz",
     "Scooped mids", "{presence} may get lost; bring up around 1 kHz"),
    ("harsh", "dull_presence", (2000.0, 4000.0),
     "Harshness", "a gentle dip there (or de-essing {top}) will tame it",
     "Little presence", "a gentle lift around 2-4 kHz brings {presence} forward"),
    ("bright", "dull", (8000.0, 16000.0),
     "Bright top", "soften {top}, or a high shelf down a little",
     "Dull top", "little air up there: a high shelf, or check for a low-pass on the mix "
     "bus (an MP3 cuts it too)"),
)


# On a master only the master's EQ can move: a broad, gentle curve; more than that is
# the mix's to fix.
MASTER_OVER = ("a broad cut of 1-2 dB there on the master's EQ; if it takes more, send "
               "it back to the mix")
MASTER_UNDER = ("a broad lift of 1-2 dB there on the master's EQ; if it takes more, send "
                "it back to the mix")


def notes(m: MixMetrics, genre: bool = True, told: Genre | None = None,
          master: bool = False) -> list[Note]:
    """The octaves furthest from the reference the bands carry (`reference_db`),
    named with what to try; none for a file too short to say. `genre`: that
    reference is a genre's average (the first note says genres differ); `told`: the
    genre the review was told (its curve is that reference), None for none, when
    only extreme departures are noted."""
    if m.duration_seconds < TONAL_MIN_SECONDS:
        return []
    away = {b.hz: b.db - b.reference_db for b in m.octave_bands if b.reference_db is not None}
    excess, lack = ((EXTREME_EXCESS_DB, EXTREME_LACK_DB) if genre and told is None
                    else (TONAL_EXCESS_DB, TONAL_LACK_DB))
    parts = NO_PARTS if told is None else told.parts
    found: list[tuple[float, Note]] = []
    for over, under, octaves, over_what, over_try, under_what, under_try in REGIONS:
        present = [(away[hz], hz) for hz in octaves if hz in away]
        if not present:
            continue
        high, low = max(present), min(present)
        if high[0] > excess:
            fix = MASTER_OVER if master else _named(over_try, parts)
            found.append((high[0], _note(over, over_what, fix, high, m)))
        elif under and low[0] < -lack:
            fix = MASTER_UNDER if master else _named(under_try, parts)
            found.append((-low[0], _note(under, under_what, fix, low, m)))
    found.sort(key=lambda item: -item[0])
    kept = [note for _, note in found[:TONAL_NOTES_MAX]]
    if kept and genre:
        first = kept[0]
        kept[0] = first.model_copy(update={"text": first.text + (
            " Genres differ: the curve is an average of released music, so weigh this "
            "against records like yours (or send one as the reference track)."
            if told is not None else
            " No genre was given, so only this far from the average of released music "
            "is noted; send the genre (\"genre\" in the payload) to judge the track "
            "against its own kind, or a reference track.")})
    return kept


def _named(advice: str, parts: Parts) -> str:
    return advice.format(low=parts.low, low_mids=parts.low_mids, presence=parts.presence,
                         top=parts.top)


def _note(code: str, what: str, fix: str, where: tuple[float, float], m: MixMetrics) -> Note:
    by, hz = where
    octave = f"{hz / 1000:g} kHz" if hz >= 1000 else f"{hz:g} Hz"
    against = m.tonal_reference or "the reference curve"
    level = next((b.db for b in m.octave_bands if b.hz == hz), 0.0)
    sits = (f"the {octave} octave holds next to nothing (far under {against})"
            if level <= EMPTY_DB else
            f"the {octave} octave sits {tenths(abs(by))} dB {'above' if by > 0 else 'under'} "
            f"{against}")
    return Note(severity="consider", code=code, text=f"{what}: {sits}; {fix}.")
