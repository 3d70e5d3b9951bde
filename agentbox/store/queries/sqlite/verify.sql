-- The SQLite engine's statements for integrity checks (agentbox verify, store/verify.py): each returns the offending rows.
-- Named statements, loaded by agentbox.store.queries; queries/postgres/verify.sql holds
-- the same names in PostgreSQL's words.

-- name: check_events_without_runs
SELECT e.event_id FROM events e
WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_pk = e.pk) LIMIT 20

-- name: check_runs_without_event
SELECT r.run_id FROM runs r
WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.pk = r.event_pk) LIMIT 20

-- name: check_keys_without_event
SELECT k.key FROM idempotency_keys k
WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.pk = k.event_pk) LIMIT 20

-- name: check_unknown_run_states
SELECT run_id FROM runs WHERE status NOT IN ('accepted', 'processing', 'succeeded',
    'failed_retryable', 'failed_permanent', 'dead_lettered') LIMIT 20

-- name: check_processing_without_lease
SELECT run_id FROM runs
WHERE status = 'processing' AND (lease_owner IS NULL OR lease_expires_at IS NULL) LIMIT 20

-- name: check_waiting_without_time
SELECT run_id FROM runs
WHERE status IN ('accepted', 'failed_retryable') AND next_attempt_at IS NULL LIMIT 20

-- name: check_terminal_without_time
SELECT run_id FROM runs
WHERE status IN ('succeeded', 'failed_permanent', 'dead_lettered') AND completed_at IS NULL
LIMIT 20

-- name: check_notifications_without_run
SELECT o.notification_id FROM outbox o
WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = o.run_id) LIMIT 20

-- name: check_unknown_delivery_states
SELECT notification_id FROM outbox WHERE state NOT IN ('pending', 'delivered', 'dead') LIMIT 20

-- name: check_attempts_beyond_run
SELECT a.run_id FROM attempts a JOIN runs r ON r.run_id = a.run_id
WHERE a.attempt > r.attempt LIMIT 20

-- name: check_run_counts
-- The runs by state the store keeps (version 10: run_counts) against its runs counted.
SELECT status || ': kept ' || sum(kept) || ', stored ' || sum(stored) FROM (
    SELECT status, runs AS kept, 0 AS stored FROM run_counts
    UNION ALL
    SELECT status, 0, count(*) FROM runs GROUP BY status
) counts GROUP BY status HAVING sum(kept) <> sum(stored) LIMIT 20
