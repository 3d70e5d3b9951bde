-- The PostgreSQL engine's statements for ingest (store/ingest.py): an event, its idempotency claim and its runs.
-- Named statements, loaded by agentbox.store.queries; queries/sqlite/ingest.sql holds
-- the same names in SQLite's words.

-- name: count_active
SELECT count(*) FROM runs WHERE status IN ('accepted', 'processing', 'failed_retryable')

-- name: fold_run_counts
-- At start-up (under the migrations' lock): the kept counts of writers that are gone
-- (backends no longer connected) are added to row 0 and removed, so that a state's
-- rows are those of the writers connected now, and one (version 10's run_counts).
WITH gone AS (
    DELETE FROM run_counts c
    WHERE c.writer <> 0
      AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = c.writer)
    RETURNING c.status, c.runs)
INSERT INTO run_counts AS c (status, writer, runs)
SELECT status, 0, sum(runs) FROM gone GROUP BY status
ON CONFLICT (status, writer) DO UPDATE SET runs = c.runs + excluded.runs

-- name: runs_of_key
SELECT k.key, r.run_id, r.agent, r.status FROM idempotency_keys k
JOIN runs r ON r.event_pk = k.event_pk
WHERE k.key = ANY(%(keys)s) AND k.expires_at > %(now)s ORDER BY k.key, r.ordinal

-- name: store_events
-- A whole batch's events in one statement: each takes an event id, then claims its
-- key (in the order given, sorted: concurrent writers lock keys in one order; a key
-- held by another writer's transaction waits for its commit and then is not
-- claimed, a duplicate); the claimed ones get their event and runs: accepted;
-- processing, attempt 1, leased (claimed as accepted); or dead_lettered (a chain
-- stopped as a loop). Foreign keys are checked at the end of the statement, when
-- the events are in.
WITH input AS MATERIALIZED (
    SELECT i.*, nextval('events_pk_seq') AS pk
    FROM unnest(%(keys)s::text[], %(expires)s::float8[], %(event_ids)s::text[],
                %(types)s::text[], %(sources)s::text[], %(correlations)s::text[],
                %(causations)s::text[], %(hops)s::bigint[], %(callbacks)s::text[],
                %(bodies)s::bytea[], %(webhook_ids)s::text[])
         WITH ORDINALITY AS i (key, expires_at, event_id, event_type, source,
                               correlation_id, causation_id, hop, callback_url, body,
                               webhook_id, n)
),
claimed AS (
    INSERT INTO idempotency_keys AS k (key, event_pk, expires_at)
    SELECT key, pk, expires_at FROM input ORDER BY n
    ON CONFLICT (key) DO UPDATE SET event_pk = excluded.event_pk,
                                    expires_at = excluded.expires_at
    WHERE k.expires_at <= %(now)s
    RETURNING key, event_pk
),
new_events AS (
    INSERT INTO events (pk, event_id, idempotency_key, event_type, source, correlation_id,
                        causation_id, hop, callback_url, received_at, body, webhook_id)
    SELECT i.pk, i.event_id, i.key, i.event_type, i.source, i.correlation_id,
           i.causation_id, i.hop, i.callback_url, %(now)s, i.body, i.webhook_id
    FROM input i JOIN claimed c ON c.event_pk = i.pk
),
new_runs AS (
    INSERT INTO runs (run_id, event_pk, ordinal, agent, status, attempt, lease_owner,
                      lease_expires_at, next_attempt_at, accepted_at, started_at,
                      attempt_started_at, updated_at, completed_at, error_code,
                      error_message)
    SELECT r.run_id, c.event_pk, r.ordinal, r.agent, r.status,
           CASE WHEN r.status = 'processing' THEN 1 ELSE 0 END, r.owner, r.lease_until,
           CASE WHEN r.status = 'accepted' THEN %(now)s END, %(now)s,
           CASE WHEN r.status = 'processing' THEN %(now)s END,
           CASE WHEN r.status = 'processing' THEN %(now)s END, %(now)s,
           CASE WHEN r.status = 'dead_lettered' THEN %(now)s END, r.error_code,
           r.error_message
    FROM unnest(%(run_keys)s::text[], %(run_ids)s::text[], %(ordinals)s::bigint[],
                %(agents)s::text[], %(statuses)s::text[], %(owners)s::text[],
                %(lease_untils)s::float8[], %(error_codes)s::text[],
                %(error_messages)s::text[])
         AS r (key, run_id, ordinal, agent, status, owner, lease_until, error_code,
               error_message)
    JOIN claimed c ON c.key = r.key
)
SELECT key FROM claimed

-- name: chain_history
-- Which agent handled which event type on the way to an event: its ancestors,
-- found by following causation ids back from the emitting run's event, within
-- the chain (siblings and other renders that share a correlation id do not count).
WITH RECURSIVE ancestry (pk, causation_id, depth) AS (
    SELECT pk, causation_id, 0 FROM events WHERE pk = %(parent)s
    UNION
    SELECT e.pk, e.causation_id, a.depth + 1 FROM ancestry a
    JOIN events e ON e.event_id = a.causation_id
    WHERE a.depth < 1000 AND (e.correlation_id = %(chain)s OR e.event_id = %(chain)s)
)
SELECT r.agent, e.event_type FROM ancestry a JOIN events e ON e.pk = a.pk
JOIN runs r ON r.event_pk = e.pk
