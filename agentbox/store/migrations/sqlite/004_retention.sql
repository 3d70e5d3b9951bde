-- adds column: events body_removed_at REAL
-- Retention (store/retention.py). `project_exports` keeps what the project pages
-- and the comparison with the previous export read of a run that retention
-- removed (written in the same transaction as the removal); `body_removed_at`
-- (a column the engine adds) says when an event's raw body was blanked, and the
-- events still holding a body are indexed by age, so that finding the next
-- bodies due never walks over the ones already blanked.
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
CREATE INDEX IF NOT EXISTS events_with_body ON events (received_at, pk)
    WHERE body_removed_at IS NULL;
