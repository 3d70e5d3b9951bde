"""What a project page offers to listen to: the exports the archive still holds
and the project's reference track, each with its address and measured loudness,
for the A/B player (static/ab.js, which matches their levels by that loudness).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from agentbox.archive.records import KeptAudio, ProjectReference
from agentbox.review.view import ExportRow


@dataclass(frozen=True)
class Source:
    key: str  # the run's id, or "reference"
    label: str  # as the player's choices say it ("#3 Night Drive.wav"), before `at`
    url: str  # where its bytes are served
    lufs: float | None  # its integrated loudness: None when silent (nothing to match)
    kind: str  # "export" or "reference"
    rate: int | None = None  # its sample rate (the player plays at the first one's)
    at: str | None = None  # an export's time (ISO 8601, UTC), said as the page says times


@dataclass(frozen=True)
class Listening:
    sources: list[Source]
    a: str  # the keys chosen at first: the latest export ...
    b: str  # ... and the one before it (or the reference)


def reference_url(project: str) -> str:
    return "/projects/" + quote(project, safe="") + "/reference"


def listening(rows: list[ExportRow], kept: dict[str, KeptAudio],
              reference: ProjectReference | None, keeper: str | None,
              archive_on: bool) -> Listening | None:
    """The A/B player's choices, or None when there are not two things to hear.
    With the archive on: the exports it holds here; off, only the latest export
    (its file may still be the one reviewed)."""
    sources = []
    for row in rows:
        if row.review is None:
            continue
        held = kept.get(row.run_id)
        if archive_on and (held is None or held.dropped_at is not None
                           or held.keeper != keeper):
            continue
        rate = row.review.figure("sample_rate")
        sources.append(Source(row.run_id, row.label,
                              f"/runs/{quote(row.run_id, safe='')}/audio",
                              row.review.figure("integrated_lufs"), "export",
                              int(rate) if rate else None, row.accepted_at))
        if not archive_on:
            break
    if reference is not None and reference.keeper == keeper:
        sources.append(Source("reference", f"Reference: {reference.name}",
                              reference_url(reference.project) + "/audio",
                              reference.measurements.get("integrated_lufs"), "reference",
                              reference.measurements.get("sample_rate")))
    if len(sources) < 2:
        return None
    return Listening(sources, sources[0].key, sources[1].key)
