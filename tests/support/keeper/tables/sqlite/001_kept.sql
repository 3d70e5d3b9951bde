CREATE TABLE IF NOT EXISTS kept_values (
    run_id      TEXT PRIMARY KEY,
    value       TEXT,
    name        TEXT,
    tags        TEXT,
    size        INTEGER,
    source      TEXT NOT NULL,
    accepted_at REAL NOT NULL
);
