"""The review's history, in its own tables beside the engine's (agentbox.store.tables):
each project's exports (its runs, and what a project keeps of those that retention
removed), the audio each review heard, and each project's reference track.

The review app gives its store the `SCHEMA` (migration line `review`, statements in
tables/<engine>/) and makes one `History` on the handle it gets back; the archive,
the agent (as a service of its context) and the pages read and write through it.
"""

from __future__ import annotations

import json
import unicodedata
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from agentbox.archive.records import KeptAudio, ProjectExport, ProjectLatest, ProjectReference
from agentbox.events import Event
from agentbox.runs import RunStatus
from agentbox.store import AppDb, Schema, Tables, iso, unaskable


def project_of(event: Event) -> str | None:
    """The project an event names (its payload's `project_id`), NFC-normalised so
    that one name typed two ways is one project; None when it names none."""
    project = getattr(event.payload, "project_id", None)
    return unicodedata.normalize("NFC", project) if isinstance(project, str) else None


class Admitted:
    """The bytes (size, SHA-256) each render's admission read, by its event's
    idempotency key, until the ingest that stores the event keeps them with its runs
    (`kept`). Bounded: an event admitted and then refused (429, 503) leaves its entry
    behind until newer ones push it out."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._digests: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def note(self, key: str, size: int, sha256: str) -> None:
        self._digests[key] = (size, sha256)
        self._digests.move_to_end(key)
        while len(self._digests) > self.LIMIT:
            self._digests.popitem(last=False)

    def take(self, key: str) -> tuple[int, str] | None:
        # Called in the writer's transaction (another thread): one dict call, atomic.
        return self._digests.pop(key, None)


ADMITTED = Admitted()  # the review's admission (renders.identify) notes; the ingest takes


def kept(event: Event) -> dict[str, Any] | None:
    """What the ingest keeps of an event with its runs (Schema.keeps): its project
    and, for a render, the bytes its admission read (keep_runs reads the object)."""
    project = project_of(event)
    if project is None:
        return None
    digest = ADMITTED.take(event.envelope.idempotency_key)
    size, sha256 = digest if digest is not None else (None, None)
    return {"project": project, "size": size, "sha256": sha256}


# Each run's project is the review's (run_projects): kept with its event's ingest, shown
# in the run's view (`project`), searched by (`?project=`, and a search's text).
SCHEMA = Schema(line="review", package="agentbox.archive", before_prune="keep_exports",
                kept_in="project_exports", forget="forget_runs", keeps=kept,
                run_fields=("project",), filters=("project", "text"))
KEPT_COLUMNS = ("run_id", "project", "sha256", "size", "file_name", "keeper", "kept_at",
                "dropped_at", "dropped_because")
REFERENCE_COLUMNS = ("project", "name", "sha256", "size", "keeper", "measurements", "added_at")
Row = Mapping[str, Any]


class History:
    """Reads and writes of the review's tables; every method answers as the store's
    did when these were the store's (same rows, same order, NUL-holding names
    found nowhere)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    # -- a project's exports ----------------------------------------------------------

    async def projects(self, *, limit: int = 100,
                       agent: str | None = None) -> list[ProjectExport]:
        """The latest export of each project (one per project), newest first; by
        `agent`'s runs alone when given (a scan of every export: the pages ask the
        kept summary, `latest`)."""
        if unaskable(agent):
            return []
        if agent is None:
            return [found.latest for found in await self.latest(limit=limit)]
        rows = await self.tables.slow_rows("projects", agent=agent, limit=limit)
        return [export_of(row) for row in rows]

    async def latest(self, *, limit: int, name: str | None = None,
                     after: tuple[float, str] | None = None) -> list[ProjectLatest]:
        """A page of projects by their latest export, newest first, from the summary
        kept with each export (the review's version 4): `name`, the projects whose name
        holds it (ASCII letters in either case); `after`, the `position` of the last
        project of the page before."""
        if unaskable(name) or (after is not None and unaskable(after[1])):
            return []
        at, run = after if after is not None else (None, None)
        rows = await self.tables.rows("projects.page", name=name, after_at=at,
                                      after_run=run, limit=limit)
        return [ProjectLatest(export_of(row), int(row["exports"]),
                              (float(row["accepted_at"]), str(row["run_id"])))
                for row in rows]

    async def count_projects(self, name: str | None = None) -> int:
        """How many projects there are (whose name holds `name`, when given)."""
        if unaskable(name):
            return 0
        rows = await self.tables.rows("projects.count", name=name)
        return int(rows[0]["projects"])

    async def project_exports(self, project: str, *, agent: str | None = None,
                              status: str | None = None, before_run_id: str | None = None,
                              limit: int = 50) -> list[ProjectExport]:
        """A project's exports, newest first (accepted_at, then run_id).
        before_run_id: only runs accepted before that run (for "the previous export")."""
        if unaskable(project, agent, status, before_run_id):
            return []
        now = await self.resolve(project)
        rows = await self.tables.rows("project_exports", project=now, agent=agent,
                                      status=status, before_run_id=before_run_id,
                                      limit=limit)
        return [export_of(row, now) for row in rows]  # each by the name it goes by now

    async def admitted_digest(self, run_id: str) -> tuple[int, str] | None:
        """The size and SHA-256 of the bytes a render's admission read (None: not
        known, as for a run stored before the review kept them)."""
        if unaskable(run_id):
            return None
        rows = await self.tables.rows("admitted_digest", run_id=run_id)
        if not rows or rows[0]["size"] is None or rows[0]["sha256"] is None:
            return None
        return int(rows[0]["size"]), str(rows[0]["sha256"])

    async def previous_export(self, project: str, *, agent: str,
                              before_run_id: str) -> ProjectExport | None:
        """The most recent succeeded export of `project` by `agent`, accepted before
        `before_run_id` (None: that run is the project's first)."""
        found = await self.project_exports(project, agent=agent, before_run_id=before_run_id,
                                           status=RunStatus.SUCCEEDED.value, limit=1)
        return found[0] if found else None

    async def export(self, run_id: str) -> ProjectExport | None:
        """One run of a project, stored or archived; None: no such run, or one that
        named no project."""
        if unaskable(run_id):
            return None
        rows = await self.tables.rows("export", run_id=run_id)
        return export_of(rows[0], await self.resolve(rows[0]["project"])) if rows else None

    async def archived_export(self, run_id: str) -> ProjectExport | None:
        """What a project's history kept of a run that retention removed (`archived`),
        or None: the run is stored, or never was, or named no project."""
        if unaskable(run_id):
            return None
        rows = await self.tables.rows("archived_export", run_id=run_id)
        return export_of(rows[0]) if rows else None

    # -- tidying projects ---------------------------------------------------------------

    async def resolve(self, name: str) -> str:
        """The project `name` is now (a renamed or merged project's former name says
        which), in NFC; `name` itself when it is its own."""
        name = unicodedata.normalize("NFC", name)
        rows = await self.tables.rows("resolve", name=name)
        return str(rows[0]["project"]) if rows else name

    async def move(self, old: str, new: str) -> None:
        """Project `old` becomes `new` (renamed, or merged into it): its exports, kept
        audio and former names follow; its reference track too unless `new` has one.
        Its events keep the name they were sent with; `old` stays an alias, so an
        export still sent under it joins `new`."""
        params = {"old": old, "new": new}

        def move(db: AppDb) -> None:
            for step in ("move.alias", "move.aliases", "move.unalias", "move.exports",
                         "move.audio", "move.reference", "move.removed", "move.leftovers",
                         "move.leftover_removal"):
                db.run(step, params)
            _summarise(db, old, new)
        await self.tables.write(move)

    async def remove_project(self, project: str, now: float) -> None:
        """The project's exports up to `now` are no longer shown; a later export under
        its name starts it anew."""
        def remove(db: AppDb) -> None:
            db.run("remove_project", {"project": project, "now": now})
            _summarise(db, project)
        await self.tables.write(remove)

    # -- files that could not be reviewed as audio ---------------------------------------

    async def note_not_audio(self, run_id: str, now: float) -> str | None:
        """A run whose review found no audio in its file is no export of its project
        (its summary is made again without it); its project's name now, or None (a
        run of no project, or one noted already)."""
        def note(db: AppDb) -> str | None:
            row = db.run("not_audio.note", {"run_id": run_id, "now": now}).fetchone()
            return None if row is None else _resummarise(db, row)
        return await self.tables.write(note)

    async def unnote_not_audio(self, run_id: str) -> str | None:
        """A noted run reviewed after all (replayed once its file holds audio) is an
        export again; its project's name now, or None (it was not noted)."""
        if unaskable(run_id) or not await self.tables.rows("not_audio.noted", run_id=run_id):
            return None

        def forget(db: AppDb) -> str | None:
            row = db.run("not_audio.forget", {"run_id": run_id}).fetchone()
            return None if row is None else _resummarise(db, row)
        return await self.tables.write(forget)

    async def missed_not_audio(self) -> list[tuple[str, str, bool]]:
        """Runs whose noting a stop left undone: (run_id, agent, whether it failed as
        no audio: else it was noted and has been reviewed since)."""
        rows = await self.tables.slow_rows("not_audio.missed")
        return [(str(row["run_id"]), str(row["agent"]), row["status"] != "succeeded")
                for row in rows]

    async def not_audio(self, limit: int = 50) -> list[str]:
        """The runs of files that could not be reviewed as audio, not dismissed, newest
        first."""
        return [str(row["run_id"]) for row in await self.tables.rows("not_audio.shown",
                                                                     limit=limit)]

    async def dismiss_not_audio(self, run_id: str, now: float) -> bool:
        """The file of `run_id` is no longer listed as one that could not be reviewed;
        False: it is not listed (no such run, or dismissed already)."""
        if unaskable(run_id):
            return False
        return await self.tables.write(lambda db: db.run(
            "not_audio.dismiss", {"run_id": run_id, "now": now}).rowcount > 0)

    # -- the audio each review heard ----------------------------------------------------

    async def keep_audio(self, kept: KeptAudio) -> None:
        """Record the bytes a review heard as kept. Again for the same run (a replay's
        new review) replaces the row, and makes one the archive had dropped live."""
        params = {name: getattr(kept, name) for name in KEPT_COLUMNS[:7]}
        await self.tables.write(lambda db: db.run("keep_audio", params))

    async def drop_audio(self, drops: Sequence[tuple[str, str]], now: float) -> int:
        """Mark kept audio, (run_id, why) each, as let go by the archive; how many were
        live."""
        def drop(db: AppDb) -> int:
            return sum(max(db.run("drop_audio", {"run_id": run_id, "because": because,
                                                 "now": now}).rowcount, 0)
                       for run_id, because in drops)
        return await self.tables.write(drop)

    async def kept_audio(self, project: str, limit: int = 500) -> list[KeptAudio]:
        """The audio kept of a project's exports, dropped or not, newest first."""
        if unaskable(project):
            return []
        return [kept_of(row) for row in await self.tables.rows(
            "kept_audio", project=await self.resolve(project), limit=limit)]

    async def live_audio(self, keeper: str) -> list[KeptAudio]:
        """The audio `keeper` keeps (not dropped), oldest first."""
        return [kept_of(row) for row in await self.tables.slow_rows("live_audio",
                                                                    keeper=keeper)]

    # -- each project's reference track ----------------------------------------------------

    async def set_reference(self, reference: ProjectReference) -> ProjectReference | None:
        """Make `reference` its project's reference track; the one it replaces."""
        def put(db: AppDb) -> ProjectReference | None:
            previous = db.run("set_reference.previous", {"project": reference.project}
                              ).fetchone()
            db.run("set_reference.upsert", {
                **{name: getattr(reference, name) for name in REFERENCE_COLUMNS},
                "measurements": json.dumps(reference.measurements, separators=(",", ":"))})
            return None if previous is None else reference_of(previous)
        return await self.tables.write(put)

    async def remove_reference(self, project: str) -> ProjectReference | None:
        """A project no longer has a reference track; the one it had."""
        if unaskable(project):
            return None

        def remove(db: AppDb) -> ProjectReference | None:
            previous = db.run("remove_reference.previous", {"project": project}).fetchone()
            if previous is None:
                return None
            db.run("remove_reference.delete", {"project": project})
            return reference_of(previous)
        return await self.tables.write(remove)

    async def reference(self, project: str) -> ProjectReference | None:
        """A project's reference track, or None."""
        if unaskable(project):
            return None
        rows = await self.tables.rows("reference", project=await self.resolve(project))
        return reference_of(rows[0]) if rows else None

    async def references(self, limit: int = 500) -> list[ProjectReference]:
        """Every project's reference track, by project."""
        return [reference_of(row) for row in await self.tables.rows("references", limit=limit)]


def _summarise(db: AppDb, *projects: str) -> None:
    """Make the kept summary of `projects` again (a new export keeps it by itself:
    keep_runs' statement, version 8), in the transaction that changed what they show."""
    for project in projects:
        db.run("summary.forget", {"project": project})
    for project in projects:
        db.run("summary.refresh", {"project": project})


def _resummarise(db: AppDb, row: Any) -> str:
    """Make the summary of the project a row names (as an event named it) again; the
    name it goes by now."""
    named = str(_named(row, ("project",))["project"])
    alias = db.run("resolve", {"name": named}).fetchone()
    project = named if alias is None else str(_named(alias, ("project",))["project"])
    _summarise(db, project)
    return project


def export_of(row: Row, project: str | None = None) -> ProjectExport:
    """`project`: the name the export's project goes by now, when the row has the
    name it was sent with (a renamed or merged project's former one)."""
    return ProjectExport(
        run_id=row["run_id"], project=project or row["project"], agent=row["agent"],
        status=row["status"],
        accepted_at=iso(row["accepted_at"]) or "", finished_at=iso(row["completed_at"]),
        result=_json(row["result"]) if row["status"] == RunStatus.SUCCEEDED else None,
        archived=bool(row["archived"]))


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


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
