-- The PostgreSQL engine's statements for retention (store/retention.py).
-- Named statements, loaded by agentbox.store.queries; queries/sqlite/retention.sql holds
-- the same names in SQLite's words.
--
-- What may be pruned is written once, in the parts below: a run may go (may_go)
-- once nothing holds it (unheld), an event's body once all its runs may go
-- (body_may_go).
-- Locks are taken in the order ingest, claims and deliveries take them, and
-- never waited for: the runs (FOR UPDATE SKIP LOCKED: one being replayed or
-- delivered for is left to the next pass), then their children, then the
-- events' claims (SKIP LOCKED: one being claimed again is the new event's), then
-- the events, which nobody else locks once their runs are gone.

-- part: may_go(cutoff)
-- A finished run may go once it finished before the cutoff (%(before)s, the
-- retention cutoff): succeeded or failed_permanent, or a dead letter someone
-- discarded before the cutoff too (one nobody decided on stays). `r` is the run.
r.completed_at IS NOT NULL AND r.completed_at < {cutoff}
AND (r.status IN ('succeeded', 'failed_permanent')
     OR (r.status = 'dead_lettered' AND EXISTS (
         SELECT 1 FROM discarded_runs d WHERE d.run_id = r.run_id AND d.at < {cutoff})))

-- part: unheld()
-- Not while a callback of the run is pending, nor while its event's idempotency
-- claim holds (a duplicate must still find it).
NOT EXISTS (SELECT 1 FROM outbox o WHERE o.run_id = r.run_id AND o.state = 'pending')
AND NOT EXISTS (SELECT 1 FROM events k_e JOIN idempotency_keys k
                ON k.key = k_e.idempotency_key AND k.event_pk = k_e.pk
                WHERE k_e.pk = r.event_pk AND k.expires_at > %(now)s)

-- part: body_may_go(event, cutoff)
-- An event's body may go once every run of it may go by the cutoff (%(before)s,
-- the body cutoff); `event` is its pk.
NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_pk = {event} AND NOT {may_go({cutoff})})

-- name: prune_scan
-- The next finished runs from the cursor, oldest first, at most %(scan)s of them, due
-- or not: the cursor moves past the ones that must stay, so no pass walks over them
-- twice. runs_completed gives completed_at's order; run_id only breaks its ties.
SELECT run_id, completed_at FROM runs
WHERE completed_at IS NOT NULL AND completed_at < %(before)s
  AND completed_at >= %(after_at)s
  AND (completed_at > %(after_at)s OR run_id > %(after_id)s)
ORDER BY completed_at, run_id LIMIT %(scan)s

-- name: prune_runs.due
SELECT r.run_id, r.event_pk FROM runs r
WHERE r.run_id = ANY(%(ids)s) AND {may_go(%(before)s)} AND {unheld()}
ORDER BY r.run_id FOR UPDATE OF r SKIP LOCKED

-- name: prune_runs.attempts
DELETE FROM attempts WHERE run_id = ANY(%(ids)s)

-- name: prune_runs.run_history
DELETE FROM run_history WHERE run_id = ANY(%(ids)s)

-- name: prune_runs.outbox
DELETE FROM outbox WHERE run_id = ANY(%(ids)s) AND state <> 'pending'

-- name: prune_runs.discarded_runs
DELETE FROM discarded_runs WHERE run_id = ANY(%(ids)s)

-- name: prune_runs.runs
DELETE FROM runs WHERE run_id = ANY(%(ids)s)

-- name: prune_runs.idempotency_keys
-- An event's own claim, expired, once its last run is gone (a claim being taken
-- over by a later event right now is locked: skipped, it is that event's).
DELETE FROM idempotency_keys WHERE key IN (
    SELECT k.key FROM events e JOIN idempotency_keys k
        ON k.key = e.idempotency_key AND k.event_pk = e.pk
    WHERE e.pk = ANY(%(pks)s) AND k.expires_at <= %(now)s
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_pk = e.pk)
    ORDER BY k.key FOR UPDATE OF k SKIP LOCKED)

-- name: prune_runs.events
-- An event goes with its last run.
DELETE FROM events e WHERE e.pk = ANY(%(pks)s)
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_pk = e.pk)

-- name: body_scan
-- The next events still holding a body, received before %(before)s, from the cursor.
SELECT pk, received_at FROM events
WHERE body_removed_at IS NULL AND received_at < %(before)s
  AND (received_at, pk) > (%(after_at)s, %(after_pk)s)
ORDER BY received_at, pk LIMIT %(scan)s

-- name: remove_bodies.lock
-- The events' runs, shared, never waited for: a run another transaction holds (a
-- replay, a delivery, a claim) is skipped, and its event left to the next pass.
-- Held, a replay (which locks its run FOR UPDATE) waits for this, then finds the
-- body gone; a replay that came first is seen below.
SELECT run_id, event_pk FROM runs WHERE event_pk = ANY(%(pks)s)
ORDER BY run_id FOR SHARE SKIP LOCKED

-- name: remove_bodies.count
SELECT event_pk, count(*) FROM runs WHERE event_pk = ANY(%(pks)s) GROUP BY event_pk

-- name: remove_bodies.update
-- The event's metadata stays, and says when its body was blanked.
UPDATE events e SET body = ''::bytea, body_removed_at = %(now)s
WHERE e.pk = ANY(%(pks)s) AND e.body_removed_at IS NULL
  AND {body_may_go(e.pk, %(before)s)}

-- name: prune_preview
-- What a prune would remove now, per table (agentbox prune --dry-run). kept: what
-- each app's Schema.before_prune would keep of the runs `due`, each
-- `, (its count) AS <kept_in>`, or nothing.
WITH due AS (
    SELECT r.run_id, r.event_pk FROM runs r
    WHERE {may_go(%(before)s)} AND {unheld()}
), gone AS (
    SELECT DISTINCT event_pk AS pk FROM due
    WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_pk = due.event_pk
                      AND r.run_id NOT IN (SELECT run_id FROM due))
)
SELECT (SELECT count(*) FROM due) AS runs,
       (SELECT count(*) FROM attempts WHERE run_id IN (SELECT run_id FROM due)) AS attempts,
       (SELECT count(*) FROM run_history
        WHERE run_id IN (SELECT run_id FROM due)) AS run_history,
       (SELECT count(*) FROM outbox
        WHERE run_id IN (SELECT run_id FROM due) AND state <> 'pending') AS outbox,
       (SELECT count(*) FROM discarded_runs
        WHERE run_id IN (SELECT run_id FROM due)) AS discarded_runs,
       (SELECT count(*) FROM gone) AS events,
       (SELECT count(*) FROM events e JOIN idempotency_keys k
            ON k.key = e.idempotency_key AND k.event_pk = e.pk
        WHERE e.pk IN (SELECT pk FROM gone) AND k.expires_at <= %(now)s) AS idempotency_keys,
       (SELECT count(*) FROM events e
        WHERE e.body_removed_at IS NULL AND e.received_at < %(bodies_before)s
          AND e.pk NOT IN (SELECT pk FROM gone)
          AND {body_may_go(e.pk, %(bodies_before)s)}) AS bodies{kept}

-- name: reclaim_space
-- PostgreSQL's autovacuum makes the space of removed rows reusable by itself.
SELECT 0

-- name: free_pages
SELECT 0
