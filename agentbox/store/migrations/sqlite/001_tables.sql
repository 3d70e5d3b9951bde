-- Version 1: the tables. A database made before schema versions (user_version 0)
-- holds them already: every statement only adds what is missing.
CREATE TABLE IF NOT EXISTS events (
    pk              INTEGER PRIMARY KEY,
    event_id        TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    source          TEXT NOT NULL,
    correlation_id  TEXT,
    causation_id    TEXT,
    hop             INTEGER NOT NULL DEFAULT 0,
    callback_url    TEXT,
    received_at     REAL NOT NULL,
    body            BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_event_id ON events (event_id);
CREATE INDEX IF NOT EXISTS events_correlation ON events (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key        TEXT PRIMARY KEY,
    event_pk   INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expiry ON idempotency_keys (expires_at);
CREATE TABLE IF NOT EXISTS runs (
    run_id           TEXT PRIMARY KEY,
    event_pk         INTEGER NOT NULL REFERENCES events (pk),
    ordinal          INTEGER NOT NULL,
    agent            TEXT NOT NULL,
    status           TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at REAL,
    next_attempt_at  REAL,
    accepted_at      REAL NOT NULL,
    started_at       REAL,
    updated_at       REAL NOT NULL,
    completed_at     REAL,
    result           TEXT,
    error_code       TEXT,
    error_message    TEXT,
    replays          INTEGER NOT NULL DEFAULT 0,
    attempt_started_at REAL,
    attempt_base     INTEGER NOT NULL DEFAULT 0  -- attempt count at the last replay
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_event ON runs (event_pk, ordinal);
CREATE INDEX IF NOT EXISTS runs_ready ON runs (next_attempt_at)
    WHERE status IN ('accepted', 'failed_retryable');
CREATE INDEX IF NOT EXISTS runs_leased ON runs (lease_expires_at)
    WHERE status = 'processing';
CREATE INDEX IF NOT EXISTS runs_status ON runs (status, run_id);
CREATE INDEX IF NOT EXISTS runs_completed ON runs (completed_at) WHERE completed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    run_id        TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    owner         TEXT NOT NULL,
    started_at    REAL NOT NULL,
    finished_at   REAL,
    outcome       TEXT,
    error_code    TEXT,
    error_message TEXT,
    PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;
-- Notable changes that the runs and attempts rows do not show by themselves (replays).
CREATE TABLE IF NOT EXISTS run_history (
    run_id  TEXT NOT NULL,
    at      REAL NOT NULL,
    status  TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    note    TEXT
);
CREATE INDEX IF NOT EXISTS run_history_run ON run_history (run_id, at);
-- The transactional outbox: one row per callback owed, written with the state change.
CREATE TABLE IF NOT EXISTS outbox (
    pk               INTEGER PRIMARY KEY,
    notification_id  TEXT NOT NULL UNIQUE,
    run_id           TEXT NOT NULL,
    status           TEXT NOT NULL,  -- the run state it reports
    destination      TEXT NOT NULL,  -- the URL's origin
    url              TEXT NOT NULL,
    body             BLOB NOT NULL,
    state            TEXT NOT NULL DEFAULT 'pending',  -- pending, delivered, dead
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    next_attempt_at  REAL,  -- by the schedule; while leased, the lease's end
    -- 1 when it may be sent: the earliest pending one of its run, destination not paused.
    -- Only those are in outbox_ready, so claiming never walks over rows that must wait.
    ready            INTEGER NOT NULL,
    lease_owner      TEXT,
    last_attempt_at  REAL,
    delivered_at     REAL,
    last_error       TEXT,  -- a category (timeout, http_503, ...), never a response body
    last_status_code INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_ready ON outbox (next_attempt_at)
    WHERE state = 'pending' AND ready = 1;
CREATE INDEX IF NOT EXISTS outbox_pending_run ON outbox (run_id, pk) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_pending_destination ON outbox (destination)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_run ON outbox (run_id, pk);
CREATE INDEX IF NOT EXISTS outbox_state ON outbox (state, pk);
-- Dead letters someone looked at and decided not to replay.
CREATE TABLE IF NOT EXISTS discarded_runs (
    run_id TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    at     REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS callback_destinations (
    destination          TEXT PRIMARY KEY,
    state                TEXT NOT NULL DEFAULT 'active',  -- active, paused
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    paused_reason        TEXT,
    paused_at            REAL,
    last_error           TEXT,
    updated_at           REAL NOT NULL
) WITHOUT ROWID;
