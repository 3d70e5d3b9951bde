-- The oldest waiting run in one index step. Without it the run counts read every
-- waiting run's row for its accepted_at: 500 ms with half a million waiting, on
-- every /healthz.
CREATE INDEX IF NOT EXISTS runs_waiting ON runs (accepted_at)
    WHERE status IN ('accepted', 'failed_retryable');
