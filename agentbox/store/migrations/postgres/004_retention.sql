-- Retention (store/retention.py). `project_exports` keeps what the project pages
-- and the comparison with the previous export read of a run that retention
-- removed (written in the same transaction as the removal); `body_removed_at`
-- says when an event's raw body was blanked, and the events still holding a body
-- are indexed by age, so that finding the next bodies due never walks over the
-- ones already blanked.
ALTER TABLE events ADD COLUMN IF NOT EXISTS body_removed_at DOUBLE PRECISION;
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
CREATE INDEX IF NOT EXISTS events_with_body ON events (received_at, pk)
    WHERE body_removed_at IS NULL;
