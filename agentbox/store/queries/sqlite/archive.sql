-- The SQLite engine's statements for the archive of exports (store/archive.py).
-- Named statements, loaded by agentbox.store.queries; queries/postgres/archive.sql
-- holds the same names in PostgreSQL's words.

-- name: keep_audio
-- Kept again: a replayed run's new review replaces its row, and one the archive had
-- dropped is live again.
INSERT INTO kept_audio (run_id, project, sha256, size, file_name, keeper, kept_at)
VALUES (:run_id, :project, :sha256, :size, :file_name, :keeper, :kept_at)
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
