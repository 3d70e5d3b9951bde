-- The review's tables, version 1: each export's kept audio, each project's reference
-- track, and what a project's history keeps of a run that retention removed (see
-- queries.sql). Databases made before the review had its own line hold these tables
-- already (the store's versions 4 and 7 made them, and still do): IF NOT EXISTS
-- adopts them as they are, rows and all.
CREATE TABLE IF NOT EXISTS project_exports (
    run_id       TEXT COLLATE "C" PRIMARY KEY,
    project      TEXT COLLATE "C" NOT NULL,
    agent        TEXT COLLATE "C" NOT NULL,
    status       TEXT COLLATE "C" NOT NULL,
    accepted_at  DOUBLE PRECISION NOT NULL,
    completed_at DOUBLE PRECISION,
    result       TEXT COLLATE "C"
);
CREATE INDEX IF NOT EXISTS project_exports_project
    ON project_exports (project, accepted_at, run_id);
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
