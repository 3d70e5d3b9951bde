"""The archive of exports' records (agentbox.archive keeps the files): the audio
kept of each reviewed export, and each project's reference track."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentbox.store.records import KeptAudio, ProjectReference
from agentbox.store.writer import Batch, Db


def keep_audio(db: Db, state: Batch, *, kept: KeptAudio) -> None:
    db.run("keep_audio", {"run_id": kept.run_id, "project": kept.project,
                          "sha256": kept.sha256, "size": kept.size,
                          "file_name": kept.file_name, "keeper": kept.keeper,
                          "kept_at": kept.kept_at})


def drop_audio(db: Db, state: Batch, *, drops: Sequence[tuple[str, str]], now: float) -> int:
    """Mark kept audio (run_id, why) dropped; how many were live."""
    return sum(max(db.run("drop_audio", {"run_id": run_id, "because": because,
                                         "now": now}).rowcount, 0)
               for run_id, because in drops)


def set_reference(db: Db, state: Batch, *, reference: ProjectReference
                  ) -> ProjectReference | None:
    previous = db.run("set_reference.previous", {"project": reference.project}).fetchone()
    db.run("set_reference.upsert", {
        "project": reference.project, "name": reference.name, "sha256": reference.sha256,
        "size": reference.size, "keeper": reference.keeper, "added_at": reference.added_at,
        "measurements": json.dumps(reference.measurements, separators=(",", ":"))})
    return None if previous is None else reference_of(previous)


def remove_reference(db: Db, state: Batch, *, project: str) -> ProjectReference | None:
    previous = db.run("remove_reference.previous", {"project": project}).fetchone()
    if previous is None:
        return None
    db.run("remove_reference.delete", {"project": project})
    return reference_of(previous)


KEPT_COLUMNS = ("run_id", "project", "sha256", "size", "file_name", "keeper", "kept_at",
                "dropped_at", "dropped_because")
REFERENCE_COLUMNS = ("project", "name", "sha256", "size", "keeper", "measurements", "added_at")


def _named(row: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    """A row by column name: a reader's rows are read by name, a writer's by place."""
    return {c: row[c] for c in columns} if hasattr(row, "keys") else dict(zip(
        columns, row, strict=True))


def kept_of(row: Any) -> KeptAudio:
    found = _named(row, KEPT_COLUMNS)
    return KeptAudio(**{**found, "size": int(found["size"]),
                        "kept_at": float(found["kept_at"])})


def reference_of(row: Any) -> ProjectReference:
    found = _named(row, REFERENCE_COLUMNS)
    return ProjectReference(**{**found, "size": int(found["size"]),
                               "measurements": json.loads(found["measurements"]),
                               "added_at": float(found["added_at"])})
