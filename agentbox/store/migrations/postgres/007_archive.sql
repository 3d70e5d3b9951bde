-- The archive of exports (agentbox/archive). kept_audio: the bytes a review heard,
-- one row per reviewed run, kept under their SHA-256 in the archive folder of the
-- instance named `keeper` (instances sharing this database each keep their own);
-- `dropped_at` and `dropped_because` say when and why the archive let them go (a
-- project page says the export is no longer playable). The live ones are indexed
-- by keeper, for the archive's bounds. project_references: each project's
-- reference track, its bytes in one instance's archive, its measurements (the
-- meter's, JSON) taken once, when it was added.
CREATE TABLE IF NOT EXISTS kept_audio (
    run_id          TEXT COLLATE "C" PRIMARY KEY,
    project         TEXT COLLATE "C" NOT NULL,
    sha256          TEXT COLLATE "C" NOT NULL,
    size            BIGINT NOT NULL,
    file_name       TEXT NOT NULL,
    keeper          TEXT COLLATE "C" NOT NULL,
    kept_at         DOUBLE PRECISION NOT NULL,
    dropped_at      DOUBLE PRECISION,
    dropped_because TEXT
);
CREATE INDEX IF NOT EXISTS kept_audio_project ON kept_audio (project, kept_at);
CREATE INDEX IF NOT EXISTS kept_audio_live ON kept_audio (keeper, kept_at)
    WHERE dropped_at IS NULL;
CREATE TABLE IF NOT EXISTS project_references (
    project      TEXT COLLATE "C" PRIMARY KEY,
    name         TEXT NOT NULL,
    sha256       TEXT COLLATE "C" NOT NULL,
    size         BIGINT NOT NULL,
    keeper       TEXT COLLATE "C" NOT NULL,
    measurements TEXT NOT NULL,
    added_at     DOUBLE PRECISION NOT NULL
);
