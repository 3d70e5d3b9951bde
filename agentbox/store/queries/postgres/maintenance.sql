-- The PostgreSQL engine's statements for maintenance (store/maintenance.py): replay, discard, expiry.
-- Named statements, loaded by agentbox.store.queries; queries/sqlite/maintenance.sql holds
-- the same names in SQLite's words.

-- name: replay
UPDATE runs SET status = 'accepted', next_attempt_at = %(now)s, updated_at = %(now)s,
       completed_at = NULL, error_code = NULL, error_message = NULL, result = NULL,
       replays = replays + 1, attempt_base = attempt
WHERE run_id = %(run_id)s

-- name: undiscard
DELETE FROM discarded_runs WHERE run_id = %(run_id)s

-- name: insert_history
INSERT INTO run_history (run_id, at, status, attempt, note)
VALUES (%(run_id)s, %(at)s, %(status)s, %(attempt)s, %(note)s)

-- name: insert_discard
INSERT INTO discarded_runs (run_id, reason, at) VALUES (%(run_id)s, %(reason)s, %(at)s)
ON CONFLICT (run_id) DO UPDATE SET reason = excluded.reason, at = excluded.at

-- name: prune_keys
DELETE FROM idempotency_keys WHERE key IN (
    SELECT key FROM idempotency_keys WHERE expires_at <= %(now)s LIMIT %(limit)s)
