-- The PostgreSQL engine's statements for the callback outbox (store/outbox.py).
-- Named statements, loaded by agentbox.store.queries; queries/sqlite/outbox.sql holds
-- the same names in SQLite's words.

-- name: lock_destination
-- A callback queued while its destination is being paused or resumed waits for that.
SELECT state FROM callback_destinations WHERE destination = %(destination)s FOR SHARE

-- name: insert_notification
INSERT INTO outbox (notification_id, run_id, status, destination, url, body, created_at,
                    next_attempt_at, ready)
VALUES (%(id)s, %(run_id)s, %(status)s, %(destination)s, %(url)s, %(body)s, %(now)s, %(due)s,
        CASE WHEN NOT EXISTS (SELECT 1 FROM outbox
                              WHERE run_id = %(run_id)s AND state = 'pending'
                                AND subscription_id IS NULL)
             AND NOT EXISTS (SELECT 1 FROM callback_destinations
                             WHERE destination = %(destination)s AND state = 'paused')
        THEN 1 ELSE 0 END)
ON CONFLICT (notification_id) DO NOTHING

-- name: claim_notifications
UPDATE outbox SET lease_owner = %(owner)s, next_attempt_at = %(lease_until)s
WHERE pk IN (
    SELECT pk FROM outbox
    WHERE state = 'pending' AND ready = 1 AND next_attempt_at <= %(now)s
    ORDER BY next_attempt_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING pk, notification_id, run_id, destination, url, body, attempts, next_attempt_at,
          subscription_id

-- name: next_notification
-- A leased one counts too: its lease's end is when it may be sent again.
SELECT next_attempt_at FROM outbox
WHERE state = 'pending' AND ready = 1 ORDER BY next_attempt_at LIMIT 1

-- name: record_delivery
-- The lease is the owner and the lease's end: a result reported after the lease
-- ran out (and the row went out again) is dropped.
UPDATE outbox SET state = %(state)s, attempts = attempts + 1, last_attempt_at = %(now)s,
       delivered_at = %(delivered_at)s, next_attempt_at = %(next_attempt_at)s,
       last_error = coalesce(%(error)s, last_error), last_status_code = %(status_code)s,
       lease_owner = NULL
WHERE pk = %(pk)s AND lease_owner = %(owner)s AND next_attempt_at = %(lease_until)s
  AND state = 'pending'

-- name: ready_next_of_run
-- Once a notification is no longer pending, the next one of its run may go (a
-- subscription's deliveries are ordered among themselves, apart from callbacks).
UPDATE outbox SET ready = CASE WHEN EXISTS (
    SELECT 1 FROM callback_destinations WHERE destination = outbox.destination
    AND state = 'paused') THEN 0 ELSE 1 END
WHERE pk = (SELECT pk FROM outbox
            WHERE run_id = %(run_id)s AND state = 'pending'
              AND subscription_id IS NOT DISTINCT FROM %(subscription_id)s::text
            ORDER BY pk LIMIT 1)

-- name: destination_state
SELECT state, consecutive_failures FROM callback_destinations WHERE destination = %(destination)s

-- name: count_destination_attempt
INSERT INTO callback_destinations (destination, consecutive_failures, last_error, updated_at)
VALUES (%(destination)s, %(failures)s, %(error)s, %(now)s)
ON CONFLICT (destination) DO UPDATE SET
    consecutive_failures = CASE WHEN %(failures)s::bigint > 0
                           THEN callback_destinations.consecutive_failures + 1 ELSE 0 END,
    last_error = coalesce(%(error)s, callback_destinations.last_error), updated_at = %(now)s
RETURNING state, consecutive_failures

-- name: pause_destination
UPDATE callback_destinations SET state = 'paused', paused_reason = %(reason)s, paused_at = %(now)s,
       updated_at = %(now)s
WHERE destination = %(destination)s AND state = 'active'

-- name: hold_destination
UPDATE outbox SET ready = 0
WHERE destination = %(destination)s AND state = 'pending' AND ready = 1

-- name: resume_destination
UPDATE callback_destinations SET state = 'active', consecutive_failures = 0,
       paused_reason = NULL, paused_at = NULL, updated_at = %(now)s
WHERE destination = %(destination)s

-- name: release_destination
-- Resumed: the earliest pending notification of each run goes at once (a retry
-- that waited out the pause does not wait longer); leased ones keep their lease.
UPDATE outbox SET ready = 1,
       next_attempt_at = CASE WHEN lease_owner IS NULL AND next_attempt_at > %(now)s THEN %(now)s
                              ELSE next_attempt_at END
WHERE destination = %(destination)s AND state = 'pending'
  AND NOT EXISTS (SELECT 1 FROM outbox p
                  WHERE p.run_id = outbox.run_id AND p.state = 'pending' AND p.pk < outbox.pk
                    AND p.subscription_id IS NOT DISTINCT FROM outbox.subscription_id)

-- name: release_notifications
UPDATE outbox SET next_attempt_at = %(now)s, lease_owner = NULL
WHERE state = 'pending' AND lease_owner IS NOT NULL AND (lease_owner = %(owner)s OR %(owner)s::text = '*')
