-- The archive of exports (agentbox/archive). kept_audio: the bytes a review heard,
-- one row per reviewed run, kept under their SHA-256 in the archive folder of the
-- instance named `keeper`; `dropped_at` and `dropped_because` say when and why the
-- archive let them go (a project page says the export is no longer playable). The
-- live ones are indexed by keeper, for the archive's bounds. project_references:
-- each project's reference track, its bytes in the same archive, its measurements
-- (the meter's, JSON) taken once, when it was added.
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
