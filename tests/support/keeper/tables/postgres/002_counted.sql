-- What a counting statement keeps (`:runs`): runs by name, and the latest of them.
CREATE TABLE IF NOT EXISTS kept_counts (
    name        TEXT PRIMARY KEY,
    runs        INTEGER NOT NULL,
    latest      TEXT NOT NULL,
    accepted_at DOUBLE PRECISION NOT NULL
);
