-- The PostgreSQL engine's statements for claims and leases (store/claims.py).
-- Named statements, loaded by agentbox.store.queries; queries/sqlite/claims.sql holds
-- the same names in SQLite's words.

-- name: due_expired
-- SKIP LOCKED: instances never claim the same run, and never wait for each other.
SELECT run_id FROM runs
WHERE status = 'processing' AND lease_expires_at <= %(now)s
ORDER BY lease_expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED

-- name: run_for_claim
SELECT r.run_id, r.agent, r.status, r.attempt, r.accepted_at, r.attempt_base,
       e.body, e.event_id, e.event_type, e.source, r.lease_owner, r.attempt_started_at,
       e.callback_url
FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = %(run_id)s

-- name: claim_expired
UPDATE runs SET status = 'processing', attempt = %(attempt)s, lease_owner = %(owner)s,
       lease_expires_at = %(lease_until)s, attempt_started_at = %(now)s, updated_at = %(now)s
WHERE run_id = %(run_id)s

-- name: dead_letter_expired
UPDATE runs SET status = 'dead_lettered', lease_owner = NULL, lease_expires_at = NULL,
       updated_at = %(now)s, completed_at = %(now)s, error_code = 'lease_expired',
       error_message = %(message)s
WHERE run_id = %(run_id)s

-- name: claim_waiting
-- One statement claims a whole batch of waiting runs (the hot path).
UPDATE runs SET status = 'processing', attempt = attempt + 1, lease_owner = %(owner)s,
       lease_expires_at = %(lease_until)s, next_attempt_at = NULL,
       started_at = coalesce(started_at, %(now)s), attempt_started_at = %(now)s, updated_at = %(now)s
WHERE run_id IN (
    SELECT run_id FROM runs
    WHERE status IN ('accepted', 'failed_retryable') AND next_attempt_at <= %(now)s
    ORDER BY next_attempt_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING run_id, agent, attempt, attempt_base, accepted_at, event_pk

-- name: events_by_pk
SELECT pk, body, event_id, event_type, source, callback_url FROM events
WHERE pk = ANY(%(pks)s)

-- name: lock_run
-- What serialises the writers of a run's rows: whoever changes a run's state, or
-- its callbacks' readiness, holds its row until commit.
SELECT status, attempt FROM runs WHERE run_id = %(run_id)s FOR UPDATE

-- name: extend_lease
UPDATE runs SET lease_expires_at = %(until)s
WHERE run_id = %(run_id)s AND lease_owner = %(owner)s AND attempt = %(attempt)s
  AND status = 'processing'

-- name: renew_lease
-- One attempt's lease, renewed by its holder whose own deadline passed (a pause, a
-- sleep): only if nobody claimed the run since (a claim moves the attempt on), even
-- past the lease's end. The row it answers says it was renewed.
UPDATE runs SET lease_expires_at = %(until)s
WHERE run_id = %(run_id)s AND lease_owner = %(owner)s AND attempt = %(attempt)s
  AND status = 'processing'
RETURNING run_id

-- name: held_leases
SELECT run_id, attempt FROM runs WHERE status = 'processing' AND lease_owner = %(owner)s

-- name: release_leases
UPDATE runs SET lease_expires_at = %(now)s WHERE lease_owner = %(owner)s AND status = 'processing'

-- name: release_all_leases
UPDATE runs SET lease_expires_at = %(now)s WHERE status = 'processing'

-- name: give_back_attempt
-- A claimed attempt whose agent never started is given back (attempt_started_at NULL
-- tells the next claim there is no lost attempt to record).
UPDATE runs SET attempt = attempt - 1, attempt_started_at = NULL, lease_expires_at = %(now)s,
       started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END
WHERE run_id = %(run_id)s AND lease_owner = %(owner)s AND attempt = %(attempt)s
  AND status = 'processing'

-- name: next_waiting
-- ORDER BY ... LIMIT 1 walks the partial indexes; min() would not use them.
SELECT next_attempt_at AS due FROM runs
WHERE status IN ('accepted', 'failed_retryable')
ORDER BY next_attempt_at LIMIT 1

-- name: next_lease_end
SELECT lease_expires_at AS due FROM runs WHERE status = 'processing'
ORDER BY lease_expires_at LIMIT 1
