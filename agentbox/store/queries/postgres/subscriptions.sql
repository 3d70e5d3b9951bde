-- The PostgreSQL engine's statements for subscriptions (store/subscriptions.py).
-- Named statements, loaded by agentbox.store.queries; queries/sqlite/subscriptions.sql holds
-- the same names in SQLite's words.

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

-- name: lock_destinations
-- Subscribers' destinations, in one order (a subscriber's delivery queued while its
-- destination is paused or resumed waits for that).
SELECT state FROM callback_destinations WHERE destination = ANY(%(destinations)s)
ORDER BY destination FOR SHARE

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

-- name: lock_subscriptions
-- Instances creating subscriptions at once count them one after another (the
-- count below is read after this lock, in a snapshot of its own).
SELECT pg_advisory_xact_lock(7022813651217596275)

-- name: count_subscriptions
-- The subscriptions that count against the limit: those not expired.
SELECT count(*) FROM subscriptions WHERE expires_at > %(now)s

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
WHERE %(after)s::text IS NULL OR s.id > %(after)s
ORDER BY s.id LIMIT %(limit)s

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
