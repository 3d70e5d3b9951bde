-- The SQLite engine's statements for reads and views (store/reads.py).
-- Named statements, loaded by agentbox.store.queries; queries/postgres/reads.sql holds
-- the same names in PostgreSQL's words.

-- name: get_run
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.webhook_id{fields}
FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = :run_id

-- name: list_runs
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.webhook_id{fields}
FROM runs r JOIN events e ON e.pk = r.event_pk ORDER BY r.run_id DESC LIMIT :limit

-- name: list_runs_by_status
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.webhook_id{fields}
FROM runs r JOIN events e ON e.pk = r.event_pk
WHERE r.status = :status ORDER BY r.run_id DESC LIMIT :limit

-- name: search_runs
-- where: the search_runs.* conditions asked for, joined by AND (or TRUE), the text's
-- widened by each app's (Schema.filters); fields: the columns apps add to a run's
-- view (Schema.run_fields), each `, (expression) AS name`, or nothing.
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.webhook_id{fields}
FROM runs r JOIN events e ON e.pk = r.event_pk
WHERE {where} ORDER BY r.run_id DESC LIMIT :limit

-- name: search_runs.status
r.status = :status
-- name: search_runs.event_type
e.event_type = :event_type
-- name: search_runs.agent
r.agent = :agent
-- name: search_runs.chain
(e.correlation_id = :chain OR (e.event_id = :chain AND e.correlation_id IS NULL))
-- name: search_runs.text
-- The runs the text names (a run's id, an event's id or correlation id, and each app's
-- own: Schema.filters' `text`, `UNION ALL` a query of run ids), found by their indexes
-- rather than by reading every run for each.
r.run_id IN (SELECT :text
             UNION ALL SELECT t.run_id FROM events x JOIN runs t ON t.event_pk = x.pk
                       WHERE x.event_id = :text OR x.correlation_id = :text {text})
-- name: search_runs.since
r.accepted_at >= :since
-- name: search_runs.until
r.accepted_at < :until
-- name: search_runs.before
r.run_id < :before
-- name: search_runs.not_discarded
NOT EXISTS (SELECT 1 FROM discarded_runs d WHERE d.run_id = r.run_id)

-- name: attempts
SELECT attempt, owner, started_at, finished_at, outcome, error_code, error_message
FROM attempts WHERE run_id = :run_id ORDER BY attempt

-- name: running_attempt
SELECT attempt, lease_owner AS owner, attempt_started_at AS started_at FROM runs
WHERE run_id = :run_id AND status = 'processing'

-- name: run_accepted_at
SELECT accepted_at FROM runs WHERE run_id = :run_id

-- name: history
SELECT at, status, attempt, note FROM run_history WHERE run_id = :run_id ORDER BY at

-- name: event_of
SELECT e.body, e.body_removed_at, e.event_id, e.event_type, e.source, e.received_at
FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = :run_id

-- name: discarded
SELECT reason, at FROM discarded_runs WHERE run_id = :run_id

-- name: status_counts
-- The oldest waiting run's acceptance (its age), the first entry of the waiting runs'
-- index. The runs by state are the writer's (SqliteStore.run_counts, version 11):
-- at 30,000 runs the status index's 30,000 entries took 8 ms to count on each page.
SELECT (SELECT min(accepted_at) FROM runs INDEXED BY runs_waiting
        WHERE status IN ('accepted', 'failed_retryable')) AS oldest_waiting

-- name: active_counts
-- The unfinished runs alone (stats(finished=False): `active` and oldest waiting, not the
-- finished): the entries of the status index under those three states, so that a page
-- that shows only these reads as much with 30,000 finished runs as with none.
SELECT count(*) AS active,
       (SELECT min(accepted_at) FROM runs INDEXED BY runs_waiting
        WHERE status IN ('accepted', 'failed_retryable')) AS oldest_waiting
FROM runs INDEXED BY runs_status WHERE status IN ('accepted', 'processing', 'failed_retryable')

-- name: finished_counts
-- CAST truncates toward zero here; the slices start at :since, so none is negative.
SELECT CAST((completed_at - :since) / :width AS INTEGER) AS slice, count(*) AS runs
FROM runs INDEXED BY runs_completed
WHERE completed_at >= :since GROUP BY 1

-- name: run_notifications
SELECT * FROM outbox INDEXED BY outbox_run WHERE run_id = :run_id ORDER BY pk

-- name: list_notifications
SELECT * FROM outbox ORDER BY pk DESC LIMIT :limit

-- name: list_notifications_by_state
SELECT * FROM outbox WHERE state = :state ORDER BY pk DESC LIMIT :limit

-- name: destinations
SELECT d.*, (SELECT count(*) FROM outbox o INDEXED BY outbox_pending_destination
             WHERE o.destination = d.destination AND o.state = 'pending') AS pending
FROM callback_destinations d ORDER BY d.destination
