-- adds column: outbox subscription_id TEXT
-- Subscriptions. agent_subscriptions: what an agent changed of the event types its
-- configuration routes to it (1 subscribed, 0 unsubscribed), written with the
-- success of the run that changed it. subscriptions: other programs' webhook
-- subscriptions (topics: event types, or run states as run.<state>); their
-- deliveries are outbox rows with outbox.subscription_id set (the column is added
-- by the engine when missing) and destination 'subscription:<id>'.
CREATE TABLE IF NOT EXISTS agent_subscriptions (
    event_type TEXT NOT NULL,
    agent      TEXT NOT NULL,
    subscribed INTEGER NOT NULL,
    run_id     TEXT NOT NULL,  -- the run whose success made the change
    changed_at REAL NOT NULL,
    PRIMARY KEY (event_type, agent)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (
    id              TEXT PRIMARY KEY,
    url             TEXT NOT NULL,
    destination     TEXT NOT NULL,  -- subscription:<id>: its deliveries' pause and failures
    topics          TEXT NOT NULL,  -- JSON array, sorted
    secret          TEXT NOT NULL,  -- the subscriber's whsec_ secret: never read by a view
    secret_hint     TEXT NOT NULL,  -- a fingerprint of it, what views show
    state           TEXT NOT NULL,  -- pending_verification, active, suspended
    challenge       TEXT,
    ttl             REAL NOT NULL,
    created_at      REAL NOT NULL,
    refreshed_at    REAL NOT NULL,
    expires_at      REAL NOT NULL,
    verify_at       REAL,  -- the next verification attempt, while pending_verification
    verify_failures INTEGER NOT NULL DEFAULT 0,
    verified_at     REAL,
    last_error      TEXT,  -- a category, never a body
    updated_at      REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS subscriptions_verify ON subscriptions (verify_at)
    WHERE state = 'pending_verification';
CREATE INDEX IF NOT EXISTS subscriptions_expiry ON subscriptions (expires_at);
CREATE TABLE IF NOT EXISTS subscription_topics (
    topic           TEXT NOT NULL,
    subscription_id TEXT NOT NULL,
    PRIMARY KEY (topic, subscription_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS outbox_subscription ON outbox (subscription_id, state)
    WHERE subscription_id IS NOT NULL;
