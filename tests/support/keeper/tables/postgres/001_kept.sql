CREATE TABLE IF NOT EXISTS kept_values (
    run_id      TEXT PRIMARY KEY,
    value       TEXT,
    name        TEXT,
    tags        TEXT,
    size        BIGINT,
    source      TEXT NOT NULL,
    accepted_at DOUBLE PRECISION NOT NULL
);
