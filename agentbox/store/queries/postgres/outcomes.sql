-- The PostgreSQL engine's statements for outcomes (store/outcomes.py).
-- Named statements, loaded by agentbox.store.queries; queries/sqlite/outcomes.sql holds
-- the same names in SQLite's words.

-- name: finish_runs
-- A whole batch's outcomes in one statement: the runs (only where the lease is
-- still the caller's), their attempts, and what the transitions report.
WITH u AS MATERIALIZED (
    SELECT * FROM unnest(%(run_ids)s::text[], %(statuses)s::text[],
                         %(next_attempt_ats)s::float8[], %(nows)s::float8[],
                         %(completed_ats)s::float8[], %(results)s::text[],
                         %(error_codes)s::text[], %(error_messages)s::text[],
                         %(owners)s::text[], %(attempts)s::bigint[])
         AS u (run_id, status, next_at, at, completed, result, code, message, owner, attempt)
),
done AS (
    UPDATE runs AS r SET status = u.status, lease_owner = NULL, lease_expires_at = NULL,
           next_attempt_at = u.next_at, updated_at = u.at, completed_at = u.completed,
           result = u.result, error_code = u.code, error_message = u.message
    FROM u
    WHERE r.run_id = u.run_id AND r.status = 'processing' AND r.lease_owner = u.owner
      AND r.attempt = u.attempt
    RETURNING r.run_id, r.event_pk, r.attempt_started_at, r.agent
),
recorded AS (
    INSERT INTO attempts (run_id, attempt, owner, started_at, finished_at, outcome,
                          error_code, error_message)
    SELECT d.run_id, u.attempt, u.owner, d.attempt_started_at, u.at, u.status, u.code,
           u.message
    FROM done d JOIN u ON u.run_id = d.run_id
    ON CONFLICT (run_id, attempt) DO UPDATE SET owner = excluded.owner,
        started_at = excluded.started_at, finished_at = excluded.finished_at,
        outcome = excluded.outcome, error_code = excluded.error_code,
        error_message = excluded.error_message
)
SELECT d.run_id, d.event_pk, d.agent, e.event_id, e.event_type, e.source, e.callback_url
FROM done d JOIN events e ON e.pk = d.event_pk

-- name: record_attempt
INSERT INTO attempts
    (run_id, attempt, owner, started_at, finished_at, outcome, error_code, error_message)
VALUES (%(run_id)s, %(attempt)s, %(owner)s, %(started_at)s, %(finished_at)s, %(outcome)s, %(error_code)s,
        %(error_message)s)
ON CONFLICT (run_id, attempt) DO UPDATE SET owner = excluded.owner,
    started_at = excluded.started_at, finished_at = excluded.finished_at,
    outcome = excluded.outcome, error_code = excluded.error_code,
    error_message = excluded.error_message
