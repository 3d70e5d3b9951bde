-- The backup app's copies: one per run of its agent, where the mix was and where
-- its copy is.
CREATE TABLE IF NOT EXISTS backup_copies (
    run_id    TEXT PRIMARY KEY,
    source    TEXT NOT NULL,
    copy      TEXT NOT NULL,
    copied_at REAL NOT NULL
);
