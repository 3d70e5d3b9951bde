-- The SQLite engine's statements for retention (store/retention.py).
-- Named statements, loaded by agentbox.store.queries; queries/postgres/retention.sql holds
-- the same names in PostgreSQL's words.
--
-- What may be pruned is written once, in the parts below: a run may go (may_go)
-- once nothing holds it (unheld), an event's body once all its runs may go
-- (body_may_go). Each step names the runs by :ids and their events by :pks (JSON
-- arrays).

-- part: may_go(cutoff)
-- A finished run may go once it finished before the cutoff (:before, the retention
-- cutoff): succeeded or failed_permanent, or a dead letter someone discarded before
-- the cutoff too (one nobody decided on stays). `r` is the run.
r.completed_at IS NOT NULL AND r.completed_at < {cutoff}
AND (r.status IN ('succeeded', 'failed_permanent')
     OR (r.status = 'dead_lettered' AND EXISTS (
         SELECT 1 FROM discarded_runs d WHERE d.run_id = r.run_id AND d.at < {cutoff})))

-- part: unheld()
-- Not while a callback of the run is pending, nor while its event's idempotency
-- claim holds (a duplicate must still find it).
NOT EXISTS (SELECT 1 FROM outbox o INDEXED BY outbox_pending_run
            WHERE o.run_id = r.run_id AND o.state = 'pending')
AND NOT EXISTS (SELECT 1 FROM events k_e JOIN idempotency_keys k
                ON k.key = k_e.idempotency_key AND k.event_pk = k_e.pk
                WHERE k_e.pk = r.event_pk AND k.expires_at > :now)

-- part: body_may_go(event, cutoff)
-- An event's body may go once every run of it may go by the cutoff (:before, the
-- body cutoff); `event` is its pk.
NOT EXISTS (SELECT 1 FROM runs r INDEXED BY runs_event
            WHERE r.event_pk = {event} AND NOT {may_go({cutoff})})

-- name: prune_scan
-- The next finished runs from the cursor (:after_at, :after_id), oldest first, at
-- most :scan of them, due or not: the cursor moves past the ones that must stay,
-- so no pass walks over them twice.
SELECT run_id, completed_at FROM runs INDEXED BY runs_completed
WHERE completed_at IS NOT NULL AND completed_at < :before
  AND (completed_at > :after_at OR (completed_at = :after_at AND run_id > :after_id))
ORDER BY completed_at, run_id LIMIT :scan

-- name: prune_runs.due
-- CROSS JOIN: the runs named, one primary-key step each (not every run of a status).
SELECT r.run_id, r.event_pk FROM json_each(:ids) j CROSS JOIN runs r ON r.run_id = j.value
WHERE {may_go(:before)} AND {unheld()}

-- name: prune_runs.attempts
DELETE FROM attempts WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: prune_runs.run_history
DELETE FROM run_history WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: prune_runs.outbox
DELETE FROM outbox WHERE run_id IN (SELECT value FROM json_each(:ids)) AND state <> 'pending'

-- name: prune_runs.discarded_runs
DELETE FROM discarded_runs WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: prune_runs.runs
DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: prune_runs.idempotency_keys
-- An event's own claim, expired, once its last run is gone (a claim taken over by a
-- later event is that one's).
DELETE FROM idempotency_keys WHERE key IN (
    SELECT k.key FROM events e JOIN idempotency_keys k
        ON k.key = e.idempotency_key AND k.event_pk = e.pk
    WHERE e.pk IN (SELECT value FROM json_each(:pks)) AND k.expires_at <= :now
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_pk = e.pk))

-- name: prune_runs.events
-- An event goes with its last run.
DELETE FROM events WHERE pk IN (SELECT value FROM json_each(:pks))
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_pk = events.pk)

-- name: body_scan
-- The next events still holding a body, received before :before, from the cursor.
SELECT pk, received_at FROM events INDEXED BY events_with_body
WHERE body_removed_at IS NULL AND received_at < :before
  AND (received_at > :after_at OR (received_at = :after_at AND pk > :after_pk))
ORDER BY received_at, pk LIMIT :scan

-- name: remove_bodies.lock
-- SQLite's writer is alone: nothing to lock, nothing skipped.
SELECT run_id, event_pk FROM runs WHERE event_pk IN (SELECT value FROM json_each(:pks))

-- name: remove_bodies.count
SELECT event_pk, count(*) FROM runs WHERE event_pk IN (SELECT value FROM json_each(:pks))
GROUP BY event_pk

-- name: remove_bodies.update
-- The event's metadata stays, and says when its body was blanked.
UPDATE events SET body = X'', body_removed_at = :now
WHERE pk IN (SELECT value FROM json_each(:pks)) AND body_removed_at IS NULL
  AND {body_may_go(events.pk, :before)}

-- name: prune_preview
-- What a prune would remove now, per table (agentbox prune --dry-run). kept: what
-- each app's Schema.before_prune would keep of the runs `due`, each
-- `, (its count) AS <kept_in>`, or nothing.
WITH due AS (
    SELECT r.run_id, r.event_pk FROM runs r INDEXED BY runs_completed
    WHERE {may_go(:before)} AND {unheld()}
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
        WHERE e.pk IN (SELECT pk FROM gone) AND k.expires_at <= :now) AS idempotency_keys,
       (SELECT count(*) FROM events e INDEXED BY events_with_body
        WHERE e.body_removed_at IS NULL AND e.received_at < :bodies_before
          AND e.pk NOT IN (SELECT pk FROM gone)
          AND {body_may_go(e.pk, :bodies_before)}) AS bodies{kept}

-- name: reclaim_space
-- One free page back to the file system (auto_vacuum = INCREMENTAL): the driver
-- steps the statement once, and each step frees one page.
PRAGMA incremental_vacuum

-- name: free_pages
PRAGMA freelist_count
