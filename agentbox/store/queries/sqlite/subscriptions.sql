-- The SQLite engine's statements for subscriptions (store/subscriptions.py).
-- Named statements, loaded by agentbox.store.queries; queries/postgres/subscriptions.sql holds
-- the same names in PostgreSQL's words.

-- name: any_agent_subscriptions
SELECT EXISTS (SELECT 1 FROM agent_subscriptions)

-- name: agent_subscription_changes
SELECT agent, subscribed FROM agent_subscriptions WHERE event_type = :event_type

-- name: set_agent_subscription
INSERT INTO agent_subscriptions (event_type, agent, subscribed, run_id, changed_at)
VALUES (:event_type, :agent, :subscribed, :run_id, :now)
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
WHERE t.topic = :topic AND s.expires_at > :now ORDER BY s.id

-- name: lock_destinations
-- SQLite's writer is alone: reading the rows is all the lock there is to take.
SELECT state FROM callback_destinations
WHERE destination IN (SELECT value FROM json_each(:destinations))

-- name: insert_subscription_delivery
-- Ordered behind the pending deliveries of the same run to the same subscription;
-- held while the subscription is not verified or suspended (its destination paused).
INSERT INTO outbox (notification_id, run_id, status, destination, url, body, created_at,
                    next_attempt_at, ready, subscription_id)
VALUES (:id, :run_id, :status, :destination, :url, :body, :now, :due,
        CASE WHEN NOT EXISTS (SELECT 1 FROM outbox INDEXED BY outbox_pending_run
                              WHERE run_id = :run_id AND state = 'pending'
                                AND subscription_id = :subscription_id)
             AND NOT EXISTS (SELECT 1 FROM callback_destinations
                             WHERE destination = :destination AND state = 'paused')
        THEN 1 ELSE 0 END, :subscription_id)
ON CONFLICT (notification_id) DO NOTHING

-- name: lock_subscriptions
-- SQLite's writer is alone: nobody else counts meanwhile.
SELECT 1

-- name: count_subscriptions
-- The subscriptions that count against the limit: those not expired.
SELECT count(*) FROM subscriptions WHERE expires_at > :now

-- name: insert_subscription
INSERT INTO subscriptions (id, url, destination, topics, secret, secret_hint, state, challenge, ttl,
                           created_at, refreshed_at, expires_at, verify_at, updated_at)
VALUES (:id, :url, :destination, :topics, :secret, :secret_hint, 'pending_verification', :challenge, :ttl,
        :now, :now, :expires_at, :now, :now)

-- name: insert_subscription_topic
INSERT INTO subscription_topics (topic, subscription_id) VALUES (:topic, :id)
ON CONFLICT DO NOTHING

-- name: hold_subscription
-- Nothing goes to a subscription until it is verified: its destination starts paused.
INSERT INTO callback_destinations (destination, state, paused_reason, paused_at, updated_at)
VALUES (:destination, 'paused', :reason, :now, :now)
ON CONFLICT (destination) DO UPDATE SET state = 'paused', paused_reason = excluded.paused_reason,
    paused_at = excluded.paused_at, updated_at = excluded.updated_at

-- name: subscription_row
SELECT s.id, s.url, s.destination, s.topics, s.state, s.challenge, s.ttl, s.created_at,
       s.refreshed_at, s.expires_at, s.verify_at, s.verify_failures, s.verified_at,
       s.last_error, s.updated_at, s.secret_hint, s.secret,
       d.state AS destination_state, d.paused_reason, d.consecutive_failures,
       d.last_error AS delivery_error,
       (SELECT count(*) FROM outbox o INDEXED BY outbox_subscription
        WHERE o.subscription_id = s.id AND o.state = 'pending') AS pending
FROM subscriptions s LEFT JOIN callback_destinations d ON d.destination = s.destination
WHERE s.id = :id

-- name: list_subscriptions
SELECT s.id, s.url, s.destination, s.topics, s.state, s.challenge, s.ttl, s.created_at,
       s.refreshed_at, s.expires_at, s.verify_at, s.verify_failures, s.verified_at,
       s.last_error, s.updated_at, s.secret_hint,
       d.state AS destination_state, d.paused_reason, d.consecutive_failures,
       d.last_error AS delivery_error,
       (SELECT count(*) FROM outbox o INDEXED BY outbox_subscription
        WHERE o.subscription_id = s.id AND o.state = 'pending') AS pending
FROM subscriptions s LEFT JOIN callback_destinations d ON d.destination = s.destination
WHERE :after IS NULL OR s.id > :after
ORDER BY s.id LIMIT :limit

-- name: refresh_subscription
UPDATE subscriptions SET ttl = :ttl, refreshed_at = :now, expires_at = :expires_at,
       updated_at = :now
WHERE id = :id

-- name: reverify_subscription
-- A suspended subscription refreshed is verified again before anything more is sent.
UPDATE subscriptions SET state = 'pending_verification', challenge = :challenge,
       verify_at = :now, verify_failures = 0, updated_at = :now
WHERE id = :id

-- name: delete_subscription
DELETE FROM subscriptions WHERE id = :id

-- name: delete_subscription_topics
DELETE FROM subscription_topics WHERE subscription_id = :id

-- name: drop_subscription_deliveries
-- What was still queued for a subscription that is gone: dead, with the reason.
UPDATE outbox INDEXED BY outbox_subscription SET state = 'dead', last_error = :error,
       lease_owner = NULL, next_attempt_at = NULL
WHERE subscription_id = :id AND state = 'pending'

-- name: delete_subscription_destination
DELETE FROM callback_destinations WHERE destination = :destination

-- name: due_verifications
SELECT id, url, secret, challenge, verify_failures FROM subscriptions INDEXED BY subscriptions_verify
WHERE state = 'pending_verification' AND verify_at <= :now AND expires_at > :now
ORDER BY verify_at LIMIT :limit

-- name: next_verification
SELECT verify_at FROM subscriptions INDEXED BY subscriptions_verify
WHERE state = 'pending_verification' AND expires_at > :now ORDER BY verify_at LIMIT 1

-- name: take_verification
-- Leases a verification attempt: another instance does not send it meanwhile.
UPDATE subscriptions SET verify_at = :lease_until
WHERE id = :id AND state = 'pending_verification' AND verify_at <= :now

-- name: subscription_verified
UPDATE subscriptions SET state = 'active', verified_at = :now, challenge = NULL,
       verify_at = NULL, verify_failures = 0, last_error = NULL, updated_at = :now
WHERE id = :id AND state = 'pending_verification' AND challenge = :challenge

-- name: verification_failed
UPDATE subscriptions SET verify_failures = verify_failures + 1, last_error = :error,
       verify_at = CASE WHEN verify_failures + 1 >= :limit THEN NULL ELSE :next_at END,
       state = CASE WHEN verify_failures + 1 >= :limit THEN 'suspended' ELSE state END,
       updated_at = :now
WHERE id = :id AND state = 'pending_verification' AND challenge = :challenge
RETURNING state

-- name: expired_subscriptions
SELECT id, destination FROM subscriptions INDEXED BY subscriptions_expiry
WHERE expires_at <= :before ORDER BY expires_at LIMIT :limit
