-- The SQLite engine's statements for outcomes (store/outcomes.py).
-- Named statements, loaded by agentbox.store.queries; queries/postgres/outcomes.sql holds
-- the same names in PostgreSQL's words.

-- name: finish_runs.run
UPDATE runs SET status = :status, lease_owner = NULL, lease_expires_at = NULL,
       next_attempt_at = :next_attempt_at, updated_at = :now, completed_at = :completed_at,
       result = :result, error_code = :error_code, error_message = :error_message
WHERE run_id = :run_id AND status = 'processing' AND lease_owner = :owner
  AND attempt = :attempt
RETURNING event_pk, attempt_started_at, agent

-- name: finish_runs.event
SELECT event_id, event_type, source, callback_url FROM events WHERE pk = :event_pk

-- name: record_attempt
INSERT INTO attempts
    (run_id, attempt, owner, started_at, finished_at, outcome, error_code, error_message)
VALUES (:run_id, :attempt, :owner, :started_at, :finished_at, :outcome, :error_code,
        :error_message)
ON CONFLICT (run_id, attempt) DO UPDATE SET owner = excluded.owner,
    started_at = excluded.started_at, finished_at = excluded.finished_at,
    outcome = excluded.outcome, error_code = excluded.error_code,
    error_message = excluded.error_message
