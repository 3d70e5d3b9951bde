-- Subscriptions. agent_subscriptions: what an agent changed of the event types its
-- configuration routes to it (1 subscribed, 0 unsubscribed), written with the
-- success of the run that changed it. subscriptions: other programs' webhook
-- subscriptions (topics: event types, or run states as run.<state>); their
-- deliveries are outbox rows with outbox.subscription_id set and destination
-- 'subscription:<id>'.
CREATE TABLE IF NOT EXISTS agent_subscriptions (
    event_type TEXT COLLATE "C" NOT NULL,
    agent      TEXT COLLATE "C" NOT NULL,
    subscribed INTEGER NOT NULL,
    run_id     TEXT NOT NULL,
    changed_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (event_type, agent)
);
CREATE TABLE IF NOT EXISTS subscriptions (
    id              TEXT COLLATE "C" PRIMARY KEY,
    url             TEXT NOT NULL,
    destination     TEXT NOT NULL,
    topics          TEXT NOT NULL,
    secret          TEXT NOT NULL,
    secret_hint     TEXT NOT NULL,
    state           TEXT NOT NULL,
    challenge       TEXT,
    ttl             DOUBLE PRECISION NOT NULL,
    created_at      DOUBLE PRECISION NOT NULL,
    refreshed_at    DOUBLE PRECISION NOT NULL,
    expires_at      DOUBLE PRECISION NOT NULL,
    verify_at       DOUBLE PRECISION,
    verify_failures INTEGER NOT NULL DEFAULT 0,
    verified_at     DOUBLE PRECISION,
    last_error      TEXT,
    updated_at      DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS subscriptions_verify ON subscriptions (verify_at)
    WHERE state = 'pending_verification';
CREATE INDEX IF NOT EXISTS subscriptions_expiry ON subscriptions (expires_at);
CREATE TABLE IF NOT EXISTS subscription_topics (
    topic           TEXT COLLATE "C" NOT NULL,
    subscription_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (topic, subscription_id)
);
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS subscription_id TEXT;
CREATE INDEX IF NOT EXISTS outbox_subscription ON outbox (subscription_id, state)
    WHERE subscription_id IS NOT NULL;
