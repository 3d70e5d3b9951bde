-- The review's tables, version 3: each run's project is the review's, in its own
-- table (run_projects, written with the event's ingest, in the same transaction),
-- where it was a column of the engine's events table (the engine's version 3 made
-- it). The engine's version 9, which runs before this one, dropped each of the
-- review's former tables, and the column, if it held nothing (a database made with
-- no app has none of them): the tables are made again here, as version 1 made them.
-- A database an earlier release wrote still has the column, filled: its values go
-- into run_projects (one row per run of an event that named a project) and the
-- column goes.
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
CREATE TABLE IF NOT EXISTS run_projects (
    run_id  TEXT COLLATE "C" PRIMARY KEY,
    project TEXT COLLATE "C" NOT NULL  -- payload.project_id, NFC, as the event named it
);
CREATE INDEX IF NOT EXISTS run_projects_project ON run_projects (project, run_id);
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = current_schema() AND table_name = 'events'
                 AND column_name = 'project') THEN
        INSERT INTO run_projects (run_id, project)
        SELECT r.run_id, e.project FROM events e JOIN runs r ON r.event_pk = e.pk
        WHERE e.project IS NOT NULL
        ON CONFLICT (run_id) DO NOTHING;
        DROP INDEX IF EXISTS events_project;
        ALTER TABLE events DROP COLUMN project;
    END IF;
END
$$;
