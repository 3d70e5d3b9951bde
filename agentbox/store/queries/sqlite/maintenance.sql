-- The SQLite engine's statements for maintenance (store/maintenance.py): replay, discard, expiry.
-- Named statements, loaded by agentbox.store.queries; queries/postgres/maintenance.sql holds
-- the same names in PostgreSQL's words.

-- name: replay
UPDATE runs SET status = 'accepted', next_attempt_at = :now, updated_at = :now,
       completed_at = NULL, error_code = NULL, error_message = NULL, result = NULL,
       replays = replays + 1, attempt_base = attempt
WHERE run_id = :run_id

-- name: undiscard
DELETE FROM discarded_runs WHERE run_id = :run_id

-- name: insert_history
INSERT INTO run_history (run_id, at, status, attempt, note)
VALUES (:run_id, :at, :status, :attempt, :note)

-- name: insert_discard
INSERT INTO discarded_runs (run_id, reason, at) VALUES (:run_id, :reason, :at)
ON CONFLICT (run_id) DO UPDATE SET reason = excluded.reason, at = excluded.at

-- name: prune_keys
DELETE FROM idempotency_keys WHERE key IN (
    SELECT key FROM idempotency_keys WHERE expires_at <= :now LIMIT :limit)
