"""What the archive lets go when it is over its bounds: the oldest exports first.
Every kept byte counts, a project's latest export and the reference tracks too:
the exports older than a project's latest go first, then, if that is not enough,
the latest ones, oldest first. A reference track is never let go (it was given to
be kept: an upload the archive cannot hold is refused instead), so an export whose
bytes a reference holds costs nothing and stays.

A pure choice over the archive's records, so that it can be read and tested on
its own; the keeper applies it (agentbox.archive.keeper).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from agentbox.archive.records import KeptAudio, ProjectReference


@dataclass(frozen=True)
class Bounds:
    max_bytes: int  # the archive's files together (the same audio counted once)
    keep_per_project: int  # exports kept per project, the latest


def over_count(keep: int) -> str:
    return f"the archive keeps the latest {keep} exports of a project"


def over_size(max_bytes: int) -> str:
    return (f"the archive reached its size ({max_bytes / 1e9:g} GB) and lets the oldest "
            "exports go first")


def choose(live: Sequence[KeptAudio], references: Sequence[ProjectReference],
           bounds: Bounds) -> list[tuple[str, str]]:
    """(run_id, why) of each export whose audio goes: past the per-project count,
    then, oldest first (the projects' latest last), while the files the rest need
    are over the size."""
    by_project: dict[str, list[KeptAudio]] = {}
    for kept in sorted(live, key=lambda k: (k.kept_at, k.run_id), reverse=True):
        by_project.setdefault(kept.project, []).append(kept)
    latest = {rows[0].run_id for rows in by_project.values()}
    drops = {kept.run_id: over_count(bounds.keep_per_project)
             for rows in by_project.values() for kept in rows[bounds.keep_per_project:]
             if kept.run_id not in latest}
    referenced = {r.sha256 for r in references}
    holders: Counter[str] = Counter(k.sha256 for k in live if k.run_id not in drops)
    holders.update(referenced)
    sizes = {k.sha256: k.size for k in live} | {r.sha256: r.size for r in references}
    total = sum(sizes[sha] for sha in holders)
    for kept in sorted(live, key=lambda k: (k.run_id in latest, k.kept_at, k.run_id)):
        if total <= bounds.max_bytes:
            break
        if kept.run_id in drops or kept.sha256 in referenced:
            continue
        drops[kept.run_id] = over_size(bounds.max_bytes)
        holders[kept.sha256] -= 1
        if holders[kept.sha256] == 0:
            total -= sizes[kept.sha256]
            del holders[kept.sha256]
    return list(drops.items())


def total_bytes(live: Sequence[KeptAudio], references: Sequence[ProjectReference]) -> int:
    """The size of the files kept exports and references need (each file once)."""
    sizes = {k.sha256: k.size for k in live} | {r.sha256: r.size for r in references}
    return sum(sizes.values())
