-- The SQLite engine's statements for ingest (store/ingest.py): an event, its idempotency claim and its runs.
-- Named statements, loaded by agentbox.store.queries; queries/postgres/ingest.sql holds
-- the same names in PostgreSQL's words.

-- name: count_active
SELECT count(*) FROM runs WHERE status IN ('accepted', 'processing', 'failed_retryable')

-- name: fold_run_counts
-- At open: the runs by state, counted into the writer (SqliteStore.run_counts, version
-- 11), then kept by its connection's triggers below.
SELECT status, count(*) FROM runs GROUP BY status

-- name: fold_run_counts.triggers
-- Each change of a run's state, told to the writer (SqliteStore._counted) as the
-- statement makes it, whichever statement that is (claim, outcome, lease recovery,
-- replay, retention's removal). A run stored is counted by the ingest itself
-- (SqliteDb._store_event: the writer's only INSERT INTO runs), where a trigger cost
-- some 8,000 instructions a row. TEMP: this connection's alone, never stored, so
-- another program that opens the file writes runs without them.
CREATE TEMP TRIGGER IF NOT EXISTS run_counted_update AFTER UPDATE OF status ON main.runs
WHEN OLD.status IS NOT NEW.status
BEGIN SELECT agentbox_run_counted(OLD.status, NEW.status); END;
CREATE TEMP TRIGGER IF NOT EXISTS run_counted_delete AFTER DELETE ON main.runs
BEGIN SELECT agentbox_run_counted(OLD.status, NULL); END;

-- name: runs_of_key
SELECT r.run_id, r.agent, r.status FROM idempotency_keys k
JOIN runs r ON r.event_pk = k.event_pk
WHERE k.key = :key AND k.expires_at > :now ORDER BY r.ordinal

-- name: store_events.event
INSERT INTO events (event_id, idempotency_key, event_type, source, correlation_id,
                    causation_id, hop, callback_url, received_at, body, webhook_id)
VALUES (:event_id, :key, :event_type, :source, :correlation_id, :causation_id, :hop,
        :callback_url, :now, :body, :webhook_id)
RETURNING pk

-- name: store_events.key
-- Claims a key that is free or whose claim expired.
INSERT INTO idempotency_keys (key, event_pk, expires_at) VALUES (:key, :event_pk, :expires_at)
ON CONFLICT (key) DO UPDATE SET event_pk = excluded.event_pk, expires_at = excluded.expires_at
WHERE idempotency_keys.expires_at <= :now
RETURNING key

-- name: store_events.undo
DELETE FROM events WHERE pk = :event_pk

-- name: store_events.run
-- An accepted run (the hot path: the fewest columns).
INSERT INTO runs (run_id, event_pk, ordinal, agent, status, next_attempt_at, accepted_at,
                  updated_at)
VALUES (:run_id, :event_pk, :ordinal, :agent, 'accepted', :now, :now, :now)

-- name: store_events.claimed_run
-- A run claimed as it is accepted (its instance had a slot free): attempt 1, leased.
INSERT INTO runs (run_id, event_pk, ordinal, agent, status, attempt, lease_owner,
                  lease_expires_at, accepted_at, started_at, attempt_started_at, updated_at)
VALUES (:run_id, :event_pk, :ordinal, :agent, 'processing', 1, :owner, :lease_until, :now,
        :now, :now, :now)

-- name: store_events.stopped_run
-- A run recorded dead_lettered and never run (a chain stopped as a loop).
INSERT INTO runs (run_id, event_pk, ordinal, agent, status, accepted_at, updated_at,
                  completed_at, error_code, error_message)
VALUES (:run_id, :event_pk, :ordinal, :agent, 'dead_lettered', :now, :now, :now,
        :error_code, :error_message)

-- name: chain_history
-- Which agent handled which event type on the way to an event: its ancestors,
-- found by following causation ids back from the emitting run's event, within
-- the chain (siblings and other renders that share a correlation id do not count).
WITH RECURSIVE ancestry (pk, causation_id, depth) AS (
    SELECT pk, causation_id, 0 FROM events WHERE pk = :parent
    UNION
    SELECT e.pk, e.causation_id, a.depth + 1 FROM ancestry a
    JOIN events e INDEXED BY events_event_id ON e.event_id = a.causation_id
    WHERE a.depth < 1000 AND (e.correlation_id = :chain OR e.event_id = :chain)
)
SELECT r.agent, e.event_type FROM ancestry a JOIN events e ON e.pk = a.pk
JOIN runs r ON r.event_pk = e.pk
