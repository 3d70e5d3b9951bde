-- The review's tables (agentbox.archive.history) in SQLite's words: the audio each
-- review heard, each project's reference track, and what a project's history keeps of
-- a run retention removed. Named statements (agentbox.store.tables); tables/postgres/
-- queries.sql holds the same names in the other engine's words. They read the core
-- tables `runs` and `events` (docs/apps.md lists the columns an app may read).

-- name: keep_audio
-- Kept again: a replayed run's new review replaces its row, and one the archive had
-- dropped is live again.
INSERT INTO kept_audio (run_id, project, sha256, size, file_name, keeper, kept_at)
VALUES (:run_id, COALESCE((SELECT project FROM project_aliases WHERE name = :project),
                          :project), :sha256, :size, :file_name, :keeper, :kept_at)
ON CONFLICT (run_id) DO UPDATE SET project = excluded.project, sha256 = excluded.sha256,
    size = excluded.size, file_name = excluded.file_name, keeper = excluded.keeper,
    kept_at = excluded.kept_at, dropped_at = NULL, dropped_because = NULL

-- name: drop_audio
UPDATE kept_audio SET dropped_at = :now, dropped_because = :because
WHERE run_id = :run_id AND dropped_at IS NULL

-- name: kept_audio
-- Every export of a project whose audio was kept, dropped or not, newest first.
SELECT run_id, project, sha256, size, file_name, keeper, kept_at, dropped_at, dropped_because
FROM kept_audio WHERE project = :project ORDER BY kept_at DESC, run_id DESC LIMIT :limit

-- name: live_audio
SELECT run_id, project, sha256, size, file_name, keeper, kept_at, dropped_at, dropped_because
FROM kept_audio INDEXED BY kept_audio_live
WHERE keeper = :keeper AND dropped_at IS NULL ORDER BY kept_at, run_id

-- name: reference
SELECT project, name, sha256, size, keeper, measurements, added_at
FROM project_references WHERE project = :project

-- name: references
SELECT project, name, sha256, size, keeper, measurements, added_at
FROM project_references ORDER BY project LIMIT :limit

-- name: set_reference.previous
-- The reference it replaces.
SELECT project, name, sha256, size, keeper, measurements, added_at
FROM project_references WHERE project = :project

-- name: set_reference.upsert
INSERT INTO project_references (project, name, sha256, size, keeper, measurements, added_at)
VALUES (:project, :name, :sha256, :size, :keeper, :measurements, :added_at)
ON CONFLICT (project) DO UPDATE SET name = excluded.name, sha256 = excluded.sha256,
    size = excluded.size, keeper = excluded.keeper, measurements = excluded.measurements,
    added_at = excluded.added_at

-- name: remove_reference.previous
SELECT project, name, sha256, size, keeper, measurements, added_at
FROM project_references WHERE project = :project

-- name: remove_reference.delete
DELETE FROM project_references WHERE project = :project

-- name: projects
-- The latest render of each project (per agent when :agent is given), newest first:
-- the runs still stored, and those retention removed (project_exports); a project
-- by its current name (project_aliases), without what its removal took away.
SELECT run_id, project, agent, status, accepted_at, completed_at, result, archived FROM (
    SELECT x.*, row_number() OVER (PARTITION BY x.project
                                   ORDER BY x.accepted_at DESC, x.run_id DESC) AS n
    FROM (
        SELECT r.run_id, COALESCE(a.project, p.project) AS project, r.agent, r.status,
               r.accepted_at, r.completed_at, r.result, 0 AS archived
        FROM run_projects p JOIN runs r ON r.run_id = p.run_id
        JOIN events e ON e.pk = r.event_pk
        LEFT JOIN project_aliases a ON a.name = p.project
        WHERE (:agent IS NULL OR r.agent = :agent)
          AND e.source <> 'agentbox.rejudge'  -- a re-judgment is no new export
        UNION ALL
        SELECT run_id, project, agent, status, accepted_at, completed_at, result,
               1 AS archived
        FROM project_exports WHERE :agent IS NULL OR agent = :agent
    ) x
    LEFT JOIN removed_projects d ON d.project = x.project
    WHERE (d.project IS NULL OR x.accepted_at > d.removed_at)
      AND NOT EXISTS (SELECT 1 FROM not_audio n WHERE n.run_id = x.run_id)
) WHERE n = 1
ORDER BY accepted_at DESC, run_id DESC LIMIT :limit

-- name: project_exports
SELECT run_id, project, agent, status, accepted_at, completed_at, result, archived FROM (
    SELECT r.run_id, p.project, r.agent, r.status, r.accepted_at, r.completed_at, r.result,
           0 AS archived
    FROM run_projects p JOIN runs r ON r.run_id = p.run_id
    WHERE p.project IN (SELECT :project
                        UNION ALL SELECT name FROM project_aliases WHERE project = :project)
    UNION ALL
    SELECT run_id, project, agent, status, accepted_at, completed_at, result, 1 AS archived
    FROM project_exports WHERE project = :project
) x
WHERE accepted_at > COALESCE((SELECT removed_at FROM removed_projects
                              WHERE project = :project), -1)
  AND NOT EXISTS (SELECT 1 FROM not_audio n WHERE n.run_id = x.run_id)  -- no export
  AND (:agent IS NULL OR agent = :agent)
  AND (:status IS NULL OR status = :status)
  AND (:before_run_id IS NULL OR (accepted_at, run_id) < (
       SELECT b.accepted_at, b.run_id FROM runs b WHERE b.run_id = :before_run_id
       UNION ALL
       SELECT a.accepted_at, a.run_id FROM project_exports a WHERE a.run_id = :before_run_id
       LIMIT 1))
ORDER BY accepted_at DESC, run_id DESC LIMIT :limit

-- name: archived_export
-- A run retention removed, as the project pages keep it (no row: not archived).
SELECT run_id, project, agent, status, accepted_at, completed_at, result, 1 AS archived
FROM project_exports WHERE run_id = :run_id

-- name: keep_exports
-- Run by retention before it removes runs (Schema.before_prune), in the same
-- transaction: what the project pages read of a run, kept after it goes.
INSERT INTO project_exports (run_id, project, agent, status, accepted_at, completed_at, result)
SELECT r.run_id, COALESCE((SELECT a.project FROM project_aliases a WHERE a.name = p.project),
                          p.project), r.agent, r.status, r.accepted_at, r.completed_at, r.result
FROM json_each(:ids) j CROSS JOIN runs r ON r.run_id = j.value
CROSS JOIN run_projects p ON p.run_id = r.run_id
WHERE true
ON CONFLICT (run_id) DO NOTHING

-- name: export
-- One run of a project, stored or kept after retention removed it (no row: no such
-- run, or one that named no project).
SELECT r.run_id, p.project, r.agent, r.status, r.accepted_at, r.completed_at, r.result,
       0 AS archived
FROM runs r JOIN run_projects p ON p.run_id = r.run_id
WHERE r.run_id = :run_id
UNION ALL
SELECT run_id, project, agent, status, accepted_at, completed_at, result, 1 AS archived
FROM project_exports WHERE run_id = :run_id
LIMIT 1

-- name: resolve
-- The project a name is now (a former name's), or no row: the name is its own.
SELECT project FROM project_aliases WHERE name = :name

-- name: move.alias
-- Project :old is now :new (renamed, or merged into it): its name, and the names it
-- had, are aliases of :new; :new is no alias of anything any more.
INSERT INTO project_aliases (name, project) VALUES (:old, :new)
ON CONFLICT (name) DO UPDATE SET project = excluded.project

-- name: move.aliases
UPDATE project_aliases SET project = :new WHERE project = :old

-- name: move.unalias
DELETE FROM project_aliases WHERE name = :new

-- name: move.exports
UPDATE project_exports SET project = :new WHERE project = :old

-- name: move.audio
UPDATE kept_audio SET project = :new WHERE project = :old

-- name: move.reference
-- The reference track goes along, unless :new has one of its own.
UPDATE project_references SET project = :new
WHERE project = :old AND NOT EXISTS (SELECT 1 FROM project_references WHERE project = :new)

-- name: move.removed
UPDATE removed_projects SET project = :new
WHERE project = :old AND NOT EXISTS (SELECT 1 FROM removed_projects WHERE project = :new)

-- name: move.leftovers
DELETE FROM project_references WHERE project = :old

-- name: move.leftover_removal
DELETE FROM removed_projects WHERE project = :old

-- name: remove_project
INSERT INTO removed_projects (project, removed_at) VALUES (:project, :now)
ON CONFLICT (project) DO UPDATE SET removed_at = excluded.removed_at

-- name: keep_runs
-- Each run's project, in the transaction that stores its event, once per run (its
-- :run_id; Schema.keeps kept an object: :project, the event's payload.project_id,
-- NFC, and for a render :size and :sha256, the bytes its admission read).
INSERT INTO run_projects (run_id, project, size, sha256)
VALUES (:run_id, :project, :size, :sha256)
ON CONFLICT (run_id) DO NOTHING

-- name: keep_runs.summary
-- The exports in the kept summary (version 4), one row per project by the name it goes
-- by now: counted, and the latest if it came after the one the summary holds. Run once
-- per project and source a transaction names (it takes :runs, their number; :run_id
-- and :accepted_at are the latest of them). A re-judgment (source agentbox.rejudge) is
-- no export of its own (version 5).
INSERT INTO project_summary (project, run_id, accepted_at, exports)
SELECT COALESCE((SELECT a.project FROM project_aliases a WHERE a.name = :project), :project),
       :run_id, :accepted_at, :runs
WHERE :source IS NOT 'agentbox.rejudge'
ON CONFLICT (project) DO UPDATE SET
    exports = exports + excluded.exports,
    run_id = CASE WHEN (excluded.accepted_at, excluded.run_id) > (accepted_at, run_id)
                  THEN excluded.run_id ELSE run_id END,
    accepted_at = CASE WHEN (excluded.accepted_at, excluded.run_id) > (accepted_at, run_id)
                       THEN excluded.accepted_at ELSE accepted_at END

-- name: admitted_digest
-- The size and SHA-256 of the bytes a render's admission read (no row, or NULLs: not
-- known).
SELECT size, sha256 FROM run_projects WHERE run_id = :run_id

-- name: forget_runs
-- Run by retention after keep_exports (Schema.forget), as the runs go.
DELETE FROM run_projects WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: keep_exports.preview
-- What keep_exports would keep of the runs a dry prune finds `due`.
SELECT count(*) FROM due JOIN run_projects p ON p.run_id = due.run_id

-- name: run_field.project
-- A run's project, in its view (GET /runs/{run_id}'s `project`).
SELECT p.project FROM run_projects p WHERE p.run_id = r.run_id

-- name: search_runs.project
-- The run search's filter: the runs of a project, by the name their event sent.
EXISTS (SELECT 1 FROM run_projects p WHERE p.run_id = r.run_id AND p.project = :project)

-- name: search_runs.text
-- The run search's text is also a project's name: the runs of that project.
SELECT p.run_id FROM run_projects p WHERE p.project = :text

-- name: projects.page
-- A page of projects by their latest export, newest first (the home page, GET
-- /exports): read from the kept summary (version 4), the rows shown and no more.
-- :name keeps the projects whose name holds it (any case of ASCII letters); :after_at
-- and :after_run, the position of the last project of the page before.
SELECT s.project, s.exports, s.run_id, COALESCE(r.agent, x.agent) AS agent,
       COALESCE(r.status, x.status) AS status, s.accepted_at,
       COALESCE(r.completed_at, x.completed_at) AS completed_at,
       COALESCE(r.result, x.result) AS result, r.run_id IS NULL AS archived
FROM project_summary s INDEXED BY project_summary_latest
LEFT JOIN runs r ON r.run_id = s.run_id
LEFT JOIN project_exports x ON x.run_id = s.run_id
WHERE (:name IS NULL OR instr(lower(s.project), lower(:name)) > 0)
  AND (:after_at IS NULL OR (s.accepted_at, s.run_id) < (:after_at, :after_run))
ORDER BY s.accepted_at DESC, s.run_id DESC LIMIT :limit

-- name: projects.count
SELECT count(*) AS projects FROM project_summary
WHERE :name IS NULL OR instr(lower(project), lower(:name)) > 0

-- name: summary.forget
-- A project renamed, merged or removed: its summary is made again (summary.refresh).
DELETE FROM project_summary WHERE project = :project

-- name: summary.refresh
-- A project's summary from the definition of its latest export (project_latest).
INSERT INTO project_summary (project, run_id, accepted_at, exports)
SELECT project, run_id, accepted_at, exports FROM project_latest WHERE project = :project

-- name: not_audio.note
-- A run whose review found no audio in its file (mix_unreadable): no export of its
-- project from now on (version 7). Its project as the event named it, or no row.
INSERT INTO not_audio (run_id, project, noted_at)
SELECT run_id, project, :now FROM run_projects WHERE run_id = :run_id
ON CONFLICT (run_id) DO NOTHING
RETURNING project

-- name: not_audio.shown
-- The files that could not be reviewed and are not dismissed, newest first.
SELECT run_id FROM not_audio WHERE dismissed_at IS NULL
ORDER BY noted_at DESC, run_id DESC LIMIT :limit

-- name: not_audio.dismiss
UPDATE not_audio SET dismissed_at = :now
WHERE run_id = :run_id AND dismissed_at IS NULL

-- name: not_audio.noted
SELECT run_id FROM not_audio WHERE run_id = :run_id

-- name: not_audio.forget
-- A noted run replayed and reviewed after all (its file holds audio now): an export
-- again. Its project as the event named it, or no row.
DELETE FROM not_audio WHERE run_id = :run_id
RETURNING project

-- name: not_audio.missed
-- What a stop between a review's end and its noting left unsaid (the noting follows
-- the outcome's commit): the review runs that failed as no audio and are not noted,
-- and the noted ones reviewed after all.
SELECT r.run_id, r.agent, r.status FROM runs r JOIN run_projects p ON p.run_id = r.run_id
WHERE r.status = 'failed_permanent' AND r.error_code = 'mix_unreadable'
  AND NOT EXISTS (SELECT 1 FROM not_audio n WHERE n.run_id = r.run_id)
UNION ALL
SELECT r.run_id, r.agent, r.status FROM not_audio n JOIN runs r ON r.run_id = n.run_id
WHERE r.status = 'succeeded'
