"""A review beside a reference track: the project's (kept by the archive and
measured once, when it was added) or the one the event names (`reference_url`,
which wins for that event). What differs is said in a musician's words: how much
louder or quieter, more or less squashed, a wider or narrower stereo image, and
where the tonal balance departs from the reference's ("2.8 dB less air at
8-16 kHz than your reference").

The judge takes the result as the review's `reference` (and its note); the
octave bands are held against the track's own curve instead of the genre's
(agentbox.review.tonal: the agent gives the track's bands as the tonal reference).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentbox.archive import Archive
from agentbox.engine.agents import AgentContext
from agentbox.review.figures import fixed, rounded, tenths
from agentbox.review.model import MixMetrics, ReferenceView

SOURCES = ("project", "event")  # where a review's reference came from
# Octaves grouped as a musician names the parts of the spectrum: (name, its octave
# centres, how the note writes their range).
REGIONS = (
    ("sub-bass", (31.5,), "around 30 Hz"),
    ("low end", (63.0, 125.0), "at 60-125 Hz"),
    ("low mids", (250.0, 500.0), "at 250-500 Hz"),
    ("mids", (1000.0,), "around 1 kHz"),
    ("presence", (2000.0, 4000.0), "at 2-4 kHz"),
    ("air", (8000.0, 16000.0), "at 8-16 kHz"),
)
TONAL_SAID_DB = 2.0  # a region this far from the reference's is said
TONAL_REGIONS_SAID = 2
NEARLY_NONE_DB = 24.0  # a region this far under the reference's is as good as missing
LOUDNESS_SAID_LU = 0.5
PLR_SAID_DB = 1.5  # peak-to-loudness: punch against squashing
LRA_SAID_LU = 1.5
WIDTH_SAID = 0.1  # stereo correlation: lower is wider


@dataclass(frozen=True)
class Track:
    """A reference track's measurements, as the meter left them."""

    metrics: MixMetrics
    name: str  # its file's name
    source: str  # "project" or "event"

    @property
    def called(self) -> str:
        return "your reference" if self.source == "project" else "the reference track"


async def project_reference(ctx: AgentContext, project: str) -> Track | None:
    """The project's reference track, if it has one (never an error: a bonus)."""
    archive = ctx.service(Archive)
    if archive is None or not project:
        return None
    try:
        found = await archive.history.reference(project)
        return None if found is None else Track(MixMetrics(**found.measurements), found.name,
                                                "project")
    except Exception:  # the comparison is a bonus: never fail the review for it
        ctx.log.warning("the project's reference track could not be read", exc_info=True)
        return None


def against(m: MixMetrics, track: Track) -> ReferenceView:
    """The mix beside the reference: each figure's difference (mix minus reference)
    and a note that says the ones that matter. `m` carries the track's octave
    levels aligned onto the mix in its bands' `reference_db` (judge.with_profile,
    given the track as the tonal reference: tonal.aligned, one way for every
    reference)."""
    ref = track.metrics
    changes: dict[str, float] = {}
    for key in ("integrated_lufs", "true_peak_dbtp", "loudness_range_lu", "plr_db",
                "stereo_correlation"):
        a, b = getattr(m, key), getattr(ref, key)
        if a is not None and b is not None:
            changes[key] = rounded(float(a) - float(b), 2)
    for band in m.octave_bands:
        if band.reference_db is not None:
            changes[f"band_{band.hz:g}_hz_db"] = rounded(band.db - band.reference_db, 1)
    return ReferenceView(file=track.name, integrated_lufs=ref.integrated_lufs,
                         true_peak_dbtp=ref.true_peak_dbtp,
                         loudness_range_lu=ref.loudness_range_lu, plr_db=ref.plr_db,
                         stereo_correlation=ref.stereo_correlation,
                         octave_bands=ref.octave_bands, deltas=changes, source=track.source,
                         note=note(changes, track))


def regions(changes: dict[str, float]) -> list[tuple[float, str, str]]:
    """(mix minus reference in dB, name, range) of each region of the spectrum both
    have, furthest first."""
    found = []
    for name, octaves, where in REGIONS:
        away = [changes[f"band_{hz:g}_hz_db"] for hz in octaves
                if f"band_{hz:g}_hz_db" in changes]
        if away:
            found.append((round(sum(away) / len(away), 1), name, where))
    return sorted(found, key=lambda item: -abs(item[0]))


def note(changes: dict[str, float], track: Track) -> str:
    """What differs from the reference, in a musician's words, most telling first."""
    called = track.called
    parts = [_loudness(changes.get("integrated_lufs"), called, track.name)]
    for by, name, where in regions(changes)[:TONAL_REGIONS_SAID]:
        if by <= -NEARLY_NONE_DB:
            parts.append(f"next to no {name} {where}, where {called} has it")
        elif abs(by) >= TONAL_SAID_DB:
            parts.append(f"{tenths(abs(by))} dB {'more' if by > 0 else 'less'} {name} {where} "
                         f"than {called}")
    plr = changes.get("plr_db")
    if plr is not None and abs(plr) >= PLR_SAID_DB:
        parts.append(f"{tenths(abs(plr))} dB {'more' if plr > 0 else 'less'} punch (peak to "
                     f"loudness): {'more open' if plr > 0 else 'more squashed'} than {called}")
    lra = changes.get("loudness_range_lu")
    if lra is not None and abs(lra) >= LRA_SAID_LU:
        parts.append(f"a loudness range {tenths(abs(lra))} LU {'wider' if lra > 0 else 'narrower'}")
    width = changes.get("stereo_correlation")
    if width is not None and abs(width) >= WIDTH_SAID:
        parts.append(f"a {'narrower' if width > 0 else 'wider'} stereo image (correlation "
                     f"{fixed(width, 2, True)})")
    if len(parts) == 1:
        parts.append("close to it in tonal balance, dynamics and width")
    return "; ".join(parts) + "."


def _loudness(by: float | None, called: str, name: str) -> str:
    if by is None:
        return f"Beside {called} {name}"
    if abs(by) < LOUDNESS_SAID_LU:
        return f"As loud as {called} {name}"
    return f"{tenths(abs(by))} LU {'louder' if by > 0 else 'quieter'} than {called} {name}"
