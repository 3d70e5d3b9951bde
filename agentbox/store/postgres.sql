-- The PostgreSQL engine's statements, by name (loaded by agentbox.store.queries).
-- The same names as sqlite.sql, in PostgreSQL's words: parameters %(name)s (psycopg),
-- row locks where several instances meet (FOR UPDATE SKIP LOCKED claims, FOR UPDATE
-- on a run's row, FOR SHARE on a destination's), and the hot path's writes set-wise
-- over arrays (store_events, finish_runs: one statement for a whole batch).
-- Text is COLLATE "C": run ids sort by time, whatever the server's locale.

-- ===== ingest ==========================================================================

-- name: count_active
SELECT count(*) FROM runs WHERE status IN ('accepted', 'processing', 'failed_retryable')

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
                %(bodies)s::bytea[], %(projects)s::text[])
         WITH ORDINALITY AS i (key, expires_at, event_id, event_type, source,
                               correlation_id, causation_id, hop, callback_url, body,
                               project, n)
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
                        causation_id, hop, callback_url, received_at, body, project)
    SELECT i.pk, i.event_id, i.key, i.event_type, i.source, i.correlation_id,
           i.causation_id, i.hop, i.callback_url, %(now)s, i.body, i.project
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

-- ===== claims and leases ===============================================================

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

-- ===== outcomes ========================================================================

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

-- ===== maintenance: replay, discard, expiry ============================================

-- name: replay
UPDATE runs SET status = 'accepted', next_attempt_at = %(now)s, updated_at = %(now)s,
       completed_at = NULL, error_code = NULL, error_message = NULL, result = NULL,
       replays = replays + 1, attempt_base = attempt
WHERE run_id = %(run_id)s

-- name: undiscard
DELETE FROM discarded_runs WHERE run_id = %(run_id)s

-- name: insert_history
INSERT INTO run_history (run_id, at, status, attempt, note)
VALUES (%(run_id)s, %(at)s, %(status)s, %(attempt)s, %(note)s)

-- name: insert_discard
INSERT INTO discarded_runs (run_id, reason, at) VALUES (%(run_id)s, %(reason)s, %(at)s)
ON CONFLICT (run_id) DO UPDATE SET reason = excluded.reason, at = excluded.at

-- name: prune_keys
DELETE FROM idempotency_keys WHERE key IN (
    SELECT key FROM idempotency_keys WHERE expires_at <= %(now)s LIMIT %(limit)s)

-- ===== the callback outbox =============================================================

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

-- ===== subscriptions ===================================================================

-- name: any_agent_subscriptions
SELECT EXISTS (SELECT 1 FROM agent_subscriptions)

-- name: agent_subscription_changes
SELECT agent, subscribed FROM agent_subscriptions WHERE event_type = %(event_type)s

-- name: set_agent_subscription
INSERT INTO agent_subscriptions (event_type, agent, subscribed, run_id, changed_at)
VALUES (%(event_type)s, %(agent)s, %(subscribed)s, %(run_id)s, %(now)s)
ON CONFLICT (event_type, agent) DO UPDATE SET subscribed = excluded.subscribed,
    run_id = excluded.run_id, changed_at = excluded.changed_at

-- name: agent_subscriptions
SELECT event_type, agent, subscribed, run_id, changed_at FROM agent_subscriptions
ORDER BY agent, event_type

-- name: any_subscriptions
SELECT EXISTS (SELECT 1 FROM subscriptions)

-- name: subscribers_of
SELECT s.id, s.url, s.destination FROM subscription_topics t
JOIN subscriptions s ON s.id = t.subscription_id
WHERE t.topic = %(topic)s AND s.expires_at > %(now)s ORDER BY s.id

-- name: insert_subscription_delivery
-- Ordered behind the pending deliveries of the same run to the same subscription;
-- held while the subscription is not verified or suspended (its destination paused).
INSERT INTO outbox (notification_id, run_id, status, destination, url, body, created_at,
                    next_attempt_at, ready, subscription_id)
VALUES (%(id)s, %(run_id)s, %(status)s, %(destination)s, %(url)s, %(body)s, %(now)s, %(due)s,
        CASE WHEN NOT EXISTS (SELECT 1 FROM outbox
                              WHERE run_id = %(run_id)s AND state = 'pending'
                                AND subscription_id = %(subscription_id)s)
             AND NOT EXISTS (SELECT 1 FROM callback_destinations
                             WHERE destination = %(destination)s AND state = 'paused')
        THEN 1 ELSE 0 END, %(subscription_id)s)
ON CONFLICT (notification_id) DO NOTHING

-- name: insert_subscription
INSERT INTO subscriptions (id, url, destination, topics, secret, secret_hint, state, challenge, ttl,
                           created_at, refreshed_at, expires_at, verify_at, updated_at)
VALUES (%(id)s, %(url)s, %(destination)s, %(topics)s, %(secret)s, %(secret_hint)s, 'pending_verification',
        %(challenge)s, %(ttl)s, %(now)s, %(now)s, %(expires_at)s, %(now)s, %(now)s)

-- name: insert_subscription_topic
INSERT INTO subscription_topics (topic, subscription_id) VALUES (%(topic)s, %(id)s)
ON CONFLICT DO NOTHING

-- name: hold_subscription
-- Nothing goes to a subscription until it is verified: its destination starts paused.
INSERT INTO callback_destinations (destination, state, paused_reason, paused_at, updated_at)
VALUES (%(destination)s, 'paused', %(reason)s, %(now)s, %(now)s)
ON CONFLICT (destination) DO UPDATE SET state = 'paused', paused_reason = excluded.paused_reason,
    paused_at = excluded.paused_at, updated_at = excluded.updated_at

-- name: subscription_row
SELECT s.id, s.url, s.destination, s.topics, s.state, s.challenge, s.ttl, s.created_at,
       s.refreshed_at, s.expires_at, s.verify_at, s.verify_failures, s.verified_at,
       s.last_error, s.updated_at, s.secret_hint, s.secret,
       d.state AS destination_state, d.paused_reason, d.consecutive_failures,
       d.last_error AS delivery_error,
       (SELECT count(*) FROM outbox o
        WHERE o.subscription_id = s.id AND o.state = 'pending') AS pending
FROM subscriptions s LEFT JOIN callback_destinations d ON d.destination = s.destination
WHERE s.id = %(id)s

-- name: list_subscriptions
SELECT s.id, s.url, s.destination, s.topics, s.state, s.challenge, s.ttl, s.created_at,
       s.refreshed_at, s.expires_at, s.verify_at, s.verify_failures, s.verified_at,
       s.last_error, s.updated_at, s.secret_hint,
       d.state AS destination_state, d.paused_reason, d.consecutive_failures,
       d.last_error AS delivery_error,
       (SELECT count(*) FROM outbox o
        WHERE o.subscription_id = s.id AND o.state = 'pending') AS pending
FROM subscriptions s LEFT JOIN callback_destinations d ON d.destination = s.destination
ORDER BY s.created_at, s.id LIMIT %(limit)s

-- name: refresh_subscription
UPDATE subscriptions SET ttl = %(ttl)s, refreshed_at = %(now)s, expires_at = %(expires_at)s,
       updated_at = %(now)s
WHERE id = %(id)s

-- name: reverify_subscription
-- A suspended subscription refreshed is verified again before anything more is sent.
UPDATE subscriptions SET state = 'pending_verification', challenge = %(challenge)s,
       verify_at = %(now)s, verify_failures = 0, updated_at = %(now)s
WHERE id = %(id)s

-- name: delete_subscription
DELETE FROM subscriptions WHERE id = %(id)s

-- name: delete_subscription_topics
DELETE FROM subscription_topics WHERE subscription_id = %(id)s

-- name: drop_subscription_deliveries
-- What was still queued for a subscription that is gone: dead, with the reason.
UPDATE outbox SET state = 'dead', last_error = %(error)s, lease_owner = NULL,
       next_attempt_at = NULL
WHERE subscription_id = %(id)s AND state = 'pending'

-- name: delete_subscription_destination
DELETE FROM callback_destinations WHERE destination = %(destination)s

-- name: due_verifications
SELECT id, url, secret, challenge, verify_failures FROM subscriptions
WHERE state = 'pending_verification' AND verify_at <= %(now)s AND expires_at > %(now)s
ORDER BY verify_at LIMIT %(limit)s

-- name: next_verification
SELECT verify_at FROM subscriptions
WHERE state = 'pending_verification' AND expires_at > %(now)s ORDER BY verify_at LIMIT 1

-- name: take_verification
-- Leases a verification attempt: another instance does not send it meanwhile.
UPDATE subscriptions SET verify_at = %(lease_until)s
WHERE id = %(id)s AND state = 'pending_verification' AND verify_at <= %(now)s

-- name: subscription_verified
UPDATE subscriptions SET state = 'active', verified_at = %(now)s, challenge = NULL,
       verify_at = NULL, verify_failures = 0, last_error = NULL, updated_at = %(now)s
WHERE id = %(id)s AND state = 'pending_verification' AND challenge = %(challenge)s

-- name: verification_failed
UPDATE subscriptions SET verify_failures = verify_failures + 1, last_error = %(error)s,
       verify_at = CASE WHEN verify_failures + 1 >= %(limit)s THEN NULL
                        ELSE %(next_at)s::double precision END,
       state = CASE WHEN verify_failures + 1 >= %(limit)s THEN 'suspended' ELSE state END,
       updated_at = %(now)s
WHERE id = %(id)s AND state = 'pending_verification' AND challenge = %(challenge)s
RETURNING state

-- name: expired_subscriptions
SELECT id, destination FROM subscriptions
WHERE expires_at <= %(before)s ORDER BY expires_at LIMIT %(limit)s

-- ===== reads and views =================================================================

-- name: get_run
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.project
FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = %(run_id)s

-- name: list_runs
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.project
FROM runs r JOIN events e ON e.pk = r.event_pk ORDER BY r.run_id DESC LIMIT %(limit)s

-- name: list_runs_by_status
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.project
FROM runs r JOIN events e ON e.pk = r.event_pk
WHERE r.status = %(status)s ORDER BY r.run_id DESC LIMIT %(limit)s

-- name: search_runs
-- {where}: the search_runs.* conditions asked for, joined by AND (or TRUE).
SELECT r.*, e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
       e.idempotency_key, e.project
FROM runs r JOIN events e ON e.pk = r.event_pk
WHERE {where} ORDER BY r.run_id DESC LIMIT %(limit)s

-- name: search_runs.status
r.status = %(status)s
-- name: search_runs.event_type
e.event_type = %(event_type)s
-- name: search_runs.agent
r.agent = %(agent)s
-- name: search_runs.project
e.project = %(project)s
-- name: search_runs.chain
(e.correlation_id = %(chain)s OR (e.event_id = %(chain)s AND e.correlation_id IS NULL))
-- name: search_runs.text
(r.run_id = %(text)s OR e.event_id = %(text)s OR e.correlation_id = %(text)s OR e.project = %(text)s)
-- name: search_runs.since
r.accepted_at >= %(since)s
-- name: search_runs.until
r.accepted_at < %(until)s
-- name: search_runs.before
r.run_id < %(before)s
-- name: search_runs.not_discarded
NOT EXISTS (SELECT 1 FROM discarded_runs d WHERE d.run_id = r.run_id)

-- name: attempts
SELECT attempt, owner, started_at, finished_at, outcome, error_code, error_message
FROM attempts WHERE run_id = %(run_id)s ORDER BY attempt

-- name: running_attempt
SELECT attempt, lease_owner AS owner, attempt_started_at AS started_at FROM runs
WHERE run_id = %(run_id)s AND status = 'processing'

-- name: run_accepted_at
SELECT accepted_at FROM runs WHERE run_id = %(run_id)s

-- name: history
SELECT at, status, attempt, note FROM run_history WHERE run_id = %(run_id)s ORDER BY at

-- name: event_of
SELECT e.body, e.body_removed_at, e.event_id, e.event_type, e.source, e.received_at
FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = %(run_id)s

-- name: discarded
SELECT reason, at FROM discarded_runs WHERE run_id = %(run_id)s

-- name: status_counts
-- Runs by state, counted from the status index alone (a million runs: 70 ms here,
-- against 490 ms when every row was read for its accepted_at), and the oldest
-- waiting run's acceptance (its age), the first entry of the waiting runs' index.
SELECT status, count(*) AS runs,
       (SELECT min(accepted_at) FROM runs
        WHERE status IN ('accepted', 'failed_retryable')) AS oldest_waiting
FROM runs GROUP BY status

-- name: finished_counts
-- floor(): a cast to an integer would round here.
SELECT floor((completed_at - %(since)s) / %(width)s)::bigint AS slice, count(*) AS runs
FROM runs WHERE completed_at >= %(since)s GROUP BY 1

-- name: run_notifications
SELECT * FROM outbox WHERE run_id = %(run_id)s ORDER BY pk

-- name: list_notifications
SELECT * FROM outbox ORDER BY pk DESC LIMIT %(limit)s

-- name: list_notifications_by_state
SELECT * FROM outbox WHERE state = %(state)s ORDER BY pk DESC LIMIT %(limit)s

-- name: destinations
SELECT d.*, (SELECT count(*) FROM outbox o
             WHERE o.destination = d.destination AND o.state = 'pending') AS pending
FROM callback_destinations d ORDER BY d.destination

-- name: projects
-- The latest run of each project (per agent when %(agent)s is given), newest first:
-- the runs still stored, and those retention removed (project_exports).
SELECT run_id, project, agent, status, accepted_at, completed_at, result, archived FROM (
    SELECT x.*, row_number() OVER (PARTITION BY x.project
                                   ORDER BY x.accepted_at DESC, x.run_id DESC) AS n
    FROM (
        SELECT r.run_id, e.project, r.agent, r.status, r.accepted_at, r.completed_at,
               r.result, false AS archived
        FROM events e JOIN runs r ON r.event_pk = e.pk
        WHERE e.project IS NOT NULL AND (%(agent)s::text IS NULL OR r.agent = %(agent)s)
        UNION ALL
        SELECT run_id, project, agent, status, accepted_at, completed_at, result,
               true AS archived
        FROM project_exports WHERE %(agent)s::text IS NULL OR agent = %(agent)s
    ) x
) latest WHERE n = 1
ORDER BY accepted_at DESC, run_id DESC LIMIT %(limit)s

-- name: project_exports
SELECT run_id, project, agent, status, accepted_at, completed_at, result, archived FROM (
    SELECT r.run_id, e.project, r.agent, r.status, r.accepted_at, r.completed_at, r.result,
           false AS archived
    FROM events e JOIN runs r ON r.event_pk = e.pk
    WHERE e.project = %(project)s
    UNION ALL
    SELECT run_id, project, agent, status, accepted_at, completed_at, result, true AS archived
    FROM project_exports WHERE project = %(project)s
) x
WHERE (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(before_run_id)s::text IS NULL OR (accepted_at, run_id) < (
       SELECT b.accepted_at, b.run_id FROM runs b WHERE b.run_id = %(before_run_id)s
       UNION ALL
       SELECT a.accepted_at, a.run_id FROM project_exports a
       WHERE a.run_id = %(before_run_id)s
       LIMIT 1))
ORDER BY accepted_at DESC, run_id DESC LIMIT %(limit)s

-- name: archived_export
-- A run retention removed, as the project pages keep it (no row: not archived).
SELECT run_id, project, agent, status, accepted_at, completed_at, result, true AS archived
FROM project_exports WHERE run_id = %(run_id)s

-- ===== retention (store/retention.py) =================================================
-- A finished run may go once it finished before %(before)s (the retention cutoff):
-- succeeded or failed_permanent, or a dead letter someone discarded before then
-- too (one nobody decided on stays); not while a callback of it is pending, nor
-- while its event's idempotency claim holds (a duplicate must still find it).
-- Locks are taken in the order ingest, claims and deliveries take them, and
-- never waited for: the runs (FOR UPDATE SKIP LOCKED: one being replayed or
-- delivered for is left to the next pass), then their children, then the
-- events' claims (SKIP LOCKED: one being claimed again is the new event's), then
-- the events, which nobody else locks once their runs are gone.

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
WHERE r.run_id = ANY(%(ids)s)
  AND r.completed_at IS NOT NULL AND r.completed_at < %(before)s
  AND (r.status IN ('succeeded', 'failed_permanent')
       OR (r.status = 'dead_lettered' AND EXISTS (
           SELECT 1 FROM discarded_runs d
           WHERE d.run_id = r.run_id AND d.at < %(before)s)))
  AND NOT EXISTS (SELECT 1 FROM outbox o
                  WHERE o.run_id = r.run_id AND o.state = 'pending')
  AND NOT EXISTS (SELECT 1 FROM events k_e JOIN idempotency_keys k
                  ON k.key = k_e.idempotency_key AND k.event_pk = k_e.pk
                  WHERE k_e.pk = r.event_pk AND k.expires_at > %(now)s)
ORDER BY r.run_id FOR UPDATE OF r SKIP LOCKED

-- name: prune_runs.archive
-- What the project pages read of a run, kept after it goes.
INSERT INTO project_exports (run_id, project, agent, status, accepted_at, completed_at, result)
SELECT r.run_id, e.project, r.agent, r.status, r.accepted_at, r.completed_at, r.result
FROM runs r JOIN events e ON e.pk = r.event_pk
WHERE r.run_id = ANY(%(ids)s) AND e.project IS NOT NULL
ON CONFLICT (run_id) DO NOTHING

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
-- A body is blanked once every run of its event may go by %(before)s (the body
-- cutoff); the event's metadata stays, and says when.
UPDATE events e SET body = ''::bytea, body_removed_at = %(now)s
WHERE e.pk = ANY(%(pks)s) AND e.body_removed_at IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM runs r WHERE r.event_pk = e.pk AND NOT (
          r.completed_at IS NOT NULL AND r.completed_at < %(before)s
          AND (r.status IN ('succeeded', 'failed_permanent')
               OR (r.status = 'dead_lettered' AND EXISTS (
                   SELECT 1 FROM discarded_runs d
                   WHERE d.run_id = r.run_id AND d.at < %(before)s)))))

-- name: prune_preview
-- What a prune would remove now, per table (agentbox prune --dry-run).
WITH due AS (
    SELECT r.run_id, r.event_pk, e.project FROM runs r
    JOIN events e ON e.pk = r.event_pk
    WHERE r.completed_at IS NOT NULL AND r.completed_at < %(before)s
      AND (r.status IN ('succeeded', 'failed_permanent')
       OR (r.status = 'dead_lettered' AND EXISTS (
           SELECT 1 FROM discarded_runs d
           WHERE d.run_id = r.run_id AND d.at < %(before)s)))
  AND NOT EXISTS (SELECT 1 FROM outbox o
                  WHERE o.run_id = r.run_id AND o.state = 'pending')
  AND NOT EXISTS (SELECT 1 FROM events k_e JOIN idempotency_keys k
                  ON k.key = k_e.idempotency_key AND k.event_pk = k_e.pk
                  WHERE k_e.pk = r.event_pk AND k.expires_at > %(now)s)
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
       (SELECT count(*) FROM due WHERE project IS NOT NULL) AS project_exports,
       (SELECT count(*) FROM events e
        WHERE e.body_removed_at IS NULL AND e.received_at < %(bodies_before)s
          AND e.pk NOT IN (SELECT pk FROM gone)
          AND NOT EXISTS (
      SELECT 1 FROM runs r WHERE r.event_pk = e.pk AND NOT (
          r.completed_at IS NOT NULL AND r.completed_at < %(bodies_before)s
          AND (r.status IN ('succeeded', 'failed_permanent')
               OR (r.status = 'dead_lettered' AND EXISTS (
                   SELECT 1 FROM discarded_runs d
                   WHERE d.run_id = r.run_id AND d.at < %(bodies_before)s)))))) AS bodies

-- name: reclaim_space
-- PostgreSQL's autovacuum makes the space of removed rows reusable by itself.
SELECT 0

-- name: free_pages
SELECT 0

-- ===== integrity checks (agentbox verify): each returns the offending rows ============

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
