-- The SQLite engine's statements for claims and leases (store/claims.py).
-- Named statements, loaded by agentbox.store.queries; queries/postgres/claims.sql holds
-- the same names in PostgreSQL's words.

-- name: due_expired
SELECT run_id FROM runs INDEXED BY runs_leased
WHERE status = 'processing' AND lease_expires_at <= :now
ORDER BY lease_expires_at LIMIT :limit

-- name: run_for_claim
SELECT r.run_id, r.agent, r.status, r.attempt, r.accepted_at, r.attempt_base,
       e.body, e.event_id, e.event_type, e.source, r.lease_owner, r.attempt_started_at,
       e.callback_url
FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = :run_id

-- name: claim_expired
UPDATE runs SET status = 'processing', attempt = :attempt, lease_owner = :owner,
       lease_expires_at = :lease_until, attempt_started_at = :now, updated_at = :now
WHERE run_id = :run_id

-- name: dead_letter_expired
UPDATE runs SET status = 'dead_lettered', lease_owner = NULL, lease_expires_at = NULL,
       updated_at = :now, completed_at = :now, error_code = 'lease_expired',
       error_message = :message
WHERE run_id = :run_id

-- name: claim_waiting
-- One statement claims a whole batch of waiting runs (the hot path).
UPDATE runs SET status = 'processing', attempt = attempt + 1, lease_owner = :owner,
       lease_expires_at = :lease_until, next_attempt_at = NULL,
       started_at = coalesce(started_at, :now), attempt_started_at = :now, updated_at = :now
WHERE run_id IN (
    SELECT run_id FROM runs INDEXED BY runs_ready
    WHERE status IN ('accepted', 'failed_retryable') AND next_attempt_at <= :now
    ORDER BY next_attempt_at LIMIT :limit)
RETURNING run_id, agent, attempt, attempt_base, accepted_at, event_pk

-- name: events_by_pk
-- :pks is a JSON array of the events' keys.
SELECT pk, body, event_id, event_type, source, callback_url FROM events
WHERE pk IN (SELECT value FROM json_each(:pks))

-- name: lock_run
-- SQLite's writer is alone: reading the row is all the lock there is to take.
SELECT status, attempt FROM runs WHERE run_id = :run_id

-- name: extend_lease
UPDATE runs SET lease_expires_at = :until
WHERE run_id = :run_id AND lease_owner = :owner AND attempt = :attempt
  AND status = 'processing'

-- name: renew_lease
-- One attempt's lease, renewed by its holder whose own deadline passed (a pause, a
-- sleep): only if nobody claimed the run since (a claim moves the attempt on), even
-- past the lease's end. The row it answers says it was renewed.
UPDATE runs SET lease_expires_at = :until
WHERE run_id = :run_id AND lease_owner = :owner AND attempt = :attempt
  AND status = 'processing'
RETURNING run_id

-- name: held_leases
SELECT run_id, attempt FROM runs WHERE status = 'processing' AND lease_owner = :owner

-- name: release_leases
UPDATE runs SET lease_expires_at = :now WHERE lease_owner = :owner AND status = 'processing'

-- name: release_all_leases
UPDATE runs SET lease_expires_at = :now WHERE status = 'processing'

-- name: give_back_attempt
-- A claimed attempt whose agent never started is given back (attempt_started_at NULL
-- tells the next claim there is no lost attempt to record).
UPDATE runs SET attempt = attempt - 1, attempt_started_at = NULL, lease_expires_at = :now,
       started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END
WHERE run_id = :run_id AND lease_owner = :owner AND attempt = :attempt
  AND status = 'processing'

-- name: next_waiting
-- ORDER BY ... LIMIT 1 walks the partial indexes; min() would not use them.
SELECT next_attempt_at AS due FROM runs INDEXED BY runs_ready
WHERE status IN ('accepted', 'failed_retryable')
ORDER BY next_attempt_at LIMIT 1

-- name: next_lease_end
SELECT lease_expires_at AS due FROM runs INDEXED BY runs_leased WHERE status = 'processing'
ORDER BY lease_expires_at LIMIT 1
