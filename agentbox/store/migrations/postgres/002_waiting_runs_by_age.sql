-- The oldest waiting run in one index step (the run counts read it on every /healthz).
CREATE INDEX IF NOT EXISTS runs_waiting ON runs (accepted_at) WHERE status IN ('accepted', 'failed_retryable');
