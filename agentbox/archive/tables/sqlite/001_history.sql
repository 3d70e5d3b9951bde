-- The review's tables, version 1: each export's kept audio, each project's reference
-- track, and what a project's history keeps of a run that retention removed (see
-- queries.sql). Databases made before the review had its own line hold these tables
-- already (the store's versions 4 and 7 made them, and still do): IF NOT EXISTS
-- adopts them as they are, rows and all.
CREATE TABLE IF NOT EXISTS project_exports (
    run_id       TEXT PRIMARY KEY,
    project      TEXT NOT NULL,
    agent        TEXT NOT NULL,
    status       TEXT NOT NULL,
    accepted_at  REAL NOT NULL,
    completed_at REAL,
    result       TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS project_exports_project
    ON project_exports (project, accepted_at, run_id);
CREATE TABLE IF NOT EXISTS kept_audio (
    run_id          TEXT PRIMARY KEY,
    project         TEXT NOT NULL,
    sha256          TEXT NOT NULL,
    size            INTEGER NOT NULL,
    file_name       TEXT NOT NULL,
    keeper          TEXT NOT NULL,
    kept_at         REAL NOT NULL,
    dropped_at      REAL,
    dropped_because TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kept_audio_project ON kept_audio (project, kept_at);
CREATE INDEX IF NOT EXISTS kept_audio_live ON kept_audio (keeper, kept_at)
    WHERE dropped_at IS NULL;
CREATE TABLE IF NOT EXISTS project_references (
    project      TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    sha256       TEXT NOT NULL,
    size         INTEGER NOT NULL,
    keeper       TEXT NOT NULL,
    measurements TEXT NOT NULL,
    added_at     REAL NOT NULL
) WITHOUT ROWID;
