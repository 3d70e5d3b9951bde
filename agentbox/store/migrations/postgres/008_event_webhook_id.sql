-- The sender's own id of the request that brought an event (Standard Webhooks'
-- webhook-id, or Svix's svix-id), kept as it was sent: GET /runs/{run_id} shows it
-- as `webhook_id`, so a sender's log and agentbox's meet on it. NULL when the sender
-- sent none (agentbox's hex scheme) and for events agents emit.
ALTER TABLE events ADD COLUMN IF NOT EXISTS webhook_id TEXT;
